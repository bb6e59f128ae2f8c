"""`mtx train`: the paper's training setup (§5) in one loop, from one CPU to many GPUs.

One update: this rank's micro-batches (mtx.batching) run forward and backward under autocast, DDP's
gradient all-reduce held back (`no_sync`) until the last one; the summed label-smoothed loss is divided by the
target tokens of the whole update on all ranks, so 1 GPU × update_freq 8 computes the gradient of 8 GPUs ×
update_freq 1. Then unscale (fp16), clip, Adam step at the scheduled learning rate.

Everything a resumed run needs is the model, the optimizer, the grad scaler and `TrainState` — the step, the
position inside the epoch, the best score, the clock. The batch order is a pure function of (seed, epoch) and
dropout is reseeded at every update from (seed, step, rank), so no RNG state has to be carried over: a run
stopped and resumed draws the very same batches and dropout masks as a run that never stopped.

The loop checks its budgets (max_steps, max_epochs, max_time, patience) and SIGTERM/SIGINT between updates,
the ranks agreeing through the same all-reduce that sums the update's token count; on stopping it writes a
checkpoint and returns, and running the same command again resumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch.nn.parallel import DistributedDataParallel

from mtx import distributed
from mtx.batching import Batch, BatchPlan, collate, make_batches, pair_costs
from mtx.checkpoint import (
    atomic_write,
    load_checkpoint,
    make_checkpoint,
    model_config_of,
    save_checkpoint,
    step_checkpoints,
)
from mtx.config import Recipe, TrainConfig, parse_duration
from mtx.data import load_manifest, load_split
from mtx.errors import MtxError
from mtx.loss import batch_loss
from mtx.model import Transformer
from mtx.tokenizer import Tokenizer

SHAPE_KEYS = ("layers_enc", "layers_dec", "d_model", "heads", "d_ff", "norm", "share_embeddings", "max_positions")


@dataclass
class TrainState:
    """The trainer's progress, as Python primitives (checkpoints load with weights_only=True)."""

    step: int = 0  # optimizer updates done
    epoch: int = 1  # the epoch in progress, from 1
    update_in_epoch: int = 0  # updates of `epoch` done: where a resumed run continues
    train_seconds: float = 0.0  # summed over all sessions of the run; what train.max_time budgets
    best_bleu: float | None = None
    bad_validations: int = 0  # validations since best_bleu last improved
    skipped_steps: int = 0  # fp16 updates dropped by the grad scaler for inf/NaN gradients
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


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 where the GPU has it, fp16 (with a grad scaler) on older GPUs, fp32 (None) on the CPU for auto."""
    if precision == "fp32" or (precision == "auto" and device.type == "cpu"):
        return None
    bf16_ok = device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
    if precision == "auto":
        return torch.bfloat16 if bf16_ok else torch.float16
    if precision == "bf16" and not bf16_ok:
        raise MtxError(f"train.precision = 'bf16' but {torch.cuda.get_device_name(device)} has no bf16 support: "
                       "set train.precision to fp16 or auto.")
    return torch.bfloat16 if precision == "bf16" else torch.float16


def dropout_seed(seed: int, step: int, rank: int) -> int:
    """A seed per (run seed, update, rank): dropout masks differ across ranks and repeat after a resume."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % 2**63


class StopSignals:
    """SIGTERM or SIGINT (a cluster pre-emption, Ctrl-C) asks the loop to stop after the current update.

    A second SIGINT aborts at once. Handlers can only be set in the main thread; elsewhere this does nothing.
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
            for signum in (signal.SIGTERM, signal.SIGINT):
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
        self._check_lengths_fit_model()
        batches = make_batches(self.train_split.src_lens, self.train_split.tgt_lens, self.cfg.max_tokens, recipe.seed)
        self.plan = BatchPlan(batches, recipe.seed, self.cfg.update_freq, ctx.world, ctx.rank)
        self._load_valid(manifest)

        torch.manual_seed(recipe.seed)
        self.model = Transformer(recipe.model, self.tokenizer.vocab_size).to(ctx.device)
        self.amp_dtype = autocast_dtype(self.cfg.precision, ctx.device)
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

        forward_model: torch.nn.Module = torch.compile(self.model) if self.cfg.compile else self.model
        if ctx.distributed:
            device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            forward_model = DistributedDataParallel(forward_model, device_ids=device_ids, broadcast_buffers=False)
        self.forward_model = forward_model
        # Loss sums since the last log line (rank 0 also holds what a checkpoint carried over); tokens are global.
        self.window_sums = torch.tensor([self.state.window_loss, self.state.window_nll] if ctx.is_main else [0.0, 0.0],
                                        dtype=torch.float64, device=ctx.device)
        self.window_start = self.session_start = self.last_save_time = time.monotonic()
        self.seconds_before = self.state.train_seconds
        self.last_lr, self.last_grad_norm = 0.0, torch.zeros(())

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

    def _check_lengths_fit_model(self) -> None:
        costs = pair_costs(self.train_split.src_lens, self.train_split.tgt_lens)
        longest, limit = int(costs.max()), self.recipe.model.max_positions
        if longest > limit:
            raise MtxError(
                f"Training pair {int(costs.argmax())} has {longest} tokens (EOS included), more than "
                f"model.max_positions = {limit}: raise model.max_positions, or prepare the data with a smaller "
                "data.filter.max_len."
            )

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
        batches = make_batches(split.src_lens[usable], split.tgt_lens[usable], budget, self.recipe.seed)
        self.valid_batches = [usable[b] for b in batches]
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
        """Load the latest checkpoint, if any, into model, optimizer, scaler and state; its step (0 if none)."""
        path = self._latest_checkpoint()
        if path is None:
            return 0
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
        self._say(f"Resuming from {path} (step {self.state.step}, epoch {self.state.epoch}).")
        return self.state.step

    # ---- the loop

    def fit(self) -> TrainState:
        """Train until a budget is spent, patience runs out or a signal arrives; always end on a checkpoint."""
        if (reason := self._budget_spent() or self._time_spent()) is not None:
            self._say(f"Nothing to do: {reason} at step {self.state.step}. Raise it to train longer, or pass "
                      "--restart to start over.")
            return self.state
        columns = (TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with StopSignals() as signals, Progress(*columns, console=self.console, disable=not self.ctx.is_main,
                                                transient=True) as self.progress:
            self.task = self.progress.add_task("train", total=self.cfg.max_steps, completed=self.state.step, info="")
            while True:
                for update, indices in self.plan.updates(self.state.epoch, self.state.update_in_epoch):
                    batches = [collate(self.train_split, i) for i in indices]
                    n_tokens, stop, save_due = self._agree(batches, signals)
                    if stop is not None:
                        return self._finish(stop)
                    if save_due:
                        self._save()
                    self._train_update(batches, n_tokens)
                    self.state.update_in_epoch = update + 1
                    if (reason := self._after_update()) is not None:
                        return self._finish(reason)
                self.state.epoch += 1
                self.state.update_in_epoch = 0

    def _agree(self, batches: list[Batch], signals: StopSignals) -> tuple[float, str | None, bool]:
        """One all-reduce before each update: its target tokens on all ranks, and whether any rank was
        signalled, ran out of time or is due a wall-clock save, so that all ranks stop or save together."""
        minutes = self.cfg.save_every_minutes
        local = [sum(b.n_tgt_tokens for b in batches), signals.received is not None, self._time_spent() is not None,
                 minutes is not None and time.monotonic() - self.last_save_time >= 60 * minutes]
        device = self.ctx.device if self.ctx.distributed else torch.device("cpu")
        agreed = distributed.all_reduce_sum(torch.tensor(local, dtype=torch.float64, device=device)).tolist()
        n_tokens, signalled, out_of_time, save_due = agreed
        stop = None
        if signalled:
            stop = f"stopped by {signals.received or 'a signal to another rank'}"
        elif out_of_time:
            stop = f"train.max_time = {self.cfg.max_time} of training reached"
        return n_tokens, stop, bool(save_due)

    def _train_update(self, batches: list[Batch], n_tokens: float) -> None:
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
            batch = batch.to(self.ctx.device)
            last = i == len(batches) - 1
            sync = self.forward_model.no_sync() if self.ctx.distributed and not last else nullcontext()
            with sync, self._autocast():
                loss_sum, nll_sum, _ = batch_loss(self.forward_model, batch, self.cfg.label_smoothing)
                self.scaler.scale(loss_sum * scale).backward()
            sums += torch.stack([loss_sum.detach(), nll_sum]).double()
        self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        scale_before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled() and self.scaler.get_scale() < scale_before:
            self.state.skipped_steps += 1  # inf/NaN gradients: no step taken, nothing to average into the log
        else:
            self.window_sums += sums
            self.state.window_tokens += n_tokens
        self.state.step, self.last_lr = step, lr

    def _after_update(self) -> str | None:
        """Log, validate, save as scheduled; the reason to stop, if any."""
        step = self.state.step
        self.state.train_seconds = self._elapsed()
        self.progress.update(self.task, completed=step)
        if step % self.cfg.log_every == 0:
            self._log_train()
        if self.valid_split is not None and step % self.cfg.validate_every == 0:
            self._validate()
        reason = self._budget_spent()
        if reason is not None or step % self.cfg.save_every == 0:
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
        if tokens == 0:  # every update since the last line was skipped by the fp16 grad scaler
            loss = nll = ppl = None
        else:
            loss, nll = loss_sum / tokens, nll_sum / tokens
            if not math.isfinite(loss):
                raise MtxError(f"Training diverged at step {self.state.step} (loss {loss}): lower train.lr, raise "
                               "train.warmup or set train.clip_norm, and pass --restart.")
            ppl = math.exp(min(nll, 100.0))
        seconds = max(time.monotonic() - self.window_start, 1e-9)
        self._record({"event": "train", "step": self.state.step, "epoch": self.state.epoch, "loss": loss, "nll": nll,
                      "ppl": ppl, "lr": self.last_lr, "grad_norm": float(self.last_grad_norm),
                      "tokens_per_s": tokens / seconds, "skipped_steps": self.state.skipped_steps})
        shown = "all updates skipped" if loss is None else f"loss {loss:.3f}"
        self.progress.update(self.task, info=f"{shown}  lr {self.last_lr:.2e}  {tokens / seconds:,.0f} tok/s")
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

    def _validate(self) -> None:
        self.model.eval()
        loss, nll = self._valid_loss()
        bleu = self._valid_bleu()
        self.model.train()
        state = self.state
        if state.best_bleu is None or bleu > state.best_bleu:
            state.best_bleu, state.bad_validations = bleu, 0
            if self.ctx.is_main:
                save_checkpoint(self._checkpoint(train_state=None), self.checkpoint_dir / "best.pt")
        else:
            state.bad_validations += 1
        self._record({"event": "valid", "step": state.step, "valid_loss": loss, "valid_nll": nll,
                      "valid_ppl": math.exp(min(nll, 100.0)), "valid_bleu": bleu, "best_bleu": state.best_bleu})

    def _valid_loss(self) -> tuple[float, float]:
        """Per-token label-smoothed loss and nll over the valid split, its batches shared among the ranks."""
        sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        with torch.no_grad(), self._autocast():
            for indices in self.valid_batches[self.ctx.rank :: self.ctx.world]:
                batch = collate(self.valid_split, indices).to(self.ctx.device)
                sums += torch.stack(batch_loss(self.model, batch, self.cfg.label_smoothing)).double()
        loss_sum, nll_sum, n_tokens = distributed.all_reduce_sum(sums).tolist()
        return loss_sum / n_tokens, nll_sum / n_tokens

    def _valid_bleu(self) -> float:
        """BLEU of decoding the valid sources, scored as `mtx score` does; each rank decodes every world-th."""
        from mtx.score import corpus_bleu
        from mtx.translate import translate_sentences

        rank, world, decode = self.ctx.rank, self.ctx.world, self.recipe.decode
        hyps = translate_sentences(self.model, self.tokenizer, self.valid_sources[rank::world],
                                   beam=self.cfg.valid_beam, lenpen=decode.lenpen, max_len_a=decode.max_len_a,
                                   max_len_b=decode.max_len_b, min_len=decode.min_len)
        shards = distributed.all_gather_objects(hyps)
        return corpus_bleu([shards[i % world][i // world] for i in range(len(self.valid_sources))], self.valid_refs)

    # ---- checkpoints

    def _checkpoint(self, train_state: dict[str, Any] | None) -> dict[str, Any]:
        return make_checkpoint(self.model, self.tokenizer.to_str(), self.recipe.to_dict(), self.state.step,
                               train_state)

    def _save(self) -> None:
        """step_<N>.pt, last.pt as a hard link to it (no second write), old steps pruned. Called on all ranks
        at the same update (the log window is summed onto rank 0); only rank 0 writes."""
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


def _link_atomically(source: Path, target: Path) -> None:
    """Make `target` the same file as `source`: a hard link renamed into place, a copy where links fail."""
    temporary = target.with_name(f".{target.name}.link.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
        os.replace(temporary, target)
    except OSError:
        atomic_write(target, lambda f: f.write(source.read_bytes()))


def _event_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf  # a line torn by a kill: dropped


def train(recipe: Recipe, restart: bool = False) -> TrainState:
    """Train `recipe` on its prepared data in this process (one of many under torchrun)."""
    ctx = distributed.setup(recipe.train.device)
    try:
        return Trainer(recipe, ctx, restart).fit()
    finally:
        distributed.teardown()
