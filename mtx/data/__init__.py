"""Data: from a recipe's corpora to the memory-mapped token splits the trainer reads.

Its modules:

    corpora    where sentence pairs come from: Hugging Face datasets, plain-text or TSV files, the demo
    demo/      the built-in generated English→German corpus, with gold word alignments
    prepare    `mtx prepare`'s pipeline: clean and filter each corpus, learn the joint BPE, encode, write data/
    cleaning   the filters of crawled corpora prepare runs on each pair: copies, mismatched numbers, languages, ...
    vocabulary the BPE prepare encodes with: learnt on the corpora, or borrowed (data.bpe.from)
    manifest   what data/manifest.json records (per corpus), and whether a data/ folder is up to date
    prepared   a prepared data/ folder read back: its manifest and token splits, checked against each other
    lexicon    the lexical translation table of the training pairs (IBM Model 1), which shortlists are made of
    batching   token-budget batches of similar length, for training and for decoding
    bpe_dropout  training sentences segmented anew each epoch (BPE-dropout), in worker processes
    command    `mtx prepare`
"""
