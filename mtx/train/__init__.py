"""Training: the paper's setup (§5) from one CPU to many GPUs on many nodes.

Its modules:

    command          `mtx train` and `mtx average`
    trainer          `Trainer`: the loop, one update after another, over the parts it is handed; `train`
    components       the run's parts built from its recipe (`build_run`), and the hooks tests replace
    resume           where a run starts: its own newest checkpoint, its parent's, or nothing
    state            `TrainState`, the progress a checkpoint carries, and where a resumed session goes on
    feeding          the epoch's updates, collated ahead of the device by a background thread
    run_data         the prepared data as the trainer takes it: checked against the recipe, cut into batches
    loss             label-smoothed cross-entropy, fused with the output projection
    validation       valid loss and BLEU during training
    stopping         budgets, patience and stop signals: when training stops, and why
    checkpoints      the run's checkpoints/ folder: when to write, which to keep, which to resume from
    best             which checkpoints are best: the validation metric (train.best_metric) and its direction
    average          checkpoints averaged parameter-wise (`mtx average`): the last N, or the best N
    tune_lenpen      the length penalty chosen on the run's valid split and stored in a checkpoint
    ema              the moving average of the weights (train.ema_decay)
    fine_tuning      a run that starts from another run's checkpoint (train.init_from)
    run_lock         one command at a time on a run directory
    distributed      torchrun's environment read, and the few collectives the trainer needs
    metrics_log      metrics.jsonl, the progress bar and TensorBoard
    tensorboard_log  the TensorBoard event files of metrics_log
    milestones       time to BLEU
"""
