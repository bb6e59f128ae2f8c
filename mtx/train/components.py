"""The parts of a training run, built from its recipe and prepared data: what `Trainer` is handed.

`build_run` makes them in the order the run depends on — the log first (TensorBoard is checked before any
work), the data checked against the recipe and batched, the model seeded and built, its precision and
optimizer, the validator, the checkpoint keeper — and returns them as one `RunParts`. The trainer builds
nothing; it resumes into these parts and trains them.

What a run takes from outside it — the clock, the loss, a wrapper around each update, the valid BLEU — comes
in as `Hooks`. Their defaults are what `mtx train` runs with; a test passes its own (a clock where an update
takes ten seconds, a scripted BLEU) rather than patching the trainer.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from mtx.config.recipe import ModelConfig, Recipe
from mtx.data.batching import Batch, BatchPlan, update_shape
from mtx.data.bpe_dropout import GROWTH_SAMPLE, BpeDropout, SegmentingWorkers, growth
from mtx.data.lexicon import Lexicon
from mtx.data.prepared import TokenSplit, load_manifest, load_split
from mtx.decode.doubts import training_statistics
from mtx.devices import allow_tf32, available_memory, choose_dtype
from mtx.errors import MtxError
from mtx.model.transformer import Transformer, count_parameters_for
from mtx.tokenizer import Tokenizer
from mtx.train import distributed
from mtx.train.checkpoints import CheckpointKeeper
from mtx.train.ema import WeightAverage
from mtx.train.loss import batch_loss
from mtx.train.metrics_log import MetricsLog
from mtx.train.run_data import check_data_matches_recipe, load_valid_set, training_batches
from mtx.train.state import TrainState
from mtx.train.stopping import Budgets, StopSignals
from mtx.train.validation import Validator, ValidBleu

LossFunction = Callable[..., tuple[Tensor, Tensor, Tensor]]  # mtx.train.loss.batch_loss's signature
UpdateHook = Callable[[TrainState, list[Batch], Callable[[], bool]], bool]  # (state, batches, the update) -> stepped


def run_update(state: TrainState, batches: list[Batch], update: Callable[[], bool]) -> bool:
    """The update hook of `mtx train`: the update, run as it is."""
    return update()


@dataclass(frozen=True)
class Hooks:
    """Where a run meets what is outside it. `clock` gives the seconds that train.max_time, save_every_minutes
    and tokens_per_s count; `loss` is the criterion of training and validation; `around_update` runs each
    optimizer update (it is handed the state before it, its batches and the update, and returns what the update
    returned),
    so that a test observes, fails or times an update; `valid_bleu`, if set, stands for decoding the valid set
    (it returns BLEU and the length ratio)."""

    clock: Callable[[], float] = time.monotonic
    loss: LossFunction = batch_loss
    around_update: UpdateHook = run_update
    valid_bleu: ValidBleu | None = None


@dataclass(frozen=True)
class Precision:
    """train.precision as the updates use it: the autocast dtype (None: float32, no autocast) and the grad
    scaler, enabled under fp16 alone."""

    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler
    device_type: str

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


@dataclass
class RunParts:
    """Everything a run trains with; `recipe` is this session's (train.update_tokens resolved)."""

    recipe: Recipe
    ctx: distributed.Context
    hooks: Hooks
    log: MetricsLog
    tokenizer: Tokenizer
    train_split: TokenSplit
    plan: BatchPlan
    bpe_dropout: BpeDropout | None
    segmenting: SegmentingWorkers | None  # train.bpe_dropout_workers' processes, if any
    model: Transformer
    precision: Precision
    optimizer: torch.optim.Optimizer
    ema: WeightAverage | None
    signals: StopSignals
    budgets: Budgets
    validator: Validator | None  # None: the prepared data has no valid split
    keeper: CheckpointKeeper


def build_run(recipe: Recipe, ctx: distributed.Context, hooks: Hooks | None = None) -> RunParts:
    """The parts of `recipe`'s run on this process, its prepared data checked and batched, its model built."""
    hooks = hooks or Hooks()
    recipe = for_this_session(recipe, ctx.world)
    cfg = recipe.train
    distributed.check_shared_directory(recipe.run_path)
    log = MetricsLog(recipe.run_path / "metrics.jsonl", ctx, cfg.tensorboard, clock=hooks.clock)
    if cfg.update_tokens is not None:
        log.say(f"train.update_tokens {cfg.update_tokens:,} on {ctx.world} process{'es' if ctx.world > 1 else ''}: "
                f"micro-batches of up to {cfg.max_tokens:,} tokens, update_freq {cfg.update_freq}.")
    data_dir = recipe.run_path / "data"
    manifest = load_manifest(data_dir)
    check_data_matches_recipe(recipe, manifest, data_dir)
    tokenizer = Tokenizer.from_file(data_dir / "tokenizer.json")
    train_split = load_split(data_dir, "train")
    batches = training_batches(recipe, manifest, train_split, say=log.say)
    plan = BatchPlan(batches, recipe.seed, cfg.update_freq, ctx.world, ctx.rank)
    bpe_dropout = _bpe_dropout(recipe, tokenizer, train_split, log.say)
    segmenting = (None if bpe_dropout is None or cfg.bpe_dropout_workers == 0 else
                  SegmentingWorkers(cfg.bpe_dropout_workers, data_dir, bpe_dropout, recipe.model.max_positions))
    valid = load_valid_set(recipe, manifest, data_dir)

    check_model_fits_memory(recipe.model, tokenizer.vocab_size, ctx.device)
    torch.manual_seed(recipe.seed)
    model = Transformer(recipe.model, tokenizer.vocab_size).to(ctx.device)
    precision = _precision(recipe, ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, betas=tuple(cfg.betas), eps=cfg.eps,
                                  weight_decay=cfg.weight_decay, fused=ctx.device.type == "cuda")
    ema = None if cfg.ema_decay is None else WeightAverage(model, cfg.ema_decay)
    signals, budgets = StopSignals(), Budgets(cfg)
    validator = None if valid is None else Validator(valid, recipe, ctx, model, tokenizer, signals.requested,
                                                     precision.autocast, hooks.loss, hooks.valid_bleu)
    # what the data says of its pairs goes into checkpoints, which rank 0 alone writes
    data_stats = training_statistics(train_split.src_lens, train_split.tgt_lens,
                                     lambda i: (train_split.src(i), train_split.tgt(i))) if ctx.is_main else None
    lexicon = Lexicon.load(data_dir) if ctx.is_main else None
    keeper = CheckpointKeeper(recipe, ctx, model, tokenizer, optimizer, precision.scaler, say=log.say, ema=ema,
                              data_stats=data_stats, lexicon=lexicon, clock=hooks.clock)
    return RunParts(recipe, ctx, hooks, log, tokenizer, train_split, plan, bpe_dropout, segmenting, model, precision,
                    optimizer, ema, signals, budgets, validator, keeper)


def for_this_session(recipe: Recipe, world: int) -> Recipe:
    """The recipe with train.update_tokens turned into this session's max_tokens and update_freq for `world`
    processes (mtx.data.batching.update_shape); as it is without it."""
    cfg = recipe.train
    if cfg.update_tokens is None:
        return recipe
    max_tokens, update_freq = update_shape(cfg.update_tokens, cfg.max_tokens, world)
    return dataclasses.replace(recipe, train=dataclasses.replace(cfg, max_tokens=max_tokens, update_freq=update_freq))


def _bpe_dropout(recipe: Recipe, tokenizer: Tokenizer, split: TokenSplit, say: Callable[[str], None]
                 ) -> BpeDropout | None:
    """train.bpe_dropout's segmenter, once it has said how much longer it makes the training sentences."""
    cfg = recipe.train
    if cfg.bpe_dropout == 0:
        return None
    dropout = BpeDropout(tokenizer, cfg.bpe_dropout, recipe.seed)
    workers = cfg.bpe_dropout_workers
    by = f" by {workers} worker process{'es' if workers > 1 else ''}" if workers else ""
    say(f"BPE-dropout {cfg.bpe_dropout}: training sentences are segmented anew each epoch{by}, "
        f"{growth(split, dropout):.2f}× as many tokens on a sample of {GROWTH_SAMPLE:,} pairs; "
        "batches are cut by the stored segmentation, so they hold that many more tokens than "
        "train.max_tokens.")
    return dropout


def _precision(recipe: Recipe, ctx: distributed.Context) -> Precision:
    """train.precision on this device; a float32 run allows TF32 matmuls (on a GPU that has them)."""
    dtype = choose_dtype(recipe.train.precision, ctx.device, "train.precision")
    if dtype == torch.float32:
        allow_tf32(ctx.device)
    autocast_dtype = None if dtype == torch.float32 else dtype
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=autocast_dtype == torch.float16)
    return Precision(autocast_dtype, scaler, ctx.device.type)


def check_model_fits_memory(model: ModelConfig, vocab_size: int, device: torch.device) -> None:
    """Refuse a model whose weights, gradients and Adam moments (float32 each) alone overflow the device's
    memory, before allocating them: a typo in d_model gets a message, not a crash."""
    params = count_parameters_for(model, vocab_size)
    needed, available = 16 * params, available_memory(device)
    if needed > available:
        where = "GPU memory" if device.type == "cuda" else "memory"
        raise MtxError(f"The model has {params:,} parameters: with their gradients and Adam's two moments they "
                       f"need {needed / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB of {where} "
                       "available. Check the model section of the recipe (d_model, d_ff, layers).")


def for_training(model: Transformer, compile: bool, ctx: distributed.Context) -> torch.nn.Module:
    """The model as the updates run it: compiled if asked, inside DDP when there are several ranks. Built
    once the run has resumed, as DDP copies rank 0's weights to every rank when it wraps the model.

    Batch shapes change with every update; dynamic shapes compile once for all of them (rather than once per
    shape), and DDP around the compiled model still overlaps its all-reduce with the backward.
    """
    forward_model: torch.nn.Module = torch.compile(model, dynamic=True) if compile else model
    if ctx.distributed:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        forward_model = DistributedDataParallel(forward_model, device_ids=device_ids, **_NO_BUFFER_SYNC)
    return forward_model


# The one buffer, the positional table, is the same on every rank: DDP need not broadcast it before every
# forward. PyTorch 2.13 renamed the switch (and deprecated the old name); earlier releases know only the old one.
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})
