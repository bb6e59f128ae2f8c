"""The `mtx` command line. Each command reads its arguments and calls one library function.

Heavy imports (torch, datasets) happen inside the commands that need them, so `mtx --help` and `mtx score`
start at once. A user error (MtxError) becomes a one-paragraph message on standard error and exit code 1;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx import __version__
from mtx.errors import MtxError, is_out_of_memory

app = typer.Typer(
    name="mtx",
    help="Machine translation with the Transformer of 'Attention Is All You Need'.\n\n"
    "Example: mtx prepare recipes/demo.yaml && mtx train recipes/demo.yaml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_state = {"debug": False}

RecipeArg = Annotated[
    Path, typer.Argument(help="A YAML recipe, e.g. recipes/demo.yaml.", metavar="RECIPE.yaml", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key by its dotted path, e.g. --set train.max_steps=200."),
]


def _version(value: bool) -> None:
    if value:
        print(f"mtx {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _state["debug"] = debug


def fail(message: str) -> None:
    """Print a user error and exit 1.

    The message is printed verbatim, never read as rich markup or emoji codes: it quotes file names and
    values, and a path like `runs/[old]/ref.de` must be shown as it is, not lose `[old]` or raise a MarkupError.
    """
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, highlight=False, soft_wrap=True).print(Text.assemble(("error:", "bold red"), " ", message))
    raise typer.Exit(1)


@app.command()
def config(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Print the fully resolved recipe (presets expanded) and the model's parameter count.

    Example: mtx config recipes/wmt14_en_de_base.yaml --set model.preset=big
    """
    from mtx.config.recipe import dump_recipe, load_recipe
    from mtx.model.transformer import count_parameters_for

    resolved = load_recipe(recipe, set_)
    sys.stdout.write(dump_recipe(resolved))
    params = count_parameters_for(resolved.model, resolved.data.bpe.vocab_size)
    sys.stdout.write(f"# params: {params:,} (vocabulary {resolved.data.bpe.vocab_size:,})\n")


@app.command()
def prepare(
    recipe: RecipeArg,
    set_: SetOpt = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes for cleaning and encoding [default: all cores].")
    ] = None,
) -> None:
    """Clean the recipe's corpus, learn the joint BPE and write the memory-mapped splits to the run's data/.

    Re-running with an unchanged data section and input files does nothing.

    Example: mtx prepare recipes/demo.yaml --workers 4
    """
    from mtx.config.recipe import load_recipe
    from mtx.data.prepare import prepare as prepare_data

    prepare_data(load_recipe(recipe, set_), workers=workers)


@app.command()
def train(
    recipe: RecipeArg,
    set_: SetOpt = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Delete the run's checkpoints and metrics and train from scratch.")
    ] = False,
) -> None:
    """Train on the run's prepared data/, writing checkpoints/ and metrics.jsonl; resumes if it has checkpoints.

    On a budget (max_steps, max_epochs, max_time), early stopping or SIGTERM/SIGINT it saves a checkpoint and
    exits 0; the same command resumes. Several GPUs or nodes: torchrun --nproc-per-node 8 -m mtx train RECIPE.yaml

    Example: mtx train recipes/demo.yaml --set train.max_steps=2000
    """
    from mtx.config.recipe import load_recipe
    from mtx.train.trainer import train as run_training

    run_training(load_recipe(recipe, set_), restart=restart)


@app.command()
def average(
    output: Annotated[Path, typer.Option("-o", "--output", help="The averaged checkpoint to write.")],
    checkpoints: Annotated[
        list[Path] | None, typer.Argument(help="Checkpoints to average.", metavar="CKPT...", show_default=False)
    ] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="A run's checkpoints/ folder; use with --last.")
    ] = None,
    last: Annotated[int | None, typer.Option("--last", min=1, help="Average the last N step_<N>.pt by step.")] = None,
) -> None:
    """Average checkpoints parameter-wise into one self-contained checkpoint for translation.

    The paper averages the last 5 checkpoints of base models and the last 20 of big ones.

    Example: mtx average --dir runs/demo/checkpoints --last 5 -o runs/demo/average.pt
    """
    from mtx.checkpoint import average_checkpoints, save_checkpoint, step_checkpoints

    if bool(checkpoints) == (directory is not None):
        raise MtxError("Name the checkpoints to average one way: as files (mtx average a.pt b.pt -o avg.pt) "
                       "or as --dir RUN/checkpoints --last N.")
    if directory is not None:
        if last is None:
            raise MtxError("--dir needs --last N: how many of the latest step checkpoints to average.")
        found = step_checkpoints(directory)
        if not found:
            raise MtxError(f"No step_<N>.pt checkpoints in {directory}: train first with `mtx train RECIPE`.")
        if len(found) < last:
            raise MtxError(f"--last {last} asks for more checkpoints than the {len(found)} in {directory}.")
        checkpoints = [path for _, path in found[-last:]]
    elif last is not None:
        raise MtxError("--last only applies with --dir.")
    save_checkpoint(average_checkpoints(checkpoints), output)
    sys.stderr.write(f"averaged {len(checkpoints)} checkpoints → {output}\n")


@app.command()
def export(
    model: Annotated[Path, typer.Option("-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average).")],
    output: Annotated[Path, typer.Argument(help="The folder to write.", metavar="OUT/", show_default=False)],
    to: Annotated[str, typer.Option("--to", metavar="hf|ctranslate2", help="hf: a Hugging Face transformers "
                                    "MarianMT folder; ctranslate2: a CTranslate2 model directory.")],
    quantization: Annotated[str | None, typer.Option(
        metavar="int8|int8_float16|float16|bfloat16", help="CTranslate2 weights' type [default: float32].")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT/ if it exists and is not empty.")] = False,
) -> None:
    """Export a checkpoint for serving with Hugging Face transformers or CTranslate2 (needs mtx[export]).

    OUT/ holds the model, mtx's tokenizer (normalising text and ending sources with </s> as mtx does) and a
    README.md model card: the code that translates with it, the recipe, the data counts and the best
    validation BLEU. An hf folder loads with AutoModelForSeq2SeqLM and AutoTokenizer, and its
    generation_config.json holds the recipe's beam and length penalty. Pre-norm models export to ctranslate2
    only: MarianMT has no pre-norm layers.

    Example: mtx export -m runs/demo/average.pt --to ctranslate2 demo-ct2/ --quantization int8
    """
    from mtx.export import export_checkpoint

    export_checkpoint(model, to, output, quantization=quantization, force=force)
    sys.stderr.write(f"exported {model} → {output} ({to}{f', {quantization}' if quantization else ''})\n")


@app.command()
def score(
    references: Annotated[
        list[Path],
        typer.Option("-r", "--ref", metavar="REF", help="A reference file, one line per sentence; repeat for more."),
    ],
    input_: Annotated[
        Path | None,
        typer.Option("-i", "--input", metavar="HYP", help="Hypotheses, one line per sentence [default: stdin]."),
    ] = None,
    metrics: Annotated[
        str, typer.Option("--metrics", metavar="LIST", help="Comma-separated: bleu, chrf, ter.")
    ] = "bleu",
    tokenize: Annotated[
        str, typer.Option("--tokenize", metavar="13a|intl|zh|none", help="The BLEU tokenizer.")
    ] = "13a",
    paper_bleu: Annotated[
        bool, typer.Option("--paper-bleu", help="Also the paper's tokenized En-De BLEU (Moses + ##AT##).")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    min_bleu: Annotated[
        float | None,
        typer.Option("--min-bleu", metavar="X", help="Exit 1 if BLEU (the paper's, with --paper-bleu) is below X."),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", metavar="OTHER_HYP", help="Another system's output: paired bootstrap p-values."),
    ] = None,
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF, TER), each score with its signature.

    Example: mtx translate -m avg.pt -i newstest2014.en | mtx score -r newstest2014.de --paper-bleu --min-bleu 25
    """
    import json

    from mtx.score.metrics import check_min_bleu, print_table, score_files

    result = score_files(references, input_, metrics.split(","), tokenize, paper_bleu, baseline)
    if json_:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print_table(result)
    if min_bleu is not None:
        check_min_bleu(result, min_bleu)


@app.command()
def translate(
    model: Annotated[list[Path], typer.Option(
        "-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average). Given several times: an "
        "ensemble, which averages the models' next-token probabilities at every step; the models must share a "
        "tokenizer, and the first one's recipe sets the defaults and aligns.")],
    input_: Annotated[
        Path | None, typer.Option("-i", "--input", metavar="IN", help="Sentences, one per line [default: stdin].")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", metavar="OUT", help="Translations [default: stdout].")
    ] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy search. [default: the recipe's, 4]")] = None,
    lenpen: Annotated[
        float | None,
        typer.Option(help="Length penalty α: score = log P(Y|X) / lp(|Y|), |Y| counting EOS. [default: recipe's, 0.6]"),
    ] = None,
    lenpen_style: Annotated[
        str | None,
        typer.Option(metavar="gnmt|fairseq", help="lp(|Y|) = ((5 + |Y|) / 6)^α (GNMT, the paper's) or |Y|^α. "
                     "[default: recipe's, gnmt]"),
    ] = None,
    max_len_a: Annotated[
        float | None, typer.Option(help="Output ≤ a · source tokens + b (EOS not counted). [default: recipe's, 1.0]")
    ] = None,
    max_len_b: Annotated[int | None, typer.Option(help="See --max-len-a. [default: recipe's, 50]")] = None,
    min_len: Annotated[int | None, typer.Option(help="Output at least N tokens. [default: recipe's, 0]")] = None,
    nbest: Annotated[
        int | None, typer.Option(help="Print the N best, each line 'score<TAB>text' pairs joined by tabs (N > 1). "
                                 "[default: recipe's, 1]")
    ] = None,
    batch_tokens: Annotated[
        int, typer.Option(help="Batch size: sentences × max(source length, output limit), EOS included.")
    ] = 4096,
    device: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto: cuda if there is one.")] = "auto",
    dtype: Annotated[
        str,
        typer.Option(metavar="auto|fp32|bf16|fp16|int8", help="auto: fp32 on CPU, bf16 (else fp16) on GPU; "
                     "int8: dynamically quantized linear layers, CPU only."),
    ] = "auto",
    threads: Annotated[int | None, typer.Option(
        help="CPU threads [default: PyTorch's, one per core]. On a CPU, up to this many batches are decoded "
             "side by side on one thread each.")] = None,
    errors: Annotated[
        str, typer.Option(metavar="strict|replace", help="Invalid UTF-8 input: stop with the line number, or U+FFFD.")
    ] = "strict",
    alignment: Annotated[bool, typer.Option(
        "--alignment", help="Follow each translation with ' ||| ' and its word alignment in Pharaoh format: "
        "'source-target' word indices, 0-based, one link per target word (Moses' and Marian's convention). An "
        "empty input line gives ' ||| ' (with --nbest > 1: an empty line).")] = False,
    alignment_layer: Annotated[int | None, typer.Option(
        metavar="N", help="With --alignment: the decoder layer (0-based) whose cross-attention, heads averaged, "
        "aligns. [default: the last layer of a decoder of one or two layers, else the penultimate]")] = None,
    format_: Annotated[str, typer.Option(
        "--format", metavar="text|jsonl", help="jsonl: one JSON object per input line instead of a text line: "
        "text, score, tokens (the subwords, then </s>), token_log_probs (one per token), with --alignment "
        "alignment ([source, target] pairs), with --nbest > 1 nbest (a list of such objects).")] = "text",
) -> None:
    """Translate one sentence per line with beam search, keeping line count and order.

    Scores are log P(Y|X) / lp(|Y|) with GNMT's length penalty lp = ((5 + |Y|) / 6)^α (α = --lenpen), or
    fairseq's |Y|^α with --lenpen-style fairseq. Flags left unset take the checkpoint's recipe (decode:).
    Sources longer than the model's max_positions are truncated, with a warning that counts them.
    --alignment aligns words after the search, with one more pass of the translations through the decoder.
    Several -m decode as an ensemble (e.g. models trained with different seeds), at the cost of running each.

    Example: mtx translate -m runs/demo/average.pt -i newstest2014.en -o out.de --beam 4 --lenpen 0.6
    """
    from mtx.decode.command import translate_file

    chosen = dict(beam=beam, lenpen=lenpen, lenpen_style=lenpen_style, max_len_a=max_len_a, max_len_b=max_len_b,
                  min_len=min_len, nbest=nbest)
    options = {k: v for k, v in chosen.items() if v is not None}
    translate_file(model, input_, output, options=options, batch_tokens=batch_tokens, device=device, dtype=dtype,
                   threads=threads, errors=errors, log=sys.stderr.write, alignment=alignment,
                   alignment_layer=alignment_layer, output_format=format_)


@app.command()
def inspect(
    model: Annotated[Path, typer.Option("-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average).")],
    sentence: Annotated[str, typer.Argument(help="The sentence to translate and inspect.", metavar="SENTENCE",
                                            show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PAGE.html", help="Write one self-contained HTML page with every kind, layer and "
        "head (a picker, the heatmap, the statistics), instead of printing the heatmaps.")] = None,
    kind: Annotated[str, typer.Option(
        metavar="encoder|decoder|cross|all", help="Which attention to print: encoder or decoder self-attention, "
        "or the decoder's cross-attention over the source.")] = "all",
    layer: Annotated[int | None, typer.Option(metavar="N", help="Print only layer N (0-based). [default: all]")] = None,
    head: Annotated[str, typer.Option(
        metavar="all|mean|N", help="all: every head, then their average; mean: the average alone; N: head N.")] = "all",
    target: Annotated[str | None, typer.Option(
        metavar="TEXT", help="Inspect this translation instead of the model's (to see why it was not chosen).")] = None,
    json_: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object instead: the sentence, its translation, the token labels and the "
        "statistics of the selected heads.")] = False,
) -> None:
    """Translate one sentence and show every layer's and head's attention, with per-head statistics.

    The sentence is translated with the checkpoint's recipe settings (decode:), on the CPU, and every layer's
    and head's weights are kept: encoder self-attention (rows and columns: source tokens), decoder
    self-attention (rows: the token each step predicts, </s> last; columns: the tokens read so far, <s> first)
    and cross-attention (rows: as the decoder's; columns: source tokens). Each heatmap cell is a weight in
    percent; a map wider than the terminal is cut into blocks of columns. Tokens that continue a word are
    shown after '·'. Statistics per head: entropy in bits, and the shares of attention on the previous
    position, the same position, the sentence boundary (</s> of the source, <s> of the target) and
    punctuation, averaged over the rows.

    Example: mtx inspect -m runs/demo/average.pt "The old friends tidy up his kitchen." --kind cross --head mean

    Example: mtx inspect -m runs/demo/average.pt "The old friends tidy up his kitchen." -o attention.html
    """
    from rich.console import Console

    from mtx.analysis.command import inspect_checkpoint

    inspect_checkpoint(model, sentence, target=target, kind=kind, layer=layer, head=head, output=output,
                       as_json=json_, console=Console(highlight=False))


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (runs/<name>), one or more to compare.",
                                               metavar="RUN_DIR", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="REPORT.html", help="Write one self-contained HTML page (needs mtx[report]) "
        "instead of printing the summary.")] = None,
    bleu_milestones: Annotated[str | None, typer.Option(
        "--bleu-milestones", metavar="LIST", help="Comma-separated BLEU levels to give the time to, e.g. 20,25,27. "
        "[default: the levels of the runs' train.bleu_milestones]")] = None,
) -> None:
    """Show how training runs went: learning curves, time to BLEU, data counts, model size, recipes, score cards.

    In the terminal: a summary per run (steps, training time, best valid BLEU, final losses, tokens/s,
    parameters), sparklines of valid BLEU and train loss, and when BLEU reached each level. With -o: one
    HTML page that needs no network, with the train and valid loss, valid BLEU and learning rate against
    steps and training time (several runs overlaid), the data manifest's counts and each filter's drops, the
    recipe keys that differ between the runs, and the score cards of any score*.json in the run folders.

    Example: mtx report runs/demo -o runs/demo/report.html

    Example: mtx report runs/base runs/big --bleu-milestones 25,27
    """
    from rich.console import Console

    from mtx.report import parse_levels, report_runs

    levels = None if bleu_milestones is None else parse_levels(bleu_milestones)
    report_runs(runs, output, levels, Console(highlight=False))


def main() -> None:
    """Entry point: Typer handles usage errors (exit 2); an MtxError, or running out of memory, becomes a
    clean message and exit 1."""
    try:
        app()
    except Exception as e:
        if _state["debug"] or not (isinstance(e, MtxError) or is_out_of_memory(e)):
            raise
        message = str(e) if isinstance(e, MtxError) else (
            f"Out of memory ({str(e).splitlines()[0][:160]}): ask for less at once — train.max_tokens for "
            "training, --batch-tokens or --beam for translation.")
        try:
            fail(message)
        except typer.Exit as exit_:
            sys.exit(exit_.exit_code)
