"""Training: the paper's setup (§5) from one CPU to many GPUs on many nodes.

    trainer          `Trainer`: the loop, one update after another, and what a resumed run restores
    run_data         the prepared data as the trainer takes it: checked against the recipe, cut into batches
    loss             label-smoothed cross-entropy, fused with the output projection
    validation       valid loss and BLEU during training
    checkpoints      the run's checkpoints/ folder: when to write, which to keep, which to resume from
    ema              the moving average of the weights (train.ema_decay)
    fine_tuning      a run that starts from another run's checkpoint (train.init_from)
    run_lock         one command at a time on a run directory
    distributed      torchrun's environment read, and the few collectives the trainer needs
    metrics_log      metrics.jsonl, the progress bar and TensorBoard (tensorboard_log)
    milestones       time to BLEU
"""
