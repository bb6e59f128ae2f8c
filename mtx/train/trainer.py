"""The trainer: the paper's training setup (§5) in one loop, from one CPU to many GPUs (`mtx train`).

One update: this rank's micro-batches (mtx.data.batching) run forward and backward under autocast, DDP's
gradient all-reduce held back (`no_sync`) until the last one; the summed label-smoothed loss is divided by the
target tokens of the whole update on all ranks, so 1 GPU × update_freq 8 computes the gradient of 8 GPUs ×
update_freq 1. Then unscale (fp16), clip, Adam step at the scheduled learning rate. An fp16 update that the
grad scaler skips (inf/NaN gradients) is not an update: the step and the schedule wait for the next one.

With train.ema_decay a moving average of the weights (mtx.train.ema) follows every update; validation and
best.pt use it, and so does every command that translates a checkpoint. A run with train.init_from starts from
another run's checkpoint (mtx.train.fine_tuning) rather than from random weights.

Everything a resumed run needs is the model, its moving average, the optimizer, the grad scaler, `TrainState` —
the step, the position inside the epoch, the best score, the clock, the tokens trained on, the BLEU milestones
reached (mtx.train.milestones) — and the open loss window of the log (mtx.train.checkpoints saves them). The batch
order is a pure function of (seed, epoch) and dropout is reseeded at every update from (seed, step, rank),
so no RNG state has to be carried over: a run stopped and resumed draws the very same batches and dropout
masks as a run that never stopped.

Between updates the loop asks the stopping rules (mtx.train.stopping: budgets, patience, stop signals), the
ranks agreeing through the same all-reduce (on the host) that sums the update's token count; a signal also
cuts a validation short (mtx.train.validation). On stopping it writes the checkpoint of that step first and
returns, and running the same command again resumes. While the GPU computes an update, a background thread
collates the next. What the run reports goes to metrics.jsonl, stderr and TensorBoard (mtx.train.metrics_log).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import math
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np
import torch
from rich.console import Console
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from mtx.checkpoint import describe_checkpoint, inference_weights
from mtx.config.fields import parse_duration
from mtx.config.recipe import ModelConfig, Recipe, TrainConfig
from mtx.data.batching import Batch, BatchPlan, collate, in_background, update_shape
from mtx.data.bpe_dropout import GROWTH_SAMPLE, BpeDropout, DroppedOutSplit, SegmentingWorkers, growth
from mtx.data.prepared import load_manifest, load_split
from mtx.decode.flags import training_statistics
from mtx.devices import allow_tf32, available_memory, choose_dtype
from mtx.errors import MtxError, first_line, is_out_of_memory
from mtx.model.transformer import Transformer, count_parameters_for
from mtx.tokenizer import Tokenizer
from mtx.train import distributed, fine_tuning
from mtx.train.checkpoints import CheckpointKeeper
from mtx.train.ema import WeightAverage
from mtx.train.loss import batch_loss
from mtx.train.metrics_log import MetricsLog
from mtx.train.milestones import describe_milestones, milestones_reached
from mtx.train.run_data import check_data_matches_recipe, load_valid_set, training_batches
from mtx.train.run_lock import RunLock
from mtx.train.stopping import Budgets, StopReason, StopSignals, improves
from mtx.train.validation import Validator

MIN_LOSS_SCALE = 1e-4  # fp16: a grad scaler halved this far finds inf/NaN gradients at any scale (fairseq's limit)


@dataclass
class TrainState:
    """The trainer's progress, as Python primitives (checkpoints load with weights_only=True)."""

    step: int = 0  # optimizer updates done
    epoch: int = 1  # the epoch in progress, from 1
    batch_in_epoch: int = 0  # batches of `epoch`'s order trained on: where a resumed run continues
    world: int = 1  # the processes and train.update_freq of the session that saved this state: the batches
    update_freq: int = 1  # of an update, which a resume on another shape reports
    max_tokens: int | None = None  # and the budget and number of the epoch's batches it counted positions in
    epoch_batches: int | None = None  # (None: saved by an mtx that did not record them)
    train_seconds: float = 0.0  # summed over all sessions of the run; what train.max_time budgets
    best_bleu: float | None = None
    bad_validations: int = 0  # validations since best_bleu last improved
    skipped_steps: int = 0  # fp16 updates dropped by the grad scaler for inf/NaN gradients (not in `step`)
    tokens: int = 0  # target tokens of all updates so far, all ranks' (skipped ones too: the data moved on)
    milestones: list[dict[str, Any]] = field(default_factory=list)  # the milestone lines of levels reached

    @classmethod
    def from_progress(cls, progress: dict[str, Any], world: int, update_freq: int) -> TrainState:
        """The state in a checkpoint's progress, which also holds the log's loss window (its window_* keys); a
        new run's state on `world` processes × `update_freq` if there is none.

        A checkpoint of an mtx from before positions were counted in batches holds `update_in_epoch` instead, with
        no shape: it is taken to have the shape of this session, as that mtx would have taken it."""
        state = cls(**{f.name: progress[f.name] for f in dataclasses.fields(cls) if f.name in progress})
        if "batch_in_epoch" not in progress:
            state.world, state.update_freq = world, update_freq
            state.batch_in_epoch = progress.get("update_in_epoch", 0) * world * update_freq
        return state


def for_this_session(recipe: Recipe, world: int) -> Recipe:
    """The recipe with train.update_tokens turned into this session's max_tokens and update_freq for `world`
    processes (mtx.data.batching.update_shape); as it is without it."""
    cfg = recipe.train
    if cfg.update_tokens is None:
        return recipe
    max_tokens, update_freq = update_shape(cfg.update_tokens, cfg.max_tokens, world)
    return dataclasses.replace(recipe, train=dataclasses.replace(cfg, max_tokens=max_tokens, update_freq=update_freq))


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


class Trainer:
    """Builds the run from the recipe and its prepared data, resumes it if it has checkpoints, and trains.

    Its parts: the batch plan (mtx.data.batching), the validator (mtx.train.validation), the checkpoint
    keeper (mtx.train.checkpoints) and the metrics log (mtx.train.metrics_log); the trainer holds the model,
    the optimizer and the state, and decides, update by update, what comes next.
    """

    def __init__(self, recipe: Recipe, ctx: distributed.Context, restart: bool = False,
                 lock: RunLock | None = None) -> None:
        """`lock`: the run directory's lock, which rank 0 holds (mtx.train.run_lock), None on the other ranks."""
        recipe = for_this_session(recipe, ctx.world)
        self.recipe, self.cfg, self.ctx, self.lock = recipe, recipe.train, ctx, lock
        distributed.check_shared_directory(recipe.run_path)
        self.log = MetricsLog(recipe.run_path / "metrics.jsonl", ctx, self.cfg.tensorboard)  # TensorBoard checked here
        if self.cfg.update_tokens is not None:
            self.log.say(f"train.update_tokens {self.cfg.update_tokens:,} on {ctx.world} process"
                         f"{'es' if ctx.world > 1 else ''}: micro-batches of up to {self.cfg.max_tokens:,} tokens, "
                         f"update_freq {self.cfg.update_freq}.")
        data_dir = recipe.run_path / "data"
        manifest = load_manifest(data_dir)
        check_data_matches_recipe(recipe, manifest, data_dir)
        self.tokenizer = Tokenizer.from_file(data_dir / "tokenizer.json")
        self.train_split = load_split(data_dir, "train")
        batches = training_batches(recipe, manifest, self.train_split, say=self.log.say)
        self.plan = BatchPlan(batches, recipe.seed, self.cfg.update_freq, ctx.world, ctx.rank)
        self.bpe_dropout = self._bpe_dropout()
        self.segmenting = (None if self.bpe_dropout is None or self.cfg.bpe_dropout_workers == 0 else
                           SegmentingWorkers(self.cfg.bpe_dropout_workers, data_dir, self.bpe_dropout,
                                             recipe.model.max_positions))
        valid = load_valid_set(recipe, manifest, data_dir)

        _check_model_fits_memory(recipe.model, self.tokenizer.vocab_size, ctx.device)
        torch.manual_seed(recipe.seed)
        self.model = Transformer(recipe.model, self.tokenizer.vocab_size).to(ctx.device)
        dtype = choose_dtype(self.cfg.precision, ctx.device, "train.precision")
        self.amp_dtype = None if dtype == torch.float32 else dtype  # the autocast dtype; None: none
        if dtype == torch.float32:
            allow_tf32(ctx.device)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.0, betas=tuple(self.cfg.betas),
                                           eps=self.cfg.eps, weight_decay=self.cfg.weight_decay,
                                           fused=ctx.device.type == "cuda")
        self.ema = None if self.cfg.ema_decay is None else WeightAverage(self.model, self.cfg.ema_decay)
        self.signals = StopSignals()
        self.budgets = Budgets(self.cfg)
        self.validator = None if valid is None else Validator(valid, recipe, ctx, self.model, self.tokenizer,
                                                              self.signals.requested, self._autocast)
        split = self.train_split  # what the data says of its pairs goes into checkpoints, which rank 0 alone writes
        data_stats = training_statistics(split.src_lens, split.tgt_lens, lambda i: (split.src(i), split.tgt(i))
                                         ) if ctx.is_main else None
        self.keeper = CheckpointKeeper(recipe, ctx, self.model, self.tokenizer, self.optimizer, self.scaler,
                                       say=self.log.say, ema=self.ema, data_stats=data_stats)
        progress = self._resume(restart)
        self.state = TrainState.from_progress(progress, ctx.world, self.cfg.update_freq)
        self._take_this_sessions_shape()
        self.forward_model = _for_training(self.model, self.cfg.compile, ctx)
        self.log.open_window(progress)
        self.session_start = time.monotonic()
        self.seconds_before = self.state.train_seconds
        self.last_lr, self.last_grad_norm = 0.0, torch.zeros(())

    def _resume(self, restart: bool) -> dict[str, Any]:
        """The progress of the checkpoint every rank resumed from ({} for a new run), once rank 0 has cleared
        what --restart or a kill in the middle of a write left, and dropped the events logged after it. A new
        run with train.init_from starts from its parent."""
        if restart:
            self.keeper.delete_all()
            self.log.delete()
        self.keeper.remove_torn_writes()
        distributed.barrier()
        progress = self.keeper.resume()
        if not progress and self.cfg.init_from is not None:
            progress = self._start_from_parent()
        self.log.truncate_after(progress.get("step", 0))
        return progress

    def _start_from_parent(self) -> dict[str, Any]:
        """Load train.init_from's weights (its moving average's, where it keeps one) — or, with
        train.init_from_state, all it holds to train on — and say which; the progress the run starts with."""
        checkpoint = fine_tuning.parent_checkpoint(self.recipe)
        fine_tuning.check_vocabulary(self.recipe, checkpoint, self.tokenizer)
        path = self.cfg.init_from
        if self.cfg.init_from_state:
            self.keeper.restore(checkpoint, path)
            progress = fine_tuning.inherited_progress(checkpoint)
            self.log.say(f"Fine-tuning from {path}: its weights, optimizer and schedule, continued from step "
                         f"{progress['step']} (train.init_from_state).")
            return progress
        self.model.load_state_dict(inference_weights(checkpoint))
        if self.ema is not None:
            self.ema.restart_from_weights()
        self.log.say(f"Fine-tuning from {path} ({describe_checkpoint(checkpoint)}); the optimizer, the schedule "
                     "and the data start fresh.")
        return {}

    def _take_this_sessions_shape(self) -> None:
        """A run resumed on another number of processes or update_freq continues at the very batch where it
        stopped (positions are counted in batches of the epoch's order), and says so in one line, with whether
        an update's batches (the effective batch) changed. One resumed with another max_tokens (lowered after
        running out of memory, or set anew by train.update_tokens on another number of processes) has other
        batches: it continues at the same fraction of the epoch, which it says too."""
        state, world, update_freq = self.state, self.ctx.world, self.cfg.update_freq
        before, now = state.world * state.update_freq, world * update_freq
        batches = len(self.plan.batches)
        if state.max_tokens not in (None, self.cfg.max_tokens) and state.epoch_batches:
            position = state.batch_in_epoch
            state.batch_in_epoch = min(batches, round(position * batches / state.epoch_batches))
            self.log.say(f"The batches were cut with max_tokens {state.max_tokens:,} when the run stopped and are "
                         f"cut with {self.cfg.max_tokens:,} now: it continues at the same fraction of epoch "
                         f"{state.epoch}, batch {state.batch_in_epoch:,} of {batches:,} (it stopped at "
                         f"{position:,} of {state.epoch_batches:,}).")
        elif (state.world, state.update_freq) != (world, update_freq):
            effect = (f"An update has the same {now} batches as before." if before == now else
                      f"The effective batch changes from {before} to {now} batches of up to train.max_tokens tokens "
                      "per update; the learning rate schedule stays as it was.")
            self.log.say(f"Resuming on {world} process{'es' if world > 1 else ''} × update_freq {update_freq} "
                         f"where the run stopped on {state.world} × {state.update_freq}: it continues at batch "
                         f"{state.batch_in_epoch:,} of epoch {state.epoch}. {effect}")
        state.world, state.update_freq = world, update_freq
        state.max_tokens, state.epoch_batches = self.cfg.max_tokens, batches

    # ---- the loop

    def fit(self) -> TrainState:
        """Train until a budget is spent, patience runs out or a signal arrives; always end on a checkpoint.

        Whether there is anything to do at all is decided from the checkpoint's state alone, which every rank
        holds alike: were it decided by each rank's own clock, a run resumed within a moment of train.max_time
        could have one rank return while the others wait for it in their first collective."""
        if (reason := self._budget_spent() or self.budgets.time_spent(self.seconds_before)) is not None:
            self.log.say(f"Nothing to do: {reason.describe(self.cfg)} at step {self.state.step}. Raise it to train "
                         "longer, or pass --restart to start over.")
            return self.state
        try:
            with self.signals, self.log.session(total=self.cfg.max_steps, completed=self.state.step):
                while True:
                    for batches_done, batches in self._collated_updates():
                        n_tokens, stop, save_due = self._agree(batches)
                        if stop is not None:
                            return self._finish(stop)
                        if save_due:
                            self._save()
                        stepped = self._train_update(batches, n_tokens)
                        self.state.batch_in_epoch, self.state.tokens = batches_done, self.state.tokens + int(n_tokens)
                        if (stop := self._after_update(stepped)) is not None:
                            return self._finish(stop)
                    self.state.epoch += 1
                    self.state.batch_in_epoch = 0
        finally:
            self.keeper.flush()  # an error, too, ends with the step checkpoint being written in place
            if self.segmenting is not None:
                self.segmenting.close()

    def _bpe_dropout(self) -> BpeDropout | None:
        """train.bpe_dropout's segmenter, once it has said how much longer it makes the training sentences."""
        if self.cfg.bpe_dropout == 0:
            return None
        dropout = BpeDropout(self.tokenizer, self.cfg.bpe_dropout, self.recipe.seed)
        workers = self.cfg.bpe_dropout_workers
        by = f" by {workers} worker process{'es' if workers > 1 else ''}" if workers else ""
        self.log.say(f"BPE-dropout {self.cfg.bpe_dropout}: training sentences are segmented anew each epoch{by}, "
                     f"{growth(self.train_split, dropout):.2f}× as many tokens on a sample of {GROWTH_SAMPLE:,} pairs; "
                     "batches are cut by the stored segmentation, so they hold that many more tokens than "
                     "train.max_tokens.")
        return dropout

    def _collated_updates(self) -> Iterator[tuple[int, list[Batch]]]:
        """This rank's updates of the epoch in progress, their batches collated by a background thread, ahead
        of the GPU, into page-locked memory that the GPU copies from without stopping the host. With
        BPE-dropout, that thread segments the sentences anew too, or hands the batches to the worker processes
        (train.bpe_dropout_workers), which work up to that many updates ahead."""
        pin = self.ctx.device.type == "cuda"
        epoch = self.state.epoch

        def ready(collated: Batch) -> Batch:
            return collated.pin_memory() if pin else collated

        def segmented(updates: Iterator[tuple[int, list[np.ndarray]]]) -> Iterator[tuple[int, list[Batch]]]:
            pending: collections.deque = collections.deque()
            for done, indices in updates:
                pending.append((done, [self.segmenting.submit(epoch, i) for i in indices]))
                if len(pending) > self.cfg.bpe_dropout_workers:
                    done, futures = pending.popleft()
                    yield done, [ready(future.result()) for future in futures]
            for done, futures in pending:
                yield done, [ready(future.result()) for future in futures]

        updates = self.plan.updates(epoch, self.state.batch_in_epoch)
        if self.segmenting is not None:
            return in_background(segmented(updates), ahead=2)
        split = self.train_split
        if self.bpe_dropout is not None:
            split = DroppedOutSplit(split, self.bpe_dropout, epoch, self.recipe.model.max_positions)
        return in_background(((done, [ready(collate(split, i)) for i in indices]) for done, indices in updates),
                             ahead=2)

    def _agree(self, batches: list[Batch]) -> tuple[float, StopReason | None, bool]:
        """One all-reduce (on the host) before each update: its target tokens on all ranks, and whether any rank
        was signalled, ran out of time or is due a wall-clock save, so that all ranks stop or save together;
        and whether rank 0's heartbeat found the run's lock taken over, which stops every rank at once."""
        local = [sum(b.n_tgt_tokens for b in batches), self.signals.requested(),
                 self._time_spent() is not None, self.keeper.save_due(), self.lock is not None and self.lock.lost]
        n_tokens, signalled, out_of_time, save_due, lock_lost = distributed.all_reduce_sum(
            torch.tensor(local, dtype=torch.float64)).tolist()
        if lock_lost:
            self._lock_lost()
        stop = None
        if signalled:
            stop = StopReason.SIGNAL
        elif out_of_time:
            stop = StopReason.MAX_TIME
        return n_tokens, stop, bool(save_due)

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
        self.log.add(sums, n_tokens)
        self.state.step, self.last_lr = step, lr
        if self.ema is not None:
            self.ema.update(step)
        return True

    def _forward_backward(self, batch: Batch, scale: float, sync: bool) -> Tensor:
        """One micro-batch: the loss's gradient, scaled, added to the parameters' (DDP's all-reduce only when
        `sync`); its summed loss and nll, left on the device. Nothing here waits for the device."""
        no_sync = self.forward_model.no_sync() if self.ctx.distributed and not sync else nullcontext()
        with no_sync, self._autocast():
            loss_sum, nll_sum, _ = batch_loss(self.model, batch, self.cfg.label_smoothing, run=self.forward_model)
            self.scaler.scale(loss_sum * scale).backward()
        return torch.stack([loss_sum.detach(), nll_sum]).double()

    def _after_update(self, stepped: bool) -> StopReason | None:
        """Log, validate, save as scheduled after a real update; the reason to stop, if any."""
        state = self.state
        state.train_seconds = self._elapsed()
        if stepped:
            self.log.show_step(state.step)
            if state.step % self.cfg.log_every == 0:
                self.log.log_train(state.step, state.epoch, self.last_lr, self.last_grad_norm, state.skipped_steps,
                                   state.train_seconds)
            validate = self.validator is not None and state.step % self.cfg.validate_every == 0
            if validate and (interrupted := self._validate()) is not None:
                return interrupted
        reason = self._budget_spent()
        if reason is not None or (stepped and state.step % self.cfg.save_every == 0):
            self._save()
        return reason

    def _validate(self) -> StopReason | None:
        """Valid loss, BLEU and length ratio, logged, with the milestones they reach; best.pt and patience follow
        the BLEU. A stop signal interrupts it: then nothing is recorded and the loop stops, so that the stop does
        not wait for decoding."""
        with nullcontext() if self.ema is None else self.ema.in_model():
            scores = self.validator.run()
        if scores is None:
            return StopReason.SIGNAL
        loss, nll, bleu, ratio = scores
        state = self.state
        if improves(bleu, state.best_bleu):
            state.best_bleu, state.bad_validations = bleu, 0
            self._check_lock()
            self.keeper.save_best(state.step)
        else:
            state.bad_validations += 1
        valid = {"event": "valid", "step": state.step, "valid_loss": loss, "valid_nll": nll,
                 "valid_ppl": math.exp(min(nll, 100.0)), "valid_bleu": bleu, "valid_length_ratio": ratio,
                 "best_bleu": state.best_bleu, "tokens": state.tokens, **self.log.timing(self._elapsed())}
        self.log.record(valid)
        for milestone in milestones_reached(self.cfg.bleu_milestones, state.milestones, valid):
            state.milestones.append(milestone)
            self.log.record(milestone)
        return None

    def _save(self, wait: bool = False) -> None:
        """A step checkpoint of the state and the open loss window, on all ranks at the same update; written in
        the background unless `wait`."""
        self._check_lock()
        self.keeper.save(self.state.step, {**dataclasses.asdict(self.state), **self.log.carried_over()}, wait=wait)

    def _check_lock(self) -> None:
        """Before a checkpoint write: rank 0 reads the lock file now, and every rank stops if another command
        has taken it over (this run was suspended past its heartbeat, or its filesystem stalled), rather than
        write beside the new holder."""
        lost = self.lock is not None and not self.lock.still_held()
        if distributed.all_reduce_sum(torch.tensor([float(lost)], dtype=torch.float64)).item():
            self._lock_lost()

    def _lock_lost(self) -> NoReturn:
        """Every rank, together: rank 0, which holds the lock, names the new holder to all."""
        holder = distributed.broadcast_object(f" ({self.lock.holder()})" if self.lock is not None else "")
        raise MtxError(f"The run's lock {self.recipe.run_path / 'train.lock'} was taken over by another command"
                       f"{holder} while this one went without its heartbeat (suspended, or its filesystem "
                       f"stalled). This run stops at step {self.state.step} without writing anything more, so as "
                       "not to write beside the new holder; its checkpoints so far are whole.")

    # ---- stopping

    def _budget_spent(self) -> StopReason | None:
        """The budgets that every rank sees alike; time, which each rank measures, is agreed on in `_agree`."""
        state = self.state
        return self.budgets.spent(state.step, state.epoch, self.plan.epoch_finished(state.batch_in_epoch),
                                  state.bad_validations)

    def _time_spent(self) -> StopReason | None:
        return self.budgets.time_spent(self._elapsed())

    def _finish(self, reason: StopReason) -> TrainState:
        """The stop path, which a pre-emption gives seconds: the step checkpoint first, nothing else before it."""
        why = reason.describe(self.cfg, self.signals.received)  # the signal that stopped it, not one during the save
        self.state.train_seconds = self._elapsed()
        if self.keeper.saved_step != self.state.step:
            self._save(wait=True)
        self.keeper.flush()  # the periodic save of this very step may still be writing
        if reason is StopReason.SIGNAL:
            hint = "Run the same command again to resume."
        else:
            hint = "To train on, raise that budget and run the same command again: it resumes from here."
        self.log.say(f"Training stopped at step {self.state.step}: {why}. Checkpoint: "
                     f"{self.keeper.directory / 'last.pt'}. {hint}")
        for line in describe_milestones(self.cfg.bleu_milestones, self.state.milestones, self.state.best_bleu):
            self.log.say(line)
        distributed.barrier()
        return self.state

    def _elapsed(self) -> float:
        return self.seconds_before + time.monotonic() - self.session_start

    def _autocast(self) -> AbstractContextManager:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype)


def _check_model_fits_memory(model: ModelConfig, vocab_size: int, device: torch.device) -> None:
    """Refuse a model whose weights, gradients and Adam moments (float32 each) alone overflow the device's
    memory, before allocating them: a typo in d_model gets a message, not a crash."""
    params = count_parameters_for(model, vocab_size)
    needed, available = 16 * params, available_memory(device)
    if needed > available:
        where = "GPU memory" if device.type == "cuda" else "memory"
        raise MtxError(f"The model has {params:,} parameters: with their gradients and Adam's two moments they "
                       f"need {needed / 2**30:,.1f} GiB, more than the {available / 2**30:,.1f} GiB of {where} "
                       "available. Check the model section of the recipe (d_model, d_ff, layers).")


def _for_training(model: Transformer, compile: bool, ctx: distributed.Context) -> torch.nn.Module:
    """The model as the updates run it: compiled if asked, inside DDP when there are several ranks.

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


def train(recipe: Recipe, restart: bool = False) -> TrainState:
    """Train `recipe` on its prepared data in this process (one of many under torchrun).

    Rank 0 holds the run directory's lock (mtx.train.run_lock) for the whole run, and tells the other ranks if it
    cannot take it, so that all of them refuse together.
    """
    ctx = distributed.setup(recipe.train.device, parse_duration(recipe.train.dist_timeout, "train.dist_timeout"))
    lock = RunLock(recipe.run_path) if ctx.is_main else None
    peers_lost = False
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
            return Trainer(recipe, ctx, restart, lock).fit()
        except Exception as e:
            if ctx.distributed and distributed.is_peer_failure(e):
                peers_lost = True
                raise distributed.peers_lost(e) from None
            if ctx.distributed:
                distributed.record_failure(e)
            if not is_out_of_memory(e):
                raise
            if isinstance(e, MemoryError):  # the host's memory, which Python and numpy fill: the epoch's batches
                raise MtxError(f"Out of memory while training ({first_line(e)}): the machine cannot hold what "
                               "the run keeps in its memory, the epoch's pairs and batches the most of it. Lower "
                               "data.sources' weights (an epoch holds each corpus' pairs times its weight), or "
                               "train on a machine with more memory.") from None
            memory = "GPU memory" if ctx.device.type == "cuda" else "memory"
            keep = ("train.update_tokens keeps the update's size" if recipe.train.update_tokens is not None else
                    "raise train.update_freq to keep the update's size")
            raise MtxError(f"Out of {memory} while training ({first_line(e)}). Lower train.max_tokens ({keep}: "
                           "the same gradient), or use a smaller model.") from None
    finally:
        if lock is not None:
            lock.release()
        if not peers_lost:  # tearing down a group whose peers are gone can wait for ever (NCCL)
            distributed.teardown()
