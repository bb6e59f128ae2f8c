#!/usr/bin/env bash
# Back-translation on the demo grammar, end to end (docs/guides/back-translation.md): a low-resource pair (3,000 parallel
# sentences) with 20,000 monolingual German sentences. The reverse model back-translates them with beam search and
# with sampling; forward models train on the parallel data alone, with beam back-translations, with sampled ones,
# and with tagged beam ones; then each one's test BLEU, as a Markdown table.
#
#   bash examples/back_translation/run.sh        # from the repository root, with mtx installed; ~25 min on 2 cores
set -euo pipefail
here=examples/back_translation
mtx=${MTX:-mtx}
python=${PYTHON:-python3}
corpus=runs/bt-corpus

"$python" -m mtx.data.demo "$corpus" --pairs 3000 --monolingual 20000 --monolingual-seed 2

train() {  # train RECIPE RUN: prepare, train and average one recipe
  "$mtx" prepare "$here/$1.yaml"
  "$mtx" train "$here/$1.yaml"
  "$mtx" average --dir "runs/$2/checkpoints" --last 5 -o "runs/$2/average.pt"
}

train reverse bt-reverse
[ -s "$corpus/mono.beam.en" ] ||
  "$mtx" translate -m runs/bt-reverse/average.pt -i "$corpus/mono.de" -o "$corpus/mono.beam.en"
[ -s "$corpus/mono.sampled.en" ] ||
  "$mtx" translate -m runs/bt-reverse/average.pt -i "$corpus/mono.de" -o "$corpus/mono.sampled.en" --sampling --seed 1

echo "| forward model (en→de) | test BLEU |"
echo "|---|---|"
for row in "parallel only:parallel" "parallel + beam back-translations:beam" \
           "parallel + sampled back-translations:sampled" "parallel + tagged beam back-translations:tagged"; do
  name=${row#*:}
  recipe=$([ "$name" = parallel ] && echo parallel || echo "bt_$name")
  train "$recipe" "bt-$name" >&2
  "$mtx" translate -m "runs/bt-$name/average.pt" -i "$corpus/test.en" -o "runs/bt-$name/test.hyp" 2>/dev/null
  bleu=$("$mtx" score -r "$corpus/test.de" -i "runs/bt-$name/test.hyp" --json |
    python3 -c 'import json, sys; print("%.1f" % json.load(sys.stdin)["bleu"])')
  echo "| ${row%%:*} | $bleu |"
done
