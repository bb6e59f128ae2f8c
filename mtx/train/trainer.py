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
returns, and running the same command again resumes; stopped by a budget or patience rather than a signal, it
first chooses the length penalty α of that checkpoint on the valid split (train.tune_lenpen). While the GPU
computes an update, a background thread collates the next (mtx.train.feeding). What the run reports goes to
metrics.jsonl, stderr and TensorBoard (mtx.train.metrics_log).

The trainer builds none of its parts: `train` has mtx.train.components build them from the recipe and hands
them over, the hooks that tests replace (the clock, the loss, a wrapper around each update, the valid BLEU)
among them; mtx.train.resume loads the checkpoint into them and mtx.train.state says where the session goes on.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from typing import NamedTuple, NoReturn

import torch
from rich.console import Console
from torch import Tensor

from mtx.config.fields import parse_duration
from mtx.config.recipe import Recipe, TrainConfig
from mtx.data.batching import Batch
from mtx.errors import MtxError, first_line, is_out_of_memory
from mtx.train import distributed
from mtx.train.best import improves, metric_value
from mtx.train.components import Hooks, RunParts, build_run, for_training
from mtx.train.feeding import collated_updates
from mtx.train.milestones import describe_milestones, milestones_reached
from mtx.train.resume import resume_run
from mtx.train.run_lock import RunLock
from mtx.train.state import TrainState, reposition_for_this_session
from mtx.train.stopping import StopReason
from mtx.train.tune_lenpen import choose_at_the_end

MIN_LOSS_SCALE = 1e-4  # fp16: a grad scaler halved this far finds inf/NaN gradients at any scale (fairseq's limit)


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


class Agreement(NamedTuple):
    """What all ranks settle before an update: its target tokens on all ranks, whether to stop and why, and
    whether a wall-clock save is due."""

    n_tokens: float
    stop: StopReason | None
    save_due: bool


class Trainer:
    """Resumes a run into the parts it is handed (mtx.train.components) and trains them, deciding, update by
    update, what comes next: log, validate, save, stop.

    Its parts: the batch plan, the model, its precision and optimizer, the validator, the checkpoint keeper and
    the metrics log; the trainer holds the state.
    """

    def __init__(self, parts: RunParts, lock: RunLock | None = None, restart: bool = False) -> None:
        """`lock`: the run directory's lock, which rank 0 holds (mtx.train.run_lock), None on the other ranks;
        `restart`: delete the run's checkpoints and log first (--restart)."""
        self.parts, self.recipe, self.cfg, self.ctx = parts, parts.recipe, parts.recipe.train, parts.ctx
        self.lock, self.clock = lock, parts.hooks.clock
        progress = resume_run(parts, restart)
        self.state = TrainState.from_progress(progress, self.ctx.world, self.cfg.update_freq, self.cfg.best_metric)
        reposition_for_this_session(self.state, len(parts.plan.batches), self.cfg.max_tokens, self.ctx.world,
                                    self.cfg.update_freq, parts.log.say)
        self.forward_model = for_training(parts.model, self.cfg.compile, self.ctx)
        parts.log.open_window(progress)
        self.session_start = self.clock()
        self.seconds_before = self.state.train_seconds
        self.last_lr, self.last_grad_norm = 0.0, torch.zeros(())
        self.validated: dict[str, float] | None = None  # the newest validation's scores, stored with its step's save

    # ---- the loop

    def fit(self) -> TrainState:
        """Train until a budget is spent, patience runs out or a signal arrives; always end on a checkpoint.

        Whether there is anything to do at all is decided from the checkpoint's state alone, which every rank
        holds alike: were it decided by each rank's own clock, a run resumed within a moment of train.max_time
        could have one rank return while the others wait for it in their first collective."""
        parts, state = self.parts, self.state
        if (reason := self._budget_spent() or parts.budgets.time_spent(self.seconds_before)) is not None:
            parts.log.say(f"Nothing to do: {reason.describe(self.cfg)} at step {state.step}. Raise it to train "
                          "longer, or pass --restart to start over.")
            return state
        try:
            with parts.signals, parts.log.session(total=self.cfg.max_steps, completed=state.step):
                while True:
                    for batches_done, batches in collated_updates(parts, state.epoch, state.batch_in_epoch):
                        agreed = self._agree_on_the_next_update(batches)
                        if agreed.stop is not None:
                            return self._finish(agreed.stop)
                        if agreed.save_due:
                            self._save()
                        stepped = self._run_update(batches, agreed.n_tokens)
                        state.batch_in_epoch, state.tokens = batches_done, state.tokens + int(agreed.n_tokens)
                        if (stop := self._after_update(stepped)) is not None:
                            return self._finish(stop)
                    state.epoch += 1
                    state.batch_in_epoch = 0
        finally:
            parts.keeper.flush()  # an error, too, ends with the step checkpoint being written in place
            if parts.segmenting is not None:
                parts.segmenting.close()

    def _agree_on_the_next_update(self, batches: list[Batch]) -> Agreement:
        """One all-reduce (on the host) before each update: its target tokens on all ranks, and whether any rank
        was signalled, ran out of time or is due a wall-clock save, so that all ranks stop or save together;
        and whether rank 0's heartbeat found the run's lock taken over, which stops every rank at once."""
        local = [sum(b.n_tgt_tokens for b in batches), self.parts.signals.requested(),
                 self._time_spent() is not None, self.parts.keeper.save_due(),
                 self.lock is not None and self.lock.lost]
        n_tokens, signalled, out_of_time, save_due, lock_lost = distributed.all_reduce_sum(
            torch.tensor(local, dtype=torch.float64)).tolist()
        if lock_lost:
            self._lock_lost()
        stop = None
        if signalled:
            stop = StopReason.SIGNAL
        elif out_of_time:
            stop = StopReason.MAX_TIME
        return Agreement(n_tokens, stop, bool(save_due))

    def _run_update(self, batches: list[Batch], n_tokens: float) -> bool:
        """The update, through the hook that tests observe it by (mtx.train.components.Hooks.around_update)."""
        return self.parts.hooks.around_update(self.state, batches, lambda: self._train_update(batches, n_tokens))

    def _train_update(self, batches: list[Batch], n_tokens: float) -> bool:
        """One optimizer update over this rank's micro-batches; False if the fp16 grad scaler skipped it.

        A skipped update (inf/NaN gradients) is not an update: `step`, and with it the learning rate schedule,
        stays where it was, as fairseq counts updates, and the next batches retry it. The data moves on.
        """
        parts, step = self.parts, self.state.step + 1
        optimizer, scaler = parts.optimizer, parts.precision.scaler
        self.forward_model.train()
        torch.manual_seed(dropout_seed(self.recipe.seed, step, self.ctx.rank))
        lr = learning_rate(self.cfg, self.recipe.model.d_model, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # DDP averages gradients over ranks; multiplying by world / tokens turns that into a per-token mean.
        scale = self.ctx.world / n_tokens
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)  # this update's loss and nll
        for i, batch in enumerate(batches):
            sums += self._forward_backward(batch.to(self.ctx.device), scale, sync=i == len(batches) - 1)
        scaler.unscale_(optimizer)
        max_norm = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        self.last_grad_norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), max_norm)
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if scale_before is not None and scaler.get_scale() < scale_before:
            self.state.skipped_steps += 1
            if scaler.get_scale() < MIN_LOSS_SCALE:
                raise MtxError(f"Training diverged at step {self.state.step}: the fp16 loss scale fell below "
                               f"{MIN_LOSS_SCALE} and the gradients are still inf/NaN. Lower train.lr, raise "
                               "train.warmup or set train.clip_norm (or use bf16), and pass --restart.")
            return False
        parts.log.add(sums, n_tokens)
        self.state.step, self.last_lr = step, lr
        if parts.ema is not None:
            parts.ema.update(step)
        return True

    def _forward_backward(self, batch: Batch, scale: float, sync: bool) -> Tensor:
        """One micro-batch: the loss's gradient, scaled, added to the parameters' (DDP's all-reduce only when
        `sync`); its summed loss and nll, left on the device. Nothing here waits for the device."""
        parts = self.parts
        no_sync = self.forward_model.no_sync() if self.ctx.distributed and not sync else nullcontext()
        with no_sync, parts.precision.autocast():
            loss_sum, nll_sum, _ = parts.hooks.loss(parts.model, batch, self.cfg.label_smoothing,
                                                    run=self.forward_model)
            parts.precision.scaler.scale(loss_sum * scale).backward()
        return torch.stack([loss_sum.detach(), nll_sum]).double()

    def _after_update(self, stepped: bool) -> StopReason | None:
        """Log, validate, save as scheduled after a real update; the reason to stop, if any."""
        state, log = self.state, self.parts.log
        state.train_seconds = self._elapsed()
        if stepped:
            log.show_step(state.step)
            if state.step % self.cfg.log_every == 0:
                log.log_train(state.step, state.epoch, self.last_lr, self.last_grad_norm, state.skipped_steps,
                              state.train_seconds)
            validate = self.parts.validator is not None and state.step % self.cfg.validate_every == 0
            if validate and (interrupted := self._validate()) is not None:
                return interrupted
        reason = self._budget_spent()
        if reason is not None or (stepped and state.step % self.cfg.save_every == 0):
            self._save()
        return reason

    def _validate(self) -> StopReason | None:
        """Valid loss, BLEU and length ratio, logged, with the milestones they reach, and kept for this step's
        checkpoint; best.pt and patience follow train.best_metric (mtx.train.best). A stop signal interrupts it:
        then nothing is recorded and the loop stops, so that the stop does not wait for decoding."""
        parts, state, metric = self.parts, self.state, self.cfg.best_metric
        with nullcontext() if parts.ema is None else parts.ema.in_model():
            scores = parts.validator.run()
        if scores is None:
            return StopReason.SIGNAL
        bleu = scores.bleu
        self.validated = {"step": state.step, "loss": scores.loss, "nll": scores.nll, "bleu": bleu,
                          "length_ratio": scores.length_ratio}
        if improves(bleu, state.best_bleu, "bleu"):
            state.best_bleu = bleu
        if improves(score := metric_value(self.validated, metric), state.best_score, metric):
            state.best_score, state.bad_validations = score, 0
            self._check_lock()
            parts.keeper.save_best(state.step)
        else:
            state.bad_validations += 1
        valid = {"event": "valid", "step": state.step, "valid_loss": scores.loss, "valid_nll": scores.nll,
                 "valid_ppl": math.exp(min(scores.nll, 100.0)), "valid_bleu": bleu,
                 "valid_length_ratio": scores.length_ratio, "best_bleu": state.best_bleu, "tokens": state.tokens,
                 **parts.log.timing(self._elapsed())}
        if scores.pairs:  # a model of several language pairs: each one's BLEU and length ratio
            valid["valid_pairs"] = {pair: {"bleu": pair_bleu, "length_ratio": pair_ratio}
                                    for pair, (pair_bleu, pair_ratio) in scores.pairs.items()}
        parts.log.record(valid)
        for milestone in milestones_reached(self.cfg.bleu_milestones, state.milestones, valid):
            state.milestones.append(milestone)
            parts.log.record(milestone)
        return None

    def _save(self, wait: bool = False) -> None:
        """A step checkpoint of the state and the open loss window, on all ranks at the same update; written in
        the background unless `wait`."""
        self._check_lock()
        progress = {**dataclasses.asdict(self.state), **self.parts.log.carried_over()}
        validated = self.validated if self.validated and self.validated["step"] == self.state.step else None
        self.parts.keeper.save(self.state.step, progress, wait=wait, valid=validated)

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
        """The budgets that every rank sees alike; time, which each rank measures, is agreed on before each
        update (`_agree_on_the_next_update`)."""
        state = self.state
        return self.parts.budgets.spent(state.step, state.epoch, self.parts.plan.epoch_finished(state.batch_in_epoch),
                                        state.bad_validations)

    def _time_spent(self) -> StopReason | None:
        return self.parts.budgets.time_spent(self._elapsed())

    def _finish(self, reason: StopReason) -> TrainState:
        """The stop path, which a pre-emption gives seconds: the step checkpoint first, nothing else before it."""
        state, keeper, log = self.state, self.parts.keeper, self.parts.log
        why = reason.describe(self.cfg, self.parts.signals.received)  # the signal that stopped it, not a later one
        state.train_seconds = self._elapsed()
        if keeper.saved_step != state.step:
            self._save(wait=True)
        keeper.flush()  # the periodic save of this very step may still be writing
        if reason is StopReason.SIGNAL:
            hint = "Run the same command again to resume."
        else:
            hint = "To train on, raise that budget and run the same command again: it resumes from here."
        log.say(f"Training stopped at step {state.step}: {why}. Checkpoint: {keeper.directory / 'last.pt'}. {hint}")
        for line in describe_milestones(self.cfg.bleu_milestones, state.milestones, state.best_bleu):
            log.say(line)
        if reason is not StopReason.SIGNAL and self.ctx.is_main:  # a pre-emption's seconds are the checkpoint's
            choose_at_the_end(self.recipe, self.parts.validator is not None, keeper, self.ctx.device.type, log.say)
        distributed.barrier()  # the other ranks wait here for rank 0's choice of α, within train.dist_timeout
        return state

    def _elapsed(self) -> float:
        """The run's training seconds: those of the sessions before, and this one's so far."""
        return self.seconds_before + self.clock() - self.session_start


def train(recipe: Recipe, restart: bool = False, hooks: Hooks | None = None) -> TrainState:
    """Train `recipe` on its prepared data in this process (one of many under torchrun).

    Rank 0 holds the run directory's lock (mtx.train.run_lock) for the whole run, and tells the other ranks if it
    cannot take it, so that all of them refuse together. `hooks`: what the run takes from outside it
    (mtx.train.components.Hooks); `mtx train` runs with the defaults.
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
            return Trainer(build_run(recipe, ctx, hooks), lock, restart).fit()
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
