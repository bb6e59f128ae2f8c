"""Recipes: YAML in, validated dataclasses out.

Its modules:

    fields    `setting`: a field's default, help and range (`Bounds`), declared once beside it; the checks
              that read them, and `ConfigError`
    data      the `data:` section: the corpora (hf, files, tsv, demo), the filter, the subword vocabulary
    model     the `model:` section: the Transformer's shape and the presets that fill it
    train     the `train:` section: batches, optimiser, schedule, precision, budgets, checkpoints, logs
    decode    the `decode:` section, which is also `mtx translate`'s options and `mtx serve`'s request fields
    recipe    `Recipe`: the sections assembled, the rules between them, the recipe as a mapping
    keys      every key with its type, default, range and help (`mtx config --keys`, the loader's messages)
    loading   a YAML file and `--set` overrides checked and read into a `Recipe`
    run_recipe  a run's recipe as the commands read it: a fine-tuning one takes its parent's model section
    command   `mtx config`, and the recipe arguments `mtx prepare` and `mtx train` share with it
"""
