#!/usr/bin/env bash
# Sequence-level distillation on the demo grammar, end to end (docs/guides/distillation.md): two teachers (the demo's
# `tiny` model, seeds 1 and 2) translate the 20,000 training sources as an ensemble; the 95% of those translations
# they are surest of train a student (student-tiny: 3 encoder layers, 1 decoder layer), beside the same student
# trained on the original pairs; then each one's test BLEU and chrF, size and sentences/s (greedy and beam 4, on one
# and two threads), as a Markdown table, and the distilled student in int8 and exported to CTranslate2 (when
# mtx[export] is installed).
#
#   bash examples/distillation/run.sh        # from the repository root, with mtx installed; ~30 min on 2 cores
set -euo pipefail
here=examples/distillation
mtx=${MTX:-mtx}
python=${PYTHON:-python3}
corpus=runs/kd-corpus

[ -s "$corpus/train.en" ] || "$python" -m mtx.data.demo "$corpus" --pairs 20000

train() {  # train RECIPE RUN [--set ...]: prepare, train and average one recipe
  local recipe=$1 run=$2
  shift 2
  "$mtx" prepare "$here/$recipe.yaml" "$@"
  "$mtx" train "$here/$recipe.yaml" "$@"
  "$mtx" average --dir "runs/$run/checkpoints" --last 5 -o "runs/$run/average.pt"
}

train teacher kd-teacher1 >&2
train teacher kd-teacher2 --set name=kd-teacher2 --set seed=2 >&2
teachers=(-m runs/kd-teacher1/average.pt -m runs/kd-teacher2/average.pt)
# The costly step at scale: on a real corpus, shard it over processes or GPUs (--shard K/N, resumable).
[ -s "$corpus/train.distilled.de.jsonl" ] ||
  "$mtx" translate "${teachers[@]}" -i "$corpus/train.en" -o "$corpus/train.distilled.de.jsonl" --format jsonl >&2
train student_original kd-student-original >&2
train student_distilled kd-student-distilled >&2

speed() {  # speed BEAM THREADS MODEL-FLAGS...: the sentences/s mtx translate reports on the test sources
  local beam=$1 threads=$2
  shift 2
  "$mtx" translate "$@" -i "$corpus/test.en" -o /dev/null --beam "$beam" --threads "$threads" 2>&1 >/dev/null |
    sed -n 's/.*(\([0-9.,]*\) sentences\/s.*/\1/p' | tail -1
}

# The bytes of models' weights as mtx translate --dtype DTYPE holds them (int8: linear layers packed), saved.
weight_bytes='
import io, sys, torch
from mtx.decode.translator import load_prepared
total = 0
for path in sys.argv[2:]:
    [model], _, _ = load_prepared([path], "cpu", sys.argv[1])
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    total += buffer.tell()
print(total)'

echo "| model | test BLEU | chrF | size (MB) | greedy, 1 / 2 threads (sentences/s) | beam 4, 1 / 2 threads |"
echo "|---|---|---|---|---|---|"
for row in "teachers (ensemble of two tiny):teachers" "student, original pairs:kd-student-original" \
           "student, distilled:kd-student-distilled" "student, distilled, int8:int8"; do
  name=${row#*:}
  case $name in
    teachers) flags=("${teachers[@]}"); out=runs/kd-teacher1/test.ensemble.hyp
              bytes=$("$python" -c "$weight_bytes" fp32 runs/kd-teacher1/average.pt runs/kd-teacher2/average.pt) ;;
    int8) flags=(-m runs/kd-student-distilled/average.pt --dtype int8); out=runs/kd-student-distilled/test.int8.hyp
          bytes=$("$python" -c "$weight_bytes" int8 runs/kd-student-distilled/average.pt) ;;
    *) flags=(-m "runs/$name/average.pt"); out=runs/$name/test.hyp
       bytes=$("$python" -c "$weight_bytes" fp32 "runs/$name/average.pt") ;;
  esac
  "$mtx" translate "${flags[@]}" -i "$corpus/test.en" -o "$out" 2>/dev/null
  scores=$("$mtx" score -r "$corpus/test.de" -i "$out" --metrics bleu,chrf --json |
    "$python" -c 'import json, sys; s = json.load(sys.stdin); print("%.1f | %.1f" % (s["bleu"], s["chrf"]))')
  size=$("$python" -c "print('%.1f' % ($bytes / 1e6))")
  echo "| ${row%%:*} | $scores | $size | $(speed 1 1 "${flags[@]}") / $(speed 1 2 "${flags[@]}") |" \
       "$(speed 4 1 "${flags[@]}") / $(speed 4 2 "${flags[@]}") |"
done

if "$python" -c "import ctranslate2, transformers" 2>/dev/null; then
  "$mtx" export -m runs/kd-student-distilled/average.pt --to ctranslate2 --quantization int8 --force \
    runs/kd-student-distilled/ct2-int8 >&2
  echo
  echo "The distilled student in CTranslate2, int8: runs/kd-student-distilled/ct2-int8 ($(du -sm runs/kd-student-distilled/ct2-int8 | cut -f1) MB)"
fi
