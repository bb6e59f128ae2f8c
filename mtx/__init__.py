"""mtx: the Transformer of "Attention Is All You Need", as a command-line translation toolkit.

The folder tree is the pipeline: one package per stage, in the order a run goes through them, each package's
docstring the map of its modules. A lower stage never imports a higher one (tests/unit/test_layout.py).

    errors       user errors (MtxError): a message and exit 1, never a traceback
    files        atomic writes: a file is complete or absent
    lock_file    one writer at a time: a lock file with a heartbeat, across a cluster's machines
    devices      one decision of device and precision for training and translation
    subword      what every vocabulary shares: the special ids, normalised text, the words of pieces
    tokenizer    the joint subword vocabulary in its styles
    spm_tokenizer  an imported MarianMT model's pair of SentencePiece models and its vocabulary
    checkpoint   the checkpoint file format: written atomically, read with clear errors, averaged
    config/      recipes: YAML in, validated dataclasses out
    data/        from a recipe's corpora to memory-mapped token splits (`mtx prepare`)
    model/       the paper's Transformer
    train/       the training loop from one CPU to many GPUs (`mtx train`, `mtx average`)
    decode/      search and translation (`mtx translate`)
    documents/   paragraphs cut into sentences and markup carried over, around decoding (`--split-sentences`,
                 `--markup`)
    score/       sacreBLEU and the paper's BLEU (`mtx score`)
    analysis/    attention and alignments (`mtx inspect`)
    export/      Hugging Face and CTranslate2 folders (`mtx export`)
    importing/   a published MarianMT (OPUS-MT) model as an mtx checkpoint (`mtx import`)
    report/      reports of runs (`mtx report`)
    serve/       translation over HTTP (`mtx serve`)
    cli          the `mtx` command line: Typer wired to each stage's command
"""

__version__ = "0.1.0"
