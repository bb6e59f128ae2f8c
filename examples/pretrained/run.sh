#!/usr/bin/env bash
# Fine-tuning an imported model, measured (docs/guides/pretrained.md): a MarianMT model (a folder, or a hub id with
# the network) is imported with `mtx import`, scored on the real-data corpus's test set (bench/real_corpus.py,
# en-de, 2,000 sentences), fine-tuned on the corpus's training pairs (fine_tune.yaml: train.init_from and
# data.bpe.from the imported checkpoint), averaged over its last 5 checkpoints and scored again; a Markdown table.
#
#   bash examples/pretrained/run.sh Helsinki-NLP/opus-mt-en-de   # a published OPUS-MT model
#   bash examples/pretrained/run.sh runs/real-marian              # one examples/distillation/marian_teacher.py made
#
# From the repository root, with mtx[marian] installed; `--set` flags after the model go to prepare and train
# (e.g. --set train.max_steps=200). Resumable: a step whose output exists is not run again.
set -euo pipefail
model=${1:?usage: $0 FOLDER_OR_HUB_ID [--set KEY=VALUE ...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
mtx=${MTX:-mtx}
python=${PYTHON:-python3}
corpus=runs/real_corpus/en-de run=runs/pretrained-fine-tune imported=runs/pretrained/imported.pt
[ -s "$corpus/train.en" ] || "$python" "$here/../../bench/real_corpus.py" >&2
mkdir -p runs/pretrained
[ -s "$imported" ] || "$mtx" import "$model" -o "$imported" >&2
if [ ! -s "$run/average.pt" ]; then
  "$mtx" prepare "$here/fine_tune.yaml" "$@" >&2
  "$mtx" train "$here/fine_tune.yaml" "$@" >&2
  "$mtx" average --dir "$run/checkpoints" --last 5 -o "$run/average.pt" >&2
fi

bleu() {  # bleu MODEL HYP: the model's test BLEU and chrF, with the search MarianMT's generate uses by default
  # (beam 4 here, fairseq's length penalty |Y|^α at α 1.0)
  "$mtx" translate -m "$1" -i "$corpus/test.en" -o "$2" --beam 4 --lenpen 1.0 --lenpen-style fairseq 2>/dev/null
  "$mtx" score -r "$corpus/test.de" -i "$2" --metrics bleu,chrf --json |
    "$python" -c 'import json, sys; s = json.load(sys.stdin); print("%.1f | %.1f" % (s["bleu"], s["chrf"]))'
}

echo "| model | test BLEU | chrF |"
echo "|---|---|---|"
echo "| imported ($model) | $(bleu "$imported" runs/pretrained/imported.test.hyp) |"
echo "| fine-tuned (fine_tune.yaml) | $(bleu "$run/average.pt" "$run/test.hyp") |"
