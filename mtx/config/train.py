"""The recipe's `train:` section: how `mtx train` trains: batches, the optimiser and its schedule, precision,
budgets, checkpoints and logs. This module imports no torch: `mtx config` and recipe errors must be instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mtx.config.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    RATE,
    Bounds,
    check,
    check_bounds,
    parse_duration,
    setting,
)

BestMetric = Literal["bleu", "nll"]  # what a run is judged by (mtx.train.best: their directions)


@dataclass
class TrainConfig:
    """How `mtx train` trains: batches, the optimiser and its schedule, precision, budgets, checkpoints, logs."""

    max_tokens: int = setting(
        4096, "Padded token slots per GPU per micro-batch: sentences × max(source, target length + 1), as "
        "fairseq counts them.", bounds=AT_LEAST_1)
    update_freq: int = setting(1, "Micro-batches whose gradients are accumulated into one update.", bounds=AT_LEAST_1)
    update_tokens: int | None = setting(
        None, "Padded token slots per update over all GPUs (max_tokens × GPUs × update_freq): with it, each "
        "session cuts its micro-batches (up to max_tokens per GPU) and sets update_freq from its number of "
        "processes, fewest micro-batches first, so a recipe makes the same updates on 1 GPU or 8. null: "
        "max_tokens and update_freq as given.", bounds=AT_LEAST_1)
    lr_schedule: Literal["inverse_sqrt", "noam"] = setting(
        "inverse_sqrt", "noam: the paper's d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), lr a scale factor; "
        "inverse_sqrt: fairseq's linear warmup to lr, then ∝ 1/√step.")
    lr: float = setting(7.0e-4, "The peak learning rate for inverse_sqrt; a scale factor for noam (the paper: 1).",
                        bounds=POSITIVE)
    warmup: int = setting(4000, "Warmup updates.", bounds=AT_LEAST_0)
    betas: list[float] = setting(help="Adam's β1 and β2 (the paper: 0.9, 0.98).", factory=lambda: [0.9, 0.98])
    eps: float = setting(1.0e-9, "Adam's ε, added to the denominator.", bounds=POSITIVE)
    weight_decay: float = setting(0.0, "Decoupled weight decay (AdamW); the paper has none.", bounds=AT_LEAST_0)
    label_smoothing: float = setting(0.1, "ε_ls of the label-smoothed cross-entropy (§5.4).", bounds=RATE)
    clip_norm: float = setting(0.0, "Clip the gradients' global norm to this; 0 disables clipping.",
                               bounds=Bounds(0, note="0 disables it"))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = setting(
        "auto", "auto: bf16 autocast on GPUs that have it, fp16 with a gradient scaler on older ones, fp32 on CPU.")
    compile: bool = setting(
        False, "torch.compile the model, with dynamic shapes (one graph for every batch shape, one more for "
        "batches whose sources are not padded).")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto: this rank's GPU if there is one, else the CPU.")
    max_steps: int = setting(100_000, "Stop after this many updates.", bounds=AT_LEAST_1)
    max_epochs: int | None = setting(None, "Stop after this many passes over the training data.", bounds=AT_LEAST_1)
    max_time: str | None = setting(
        None, "Stop after this much training time, summed over resumes: \"12h\", \"90m\", \"3600s\".")
    save_every: int = setting(1000, "Write a step checkpoint every this many updates.", bounds=AT_LEAST_1)
    save_every_minutes: float | None = setting(
        None, "Also write one when this many minutes have passed since the last (the paper: every 10 minutes).",
        bounds=POSITIVE)
    keep_last: int = setting(5, "Step checkpoints kept, the newest, whose average `mtx average --dir` tries (the "
                             "paper's 5 where all are kept); 0 keeps all.", bounds=Bounds(0, note="0 keeps all"))
    keep_best: int = setting(
        5, "Step checkpoints also kept for their validation: the best N by train.best_metric, beside the keep_last "
        "newest, whose average `mtx average --dir` tries. Only a checkpoint written at a validated step has a "
        "score (save_every a multiple of validate_every).", bounds=Bounds(0, note="0 keeps none for their score"))
    best_metric: BestMetric = setting(
        "nll", "The validation score that picks best.pt, counts train.patience, and ranks the checkpoints that "
        "train.keep_best keeps and `mtx average --best` averages: nll (the references' per-token negative "
        "log-likelihood over the whole valid split, lower is better; fairseq's default) or bleu (the valid "
        "decode's, higher is better).")
    validate_every: int = setting(1000, "Compute the valid loss and BLEU every this many updates.", bounds=AT_LEAST_1)
    valid_beam: int = setting(1, "Beam of the validation's decoding; 1 is greedy.", bounds=AT_LEAST_1)
    valid_max_sentences: int | None = setting(None, "Decode only N valid sentences for BLEU, spread evenly over "
                                              "the valid set (over each language pair's, for a model of several).",
                                              bounds=AT_LEAST_1)
    patience: int | None = setting(None, "Stop after this many validations without a better train.best_metric.",
                                   bounds=AT_LEAST_1)
    tune_lenpen: bool | None = setting(
        None, "Choose decode.lenpen's α on the valid split, for the checkpoint that training ends on and in `mtx "
        "average`, and store it there (what `mtx average --tune-lenpen` does). null: yes, unless the recipe gives "
        "decode.lenpen itself (a pinned α, such as the paper's 0.6, is kept).")
    log_every: int = setting(100, "Log the training loss, learning rate and speed every this many updates.",
                             bounds=AT_LEAST_1)
    bleu_milestones: list[float] = setting(
        help="Valid BLEU levels whose first reaching is logged as a milestone (time to BLEU), e.g. [20, 25, 27].",
        factory=list)
    tensorboard: bool = setting(
        False, "Also write TensorBoard event files to runs/<name>/tensorboard/ (needs mtx[tensorboard]).")
    dist_timeout: str = setting(
        "30m", "How long ranks wait for one another (for rank 0's checkpoint write, say) before giving up.")
    init_from: str | None = setting(
        None, "Fine-tune: start a new run from this checkpoint's weights (its EMA weights if it has them). The "
        "model section must match it, or is taken from it when the recipe has none; the data must be encoded "
        "with its tokenizer (data.bpe.from). A run that has checkpoints of its own resumes from them instead.")
    init_from_state: bool = setting(
        False, "With init_from: also continue its optimizer, schedule, step and data position (it must be a "
        "step checkpoint that holds training state); false starts them fresh.")
    bpe_dropout: float = setting(
        0.0, "BPE-dropout (Provilkov et al. 2020): each epoch, training sentences are segmented anew with each "
        "merge dropped at this rate, reproducibly from (seed, epoch, pair); valid, test and translation never "
        "drop. 0: off; 0.1 is the paper's. Needs a BPE vocabulary.",
        bounds=Bounds(0, 1, high_open=True, note="the rate at which merges are dropped; 0: off, 0.1 is the paper's"))
    bpe_dropout_workers: int = setting(
        0, "Processes that segment training batches for BPE-dropout, for a GPU that one core cannot keep fed "
        "(bench/README.md: what one core segments per second); 0: the thread that collates batches does it.",
        bounds=Bounds(0, note="0: the collation thread segments"))
    ema_decay: float | None = setting(
        None, "Keep an exponential moving average of the weights with this decay (e.g. 0.9999), which "
        "validation, best.pt, mtx average, translate and export then use; null: none. The decay of update t "
        "is min(ema_decay, (1 + t) / (10 + t)), so that early weights fade in short runs.",
        bounds=Bounds(0, 1, low_open=True, high_open=True, note="e.g. 0.9999, or null: no moving average"))

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.update_tokens is None or self.update_freq == 1, f"{key}.update_freq", self.update_freq,
               "must be left at 1 with train.update_tokens, which sets it from the number of processes")
        check(self.lr_schedule != "noam" or self.warmup >= 1, f"{key}.warmup", self.warmup,
               "must be at least 1 for the noam schedule")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{key}.betas", self.betas,
               "must be two numbers in [0, 1)")
        levels = self.bleu_milestones
        check(all(0 < level <= 100 for level in levels) and levels == sorted(set(levels)), f"{key}.bleu_milestones",
               levels, "must be BLEU levels in (0, 100], ascending without repeats, e.g. [20, 25, 27]")
        if self.max_time is not None:
            parse_duration(self.max_time, f"{key}.max_time")
        check(parse_duration(self.dist_timeout, f"{key}.dist_timeout") > 0, f"{key}.dist_timeout",
               self.dist_timeout, "must be a positive duration")
        check(self.init_from is not None or not self.init_from_state, f"{key}.init_from_state",
               self.init_from_state, "applies only with train.init_from")
