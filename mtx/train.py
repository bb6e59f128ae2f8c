"""`mtx train`: the paper's training setup (§5) in one loop, from one CPU to many GPUs.

One update: this rank's micro-batches (mtx.batching) run forward and backward under autocast, DDP's
gradient all-reduce held back (`no_sync`) until the last one; the summed label-smoothed loss is divided by the
target tokens of the whole update on all ranks, so 1 GPU × update_freq 8 computes the gradient of 8 GPUs ×
update_freq 1. Then unscale (fp16), clip, Adam step at the scheduled learning rate. An fp16 update that the
grad scaler skips (inf/NaN gradients) is not an update: the step and the schedule wait for the next one.

Everything a resumed run needs is the model, the optimizer, the grad scaler and `TrainState` — the step, the
position inside the epoch, the best score, the clock. The batch order is a pure function of (seed, epoch) and
dropout is reseeded at every update from (seed, step, rank), so no RNG state has to be carried over: a run
stopped and resumed draws the very same batches and dropout masks as a run that never stopped.

The loop checks its budgets (max_steps, max_epochs, max_time, patience) and the stop signals between updates,
the ranks agreeing through the same all-reduce (on the host) that sums the update's token count; a signal also
cuts a validation short. On stopping it writes the checkpoint of that step first and returns, and running the
same command again resumes. While the GPU computes an update, a background thread collates the next.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from mtx import distributed
from mtx.batching import Batch, BatchPlan, PairSource, collate, in_background, make_batches, pair_costs
from mtx.checkpoint import (
    load_checkpoint,
    make_checkpoint,
    model_config_of,
    save_checkpoint,
    step_checkpoints,
)
from mtx.config import Recipe, TrainConfig, parse_duration
from mtx.data import load_manifest, load_split
from mtx.devices import available_memory, choose_dtype
from mtx.errors import MtxError, is_out_of_memory
from mtx.files import atomic_write
from mtx.loss import batch_loss
from mtx.model import Transformer, count_parameters_for
from mtx.runlock import RunLock
from mtx.tokenizer import Tokenizer

SHAPE_KEYS = ("layers_enc", "layers_dec", "d_model", "heads", "d_ff", "norm", "share_embeddings", "max_positions")
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP")  # SIGUSR1: SLURM's --signal=USR1@T warning, via torchrun
MIN_LOSS_SCALE = 1e-4  # fp16: a grad scaler halved this far finds inf/NaN gradients at any scale (fairseq's limit)
VALID_CHUNK = 200  # valid sentences decoded between two looks at the stop signals


@dataclass
class TrainState:
    """The trainer's progress, as Python primitives (checkpoints load with weights_only=True)."""

    step: int = 0  # optimizer updates done
    epoch: int = 1  # the epoch in progress, from 1
    update_in_epoch: int = 0  # updates of `epoch` done: where a resumed run continues
    train_seconds: float = 0.0  # summed over all sessions of the run; what train.max_time budgets
    best_bleu: float | None = None
    bad_validations: int = 0  # validations since best_bleu last improved
    skipped_steps: int = 0  # fp16 updates dropped by the grad scaler for inf/NaN gradients (not in `step`)
    window_loss: float = 0.0  # loss, nll and target tokens summed since the last train log line, so a
    window_nll: float = 0.0  # resumed run logs the same averages as one that never stopped
    window_tokens: float = 0.0


def learning_rate(cfg: TrainConfig, d_model: int, step: int) -> float:
    """The rate of update number `step` (from 1).

    noam (the paper): lr · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), lr a scale factor (paper: 1).
    inverse_sqrt (fairseq): linear warmup from 0 to lr, then lr · sqrt(warmup / step).
    """
    if cfg.lr_schedule == "noam":
        return cfg.lr * d_model**-0.5 * min(step**-0.5, step * cfg.warmup**-1.5)
    if step < cfg.warmup:
        return cfg.lr * step / cfg.warmup
    return cfg.lr * math.sqrt(max(cfg.warmup, 1) / step)


def dropout_seed(seed: int, step: int, rank: int) -> int:
    """A seed per (run seed, update, rank): dropout masks differ across ranks and repeat after a resume."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % 2**63


class StopSignals:
    """SIGTERM, SIGINT, SIGUSR1 or SIGHUP (a pre-emption, SLURM's advance warning, Ctrl-C, a closed terminal)
    asks the loop to stop after the current update, or in the middle of a validation, and save.

    Under torchrun the signal reaches the launcher, which forwards it to every worker and kills them after
    its --shutdown-timeout: the stop must fit in that window. SIGUSR1 and SIGHUP would otherwise kill the
    process outright. A second SIGINT aborts at once. Handlers can only be set in the main thread; elsewhere
    this does nothing.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        try:
            for name in STOP_SIGNALS:
                signum = getattr(signal, name)
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Trainer:
    """Builds the run from the recipe and its prepared data, resumes it if it has checkpoints, and trains."""

    def __init__(self, recipe: Recipe, ctx: distributed.Context, restart: bool = False) -> None:
        self.recipe, self.cfg, self.ctx = recipe, recipe.train, ctx
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.data_dir = recipe.run_path / "data"
        self.checkpoint_dir = recipe.run_path / "checkpoints"
        self.metrics_path = recipe.run_path / "metrics.jsonl"
        manifest = load_manifest(self.data_dir)
        self._check_data_matches_recipe(manifest)
        self.tokenizer = Tokenizer.from_file(self.data_dir / "tokenizer.json")
        self.train_split = load_split(self.data_dir, "train")
        self.plan = BatchPlan(self._train_batches(), recipe.seed, self.cfg.update_freq, ctx.world, ctx.rank)
        self._load_valid(manifest)

        self._check_model_fits_memory()
        torch.manual_seed(recipe.seed)
        self.model = Transformer(recipe.model, self.tokenizer.vocab_size).to(ctx.device)
        dtype = choose_dtype(self.cfg.precision, ctx.device, "train.precision")
        self.amp_dtype = None if dtype == torch.float32 else dtype  # the autocast dtype; None: none
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.0, betas=tuple(self.cfg.betas),
                                           eps=self.cfg.eps, weight_decay=self.cfg.weight_decay,
                                           fused=ctx.device.type == "cuda")
        self.state = TrainState()
        if ctx.is_main:
            if restart:
                shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
                self.metrics_path.unlink(missing_ok=True)
            for torn in self.checkpoint_dir.glob(".*.tmp"):  # what a kill in mid-write left behind
                torn.unlink()
        distributed.barrier()
        self.saved_step = self._resume()
        if ctx.is_main:
            self._truncate_metrics()

        # Batch shapes change with every update; dynamic shapes compile once for all of them (rather than
        # once per shape), and DDP around the compiled model still overlaps its all-reduce with the backward.
        forward_model: torch.nn.Module = torch.compile(self.model, dynamic=True) if self.cfg.compile else self.model
        if ctx.distributed:
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            forward_model = DistributedDataParallel(forward_model, device_ids=device_ids, **_NO_BUFFER_SYNC)
        self.forward_model = forward_model
        # Loss sums since the last log line (rank 0 also holds what a checkpoint carried over); tokens are global.
        self.window_sums = torch.tensor([self.state.window_loss, self.state.window_nll] if ctx.is_main else [0.0, 0.0],
                                        dtype=torch.float64, device=ctx.device)
        self.window_start = self.session_start = self.last_save_time = time.monotonic()
        self.seconds_before = self.state.train_seconds
        self.last_lr, self.last_grad_norm = 0.0, torch.zeros(())
        self.signals = StopSignals()

    # ---- checks that turn a long failure into an immediate message

    def _check_data_matches_recipe(self, manifest: dict[str, Any]) -> None:
        data = self.recipe.data
        prepared = (manifest["bpe"]["vocab_size_requested"], manifest["src_lang"], manifest["tgt_lang"])
        if prepared != (data.bpe.vocab_size, data.src_lang, data.tgt_lang):
            raise MtxError(
                f"The data in {self.data_dir} was prepared with data.bpe.vocab_size = {prepared[0]} for "
                f"{prepared[1]}→{prepared[2]}, but the recipe asks for {data.bpe.vocab_size} and "
                f"{data.src_lang}→{data.tgt_lang}: run `mtx prepare RECIPE` again with this recipe."
            )

    def _check_model_fits_memory(self) -> None:
        """Refuse a model whose weights, gradients and Adam moments (float32 each) alone overflow the device's
        memory, before allocating them: a typo in d_model gets a message, not a crash."""
        params = count_parameters_for(self.recipe.model, self.tokenizer.vocab_size)
        needed, available = 16 * params, available_memory(self.ctx.device)
        if needed > available:
            where = "GPU memory" if self.ctx.device.type == "cuda" else "memory"
            raise MtxError(f"The model has {params:,} parameters: with their gradients and Adam's two moments they "
                           f"need {needed / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB of {where} "
                           "available. Check the model section of the recipe (d_model, d_ff, layers).")

    def _train_batches(self) -> list[np.ndarray]:
        """The training batches, leaving out (and counting) pairs that no batch or no position table can hold.

        `mtx prepare` drops pairs longer than model.max_positions, so what is left here comes from data prepared
        for another model, or a train.max_tokens below a pair's cost: a warning, never a refusal, unless
        nothing is left to train on.
        """
        split, limit = self.train_split, min(self.recipe.model.max_positions, self.cfg.max_tokens)
        costs = pair_costs(split.src_lens, split.tgt_lens)
        fits = np.flatnonzero(costs <= limit)
        if len(fits) == 0:
            raise MtxError(
                f"No training pair fits: the shortest needs {int(costs.min())} tokens (its longer side plus EOS), "
                f"more than train.max_tokens = {self.cfg.max_tokens} or model.max_positions = "
                f"{self.recipe.model.max_positions}. Raise them, or run `mtx prepare RECIPE` again."
            )
        if len(fits) < len(costs):
            self._say(f"warning: {len(costs) - len(fits):,} of {len(costs):,} training pairs are longer than "
                      f"{limit} tokens (the smaller of train.max_tokens and model.max_positions) and are left out. "
                      "Run `mtx prepare RECIPE` again to drop them from the data, or raise those limits.")
        return self._batches_of(split, fits, self.cfg.max_tokens)

    def _batches_of(self, split: PairSource, pairs: np.ndarray, max_tokens: int) -> list[np.ndarray]:
        """`make_batches` of the pairs `pairs` of `split`, as indices into the whole split."""
        batches = make_batches(split.src_lens[pairs], split.tgt_lens[pairs], max_tokens, self.recipe.seed)
        return [pairs[b] for b in batches]

    def _load_valid(self, manifest: dict[str, Any]) -> None:
        """The valid split for loss (pairs the model can hold, batched) and its text for BLEU, if it has one."""
        has_valid = manifest["splits"].get("valid", {}).get("pairs", 0) > 0
        if self.cfg.patience is not None and not has_valid:
            raise MtxError("train.patience is set but the prepared data has no valid split to validate on: add "
                           "one to data.source and run `mtx prepare` again, or unset train.patience.")
        self.valid_split = load_split(self.data_dir, "valid") if has_valid else None
        if self.valid_split is None:
            return
        split = self.valid_split
        costs = pair_costs(split.src_lens, split.tgt_lens)
        usable = np.flatnonzero(costs <= self.recipe.model.max_positions)
        budget = max(self.cfg.max_tokens, int(costs[usable].max(initial=1)))
        self.valid_batches = self._batches_of(split, usable, budget)
        data, count = self.recipe.data, self.cfg.valid_max_sentences
        self.valid_sources, self.valid_refs = (
            (self.data_dir / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            for lang in (data.src_lang, data.tgt_lang))

    # ---- resume

    def _latest_checkpoint(self) -> Path | None:
        """The newest step_<N>.pt (last.pt links to it, but a kill may fall between writing one and the other)."""
        if not self.checkpoint_dir.is_dir():
            return None
        steps = step_checkpoints(self.checkpoint_dir)
        if steps:
            return steps[-1][1]
        last = self.checkpoint_dir / "last.pt"
        return last if last.is_file() else None

    def _resume(self) -> int:
        """Load the latest checkpoint, if any, into model, optimizer, scaler and state; its step (0 if none).

        Rank 0 chooses the checkpoint and every rank loads that one: on a network filesystem another rank's
        listing of checkpoints/ can be older, and replicas resumed from different steps would drift apart
        silently. Then all ranks check they hold the same step before the first update.
        """
        chosen = self._latest_checkpoint() if self.ctx.is_main else None
        chosen = distributed.broadcast_object(None if chosen is None else str(chosen))
        problem = None
        if chosen is not None:
            try:
                self._load(Path(chosen))
            except MtxError as e:
                problem = str(e)
        outcomes = distributed.all_gather_objects((self.state.step, problem))
        for rank, (_, error) in enumerate(outcomes):
            if error is not None:
                raise MtxError(error if self.ctx.world == 1 else f"Rank {rank} cannot resume: {error}")
        steps = [step for step, _ in outcomes]
        if len(set(steps)) > 1:
            raise MtxError(f"The ranks resumed from different steps ({steps}, by rank) out of {chosen}: the run "
                           "directory must be one shared filesystem that every node sees alike.")
        if chosen is not None:
            self._say(f"Resuming from {chosen} (step {self.state.step}, epoch {self.state.epoch}).")
        return self.state.step

    def _load(self, path: Path) -> None:
        checkpoint = load_checkpoint(path)
        ours, theirs = dataclasses.asdict(self.recipe.model), dataclasses.asdict(model_config_of(checkpoint))
        differs = [f"model.{k} is {theirs[k]} there, {ours[k]} here" for k in SHAPE_KEYS if ours[k] != theirs[k]]
        if checkpoint["vocab_size"] != self.tokenizer.vocab_size:
            differs.append(f"the vocabulary has {checkpoint['vocab_size']} tokens there, "
                           f"{self.tokenizer.vocab_size} here")
        elif checkpoint["tokenizer"] != self.tokenizer.to_str():
            differs.append("the data was prepared again since (another tokenizer)")
        if "train_state" not in checkpoint:
            differs.append("it holds no training state (an averaged checkpoint?)")
        if differs:
            raise MtxError(
                f"Cannot resume from {path}: {'; '.join(differs)}. Pass --restart to delete {self.checkpoint_dir} "
                "and start over, or give the recipe another name or run_dir."
            )
        self.model.load_state_dict(checkpoint["model"])
        saved = checkpoint["train_state"]
        self.optimizer.load_state_dict(saved["optimizer"])
        if saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])
        self.state = TrainState(**saved["progress"])

    # ---- the loop

    def fit(self) -> TrainState:
        """Train until a budget is spent, patience runs out or a signal arrives; always end on a checkpoint."""
        if (reason := self._budget_spent() or self._time_spent()) is not None:
            self._say(f"Nothing to do: {reason} at step {self.state.step}. Raise it to train longer, or pass "
                      "--restart to start over.")
            return self.state
        columns = (TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with self.signals, Progress(*columns, console=self.console, disable=not self.ctx.is_main,
                                    transient=True) as self.progress:
            self.task = self.progress.add_task("train", total=self.cfg.max_steps, completed=self.state.step, info="")
            while True:
                for update, batches in self._collated_updates():
                    n_tokens, stop, save_due = self._agree(batches)
                    if stop is not None:
                        return self._finish(stop)
                    if save_due:
                        self._save()
                    stepped = self._train_update(batches, n_tokens)
                    self.state.update_in_epoch = update + 1
                    if (reason := self._after_update(stepped)) is not None:
                        return self._finish(reason)
                self.state.epoch += 1
                self.state.update_in_epoch = 0

    def _collated_updates(self) -> Iterator[tuple[int, list[Batch]]]:
        """This rank's updates of the epoch in progress, their batches collated by a background thread, ahead
        of the GPU, into page-locked memory that the GPU copies from without stopping the host."""
        pin = self.ctx.device.type == "cuda"

        def batch(indices: np.ndarray) -> Batch:
            collated = collate(self.train_split, indices)
            return collated.pin_memory() if pin else collated

        updates = self.plan.updates(self.state.epoch, self.state.update_in_epoch)
        return in_background(((update, [batch(i) for i in indices]) for update, indices in updates), ahead=2)

    def _agree(self, batches: list[Batch]) -> tuple[float, str | None, bool]:
        """One all-reduce (on the host) before each update: its target tokens on all ranks, and whether any rank
        was signalled, ran out of time or is due a wall-clock save, so that all ranks stop or save together."""
        minutes = self.cfg.save_every_minutes
        local = [sum(b.n_tgt_tokens for b in batches), self.signals.received is not None,
                 self._time_spent() is not None,
                 minutes is not None and time.monotonic() - self.last_save_time >= 60 * minutes]
        n_tokens, signalled, out_of_time, save_due = distributed.all_reduce_sum(
            torch.tensor(local, dtype=torch.float64)).tolist()
        stop = None
        if signalled:
            stop = self._signal_reason()
        elif out_of_time:
            stop = f"train.max_time = {self.cfg.max_time} of training reached"
        return n_tokens, stop, bool(save_due)

    def _signal_reason(self) -> str:
        return f"stopped by {self.signals.received or 'a signal to another rank'}"

    def _train_update(self, batches: list[Batch], n_tokens: float) -> bool:
        """One optimizer update over this rank's micro-batches; False if the fp16 grad scaler skipped it.

        A skipped update (inf/NaN gradients) is not an update: `step`, and with it the learning rate schedule,
        stays where it was, as fairseq counts updates, and the next batches retry it. The data moves on.
        """
        step = self.state.step + 1
        self.forward_model.train()
        torch.manual_seed(dropout_seed(self.recipe.seed, step, self.ctx.rank))
        lr = learning_rate(self.cfg, self.recipe.model.d_model, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # DDP averages gradients over ranks; multiplying by world / tokens turns that into a per-token mean.
        scale = self.ctx.world / n_tokens
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)  # this update's loss and nll
        for i, batch in enumerate(batches):
            sums += self._forward_backward(batch.to(self.ctx.device), scale, sync=i == len(batches) - 1)
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if scale_before is not None and self.scaler.get_scale() < scale_before:
            self.state.skipped_steps += 1
            if self.scaler.get_scale() < MIN_LOSS_SCALE:
                raise MtxError(f"Training diverged at step {self.state.step}: the fp16 loss scale fell below "
                               f"{MIN_LOSS_SCALE} and the gradients are still inf/NaN. Lower train.lr, raise "
                               "train.warmup or set train.clip_norm (or use bf16), and pass --restart.")
            return False
        self.window_sums += sums
        self.state.window_tokens += n_tokens
        self.state.step, self.last_lr = step, lr
        return True

    def _forward_backward(self, batch: Batch, scale: float, sync: bool) -> Tensor:
        """One micro-batch: the loss's gradient, scaled, added to the parameters' (DDP's all-reduce only when
        `sync`); its summed loss and nll, left on the device. Nothing here waits for the device."""
        no_sync = self.forward_model.no_sync() if self.ctx.distributed and not sync else nullcontext()
        with no_sync, self._autocast():
            loss_sum, nll_sum, _ = batch_loss(self.forward_model, batch, self.cfg.label_smoothing)
            self.scaler.scale(loss_sum * scale).backward()
        return torch.stack([loss_sum.detach(), nll_sum]).double()

    def _after_update(self, stepped: bool) -> str | None:
        """Log, validate, save as scheduled after a real update; the reason to stop, if any."""
        step = self.state.step
        self.state.train_seconds = self._elapsed()
        if stepped:
            self.progress.update(self.task, completed=step)
            if step % self.cfg.log_every == 0:
                self._log_train()
            validate = self.valid_split is not None and step % self.cfg.validate_every == 0
            if validate and (interrupted := self._validate()) is not None:
                return interrupted
        reason = self._budget_spent()
        if reason is not None or (stepped and step % self.cfg.save_every == 0):
            self._save()
        return reason

    def _budget_spent(self) -> str | None:
        """The budgets every rank sees alike; time, which each rank measures, is agreed on in `_agree`."""
        state, cfg = self.state, self.cfg
        if state.step >= cfg.max_steps:
            return f"train.max_steps = {cfg.max_steps} reached"
        epochs_done = state.epoch - 1 + (state.update_in_epoch == self.plan.updates_per_epoch)
        if cfg.max_epochs is not None and epochs_done >= cfg.max_epochs:
            return f"train.max_epochs = {cfg.max_epochs} reached"
        if cfg.patience is not None and state.bad_validations >= cfg.patience:
            return f"early stopping: valid BLEU has not improved in {cfg.patience} validations (train.patience)"
        return None

    def _time_spent(self) -> str | None:
        if self.cfg.max_time is None or self._elapsed() < parse_duration(self.cfg.max_time, "train.max_time"):
            return None
        return f"train.max_time = {self.cfg.max_time} of training reached"

    def _finish(self, reason: str) -> TrainState:
        """The stop path, which a pre-emption gives seconds: the step checkpoint first, nothing else before it."""
        self.state.train_seconds = self._elapsed()
        if self.saved_step != self.state.step:
            self._save()
        if reason.startswith("stopped by"):
            hint = "Run the same command again to resume."
        else:
            hint = "To train on, raise that budget and run the same command again: it resumes from here."
        self._say(f"Training stopped at step {self.state.step}: {reason}. Checkpoint: "
                  f"{self.checkpoint_dir / 'last.pt'}. {hint}")
        distributed.barrier()
        return self.state

    def _elapsed(self) -> float:
        return self.seconds_before + time.monotonic() - self.session_start

    def _autocast(self) -> AbstractContextManager:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype)

    # ---- logging

    def _log_train(self) -> None:
        loss_sum, nll_sum = distributed.all_reduce_sum(self.window_sums).tolist()
        tokens = self.state.window_tokens
        loss, nll = loss_sum / tokens, nll_sum / tokens
        if not math.isfinite(loss):
            raise MtxError(f"Training diverged at step {self.state.step} (loss {loss}): lower train.lr, raise "
                           "train.warmup or set train.clip_norm, and pass --restart.")
        seconds = max(time.monotonic() - self.window_start, 1e-9)
        self._record({"event": "train", "step": self.state.step, "epoch": self.state.epoch, "loss": loss, "nll": nll,
                      "ppl": math.exp(min(nll, 100.0)), "lr": self.last_lr, "grad_norm": float(self.last_grad_norm),
                      "tokens_per_s": tokens / seconds, "skipped_steps": self.state.skipped_steps})
        self.progress.update(self.task, info=f"loss {loss:.3f}  lr {self.last_lr:.2e}  {tokens / seconds:,.0f} tok/s")
        self.window_sums.zero_()
        self.state.window_tokens, self.window_start = 0.0, time.monotonic()

    def _record(self, event: dict[str, Any]) -> None:
        """One line of metrics.jsonl and one on stderr, from rank 0."""
        if not self.ctx.is_main:
            return
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in event.items()
                          if k != "event")
        self.console.print(f"{event['event']}: {shown}")

    def _truncate_metrics(self) -> None:
        """Drop events logged after the checkpoint we resume from: the resumed run logs them again."""
        if not self.metrics_path.is_file():
            return
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _event_step(line) <= self.state.step]
        if len(kept) != len(lines):
            atomic_write(self.metrics_path, lambda f: f.write("".join(kept).encode("utf-8")))

    def _say(self, message: str) -> None:
        if self.ctx.is_main:
            self.console.print(message)

    # ---- validation

    def _validate(self) -> str | None:
        """Valid loss and BLEU, logged; best.pt and patience follow the BLEU. A stop signal interrupts it: then
        nothing is recorded and the reason to stop is returned, so that the stop does not wait for decoding."""
        self.model.eval()
        try:
            valid = self._valid_loss()
            bleu = self._valid_bleu() if valid is not None else None
        finally:
            self.model.train()
        if valid is None or bleu is None:
            return self._signal_reason()
        (loss, nll), state = valid, self.state
        if state.best_bleu is None or bleu > state.best_bleu:
            state.best_bleu, state.bad_validations = bleu, 0
            if self.ctx.is_main:
                save_checkpoint(self._checkpoint(train_state=None), self.checkpoint_dir / "best.pt")
        else:
            state.bad_validations += 1
        self._record({"event": "valid", "step": state.step, "valid_loss": loss, "valid_nll": nll,
                      "valid_ppl": math.exp(min(nll, 100.0)), "valid_bleu": bleu, "best_bleu": state.best_bleu})
        return None

    def _valid_loss(self) -> tuple[float, float] | None:
        """Per-token label-smoothed loss and nll over the valid split, its batches shared among the ranks;
        None if a rank was signalled to stop."""
        sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        with torch.no_grad(), self._autocast():
            for indices in self.valid_batches[self.ctx.rank :: self.ctx.world]:
                if self.signals.received is not None:
                    break
                batch = collate(self.valid_split, indices).to(self.ctx.device)
                sums += torch.stack(batch_loss(self.model, batch, self.cfg.label_smoothing)).double()
        stopped = torch.tensor([self.signals.received is not None], dtype=torch.float64)
        loss_sum, nll_sum, n_tokens, signalled = distributed.all_reduce_sum(torch.cat([sums.cpu(), stopped])).tolist()
        return None if signalled else (loss_sum / n_tokens, nll_sum / n_tokens)

    def _valid_bleu(self) -> float | None:
        """BLEU of decoding the valid sources, scored as `mtx score` does; each rank decodes every world-th,
        `VALID_CHUNK` at a time between looks at the stop signals. None if a rank was signalled to stop."""
        from mtx.score import corpus_bleu
        from mtx.translate import translate_sentences

        rank, world, decode = self.ctx.rank, self.ctx.world, self.recipe.decode
        mine, hyps = self.valid_sources[rank::world], []
        for start in range(0, len(mine), VALID_CHUNK):
            if self.signals.received is not None:
                break
            hyps += translate_sentences(self.model, self.tokenizer, mine[start : start + VALID_CHUNK],
                                        beam=self.cfg.valid_beam, lenpen=decode.lenpen, max_len_a=decode.max_len_a,
                                        max_len_b=decode.max_len_b, min_len=decode.min_len)
        shards = distributed.all_gather_objects((hyps, self.signals.received is not None))
        if any(stopped for _, stopped in shards):
            return None
        return corpus_bleu([shards[i % world][0][i // world] for i in range(len(self.valid_sources))], self.valid_refs)

    # ---- checkpoints

    def _checkpoint(self, train_state: dict[str, Any] | None) -> dict[str, Any]:
        return make_checkpoint(self.model, self.tokenizer.to_str(), self.recipe.to_dict(), self.state.step,
                               train_state)

    def _save(self) -> None:
        """step_<N>.pt, then last.pt as a hard link to it (no second write), old steps pruned. Called on all
        ranks at the same update (the log window is summed onto rank 0); only rank 0 writes."""
        self.saved_step, self.last_save_time = self.state.step, time.monotonic()
        distributed.all_reduce_sum(self.window_sums)
        if not self.ctx.is_main:
            self.window_sums.zero_()
            return
        self.state.window_loss, self.state.window_nll = self.window_sums.tolist()
        progress = {"progress": dataclasses.asdict(self.state), "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict()}
        path = self.checkpoint_dir / f"step_{self.state.step}.pt"
        save_checkpoint(self._checkpoint(progress), path)
        _link_atomically(path, self.checkpoint_dir / "last.pt")
        if self.cfg.keep_last:
            for _, old in step_checkpoints(self.checkpoint_dir)[: -self.cfg.keep_last]:
                old.unlink()


# The one buffer, the positional table, is the same on every rank: DDP need not broadcast it before every
# forward. PyTorch 2.13 renamed the switch (and deprecated the old name); earlier releases know only the old one.
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


def _link_atomically(source: Path, target: Path) -> None:
    """Make `target` the same file as `source`: a hard link renamed into place; where a filesystem has no
    hard links, a copy streamed in blocks (never the whole checkpoint in memory), renamed into place."""
    temporary = target.with_name(f".{target.name}.link.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
        os.replace(temporary, target)
    except OSError:
        with open(source, "rb") as original:
            atomic_write(target, lambda f: shutil.copyfileobj(original, f, 1 << 24))


def _event_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf  # a line torn by a kill: dropped


def train(recipe: Recipe, restart: bool = False) -> TrainState:
    """Train `recipe` on its prepared data in this process (one of many under torchrun).

    Rank 0 holds the run directory's lock (mtx.runlock) for the whole run, and tells the other ranks if it
    cannot take it, so that all of them refuse together.
    """
    ctx = distributed.setup(recipe.train.device, parse_duration(recipe.train.dist_timeout, "train.dist_timeout"))
    lock = RunLock(recipe.run_path) if ctx.is_main else None
    try:
        refusal = None
        if lock is not None:
            try:
                lock.acquire()
            except MtxError as e:
                refusal, lock = str(e), None
        if (refusal := distributed.broadcast_object(refusal)) is not None:
            raise MtxError(refusal)
        if lock is not None and lock.replaced_stale is not None:
            old = lock.replaced_stale
            Console(stderr=True).print(f"Took over the lock of a stopped run (host {old.get('host')}, pid "
                                       f"{old.get('pid')}: {old.get('stale_reason')}).", highlight=False)
        try:
            return Trainer(recipe, ctx, restart).fit()
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            memory = "GPU memory" if ctx.device.type == "cuda" else "memory"
            raise MtxError(f"Out of {memory} while training ({str(e).splitlines()[0][:160]}). Lower "
                           "train.max_tokens and raise train.update_freq to keep the update's size (the same "
                           "gradient), or use a smaller model.") from None
    finally:
        if lock is not None:
            lock.release()
        distributed.teardown()
