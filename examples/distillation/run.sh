#!/usr/bin/env bash
# Sequence-level distillation, end to end (docs/guides/distillation.md): two teachers (seeds 1 and 2) translate the
# training sources as an ensemble; the 95% of those translations they are surest of train a student (student-tiny:
# 3 encoder layers, 1 decoder layer), beside the same student trained on the original pairs; then each one's test
# BLEU and chrF, size and sentences/s (greedy and beam 4, on one and two threads), as a Markdown table, and the
# distilled student in int8 and exported to CTranslate2 (when mtx[export] is installed).
#
#   bash examples/distillation/run.sh        # the demo grammar: 20,000 pairs, `tiny` teachers (~30 min on 2 cores)
#   bash examples/distillation/run.sh real   # the real-data corpus (bench/real_corpus.py), en-de, 169,910 pairs:
#                                            # `tiny` teachers of 2,000 updates, recipes in real/ (~2 h on 2 cores)
#
# From the repository root, with mtx installed. Resumable: a step whose output exists is not run again, so a rerun
# only measures.
set -euo pipefail
variant=${1:-demo}
mtx=${MTX:-mtx}
python=${PYTHON:-python3}
# Every model of a variant translates with the same search, whatever its recipe's decode section says: beam 4 and
# fairseq's length penalty |Y|^α, α 1.0 (mtx's default) on the demo, 1.5 on the real-data corpus, whose teachers
# translate 0.79 of the references' length with α 1.0 and 0.96 with 1.5 (docs/benchmarks/defaults.md).
case $variant in
  demo) here=examples/distillation; corpus=runs/kd-corpus; run=kd; alpha=1.0
        [ -s "$corpus/train.en" ] || "$python" -m mtx.data.demo "$corpus" --pairs 20000 ;;
  real) here=examples/distillation/real; corpus=runs/real_corpus/en-de; run=kd-real; alpha=1.5
        [ -s "$corpus/train.en" ] || "$python" bench/real_corpus.py >&2 ;;
  *) echo "usage: $0 [demo|real]" >&2; exit 2 ;;
esac
search=(--beam 4 --lenpen "$alpha" --lenpen-style fairseq)

train() {  # train RECIPE RUN [--set ...]: prepare, train and average one recipe, unless its average exists
  local recipe=$1 run=$2
  shift 2
  [ -s "runs/$run/average.pt" ] && return
  "$mtx" prepare "$here/$recipe.yaml" "$@"
  "$mtx" train "$here/$recipe.yaml" "$@"
  "$mtx" average --dir "runs/$run/checkpoints" --last 5 -o "runs/$run/average.pt"
}

train teacher $run-teacher1 >&2
train teacher $run-teacher2 --set name=$run-teacher2 --set seed=2 >&2
teachers=(-m runs/$run-teacher1/average.pt -m runs/$run-teacher2/average.pt)
# The costly step at scale: shard it over processes or GPUs (--shard K/N). One shard of one here, which makes it
# resumable: an interrupted run goes on from its last complete line, a finished one is skipped.
"$mtx" translate "${teachers[@]}" "${search[@]}" -i "$corpus/train.en" -o "$corpus/train.distilled.de.jsonl" \
  --format jsonl --shard 1/1 >&2
train student_original $run-student-original >&2
train student_distilled $run-student-distilled >&2

speed() {  # speed BEAM THREADS MODEL-FLAGS...: the sentences/s mtx translate reports on the test sources (its
  # --beam comes after the search's, and the last one given counts)
  local beam=$1 threads=$2
  shift 2
  "$mtx" translate "$@" "${search[@]}" -i "$corpus/test.en" -o /dev/null --beam "$beam" --threads "$threads" 2>&1 >/dev/null |
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
for row in "teachers (ensemble of two tiny):teachers" "student, original pairs:$run-student-original" \
           "student, distilled:$run-student-distilled" "student, distilled, int8:int8" \
           "student, distilled, int8, shortlist of 20:shortlist"; do
  name=${row#*:}
  case $name in
    teachers) flags=("${teachers[@]}"); out=runs/$run-teacher1/test.ensemble.hyp
              bytes=$("$python" -c "$weight_bytes" fp32 runs/$run-teacher1/average.pt runs/$run-teacher2/average.pt) ;;
    int8) flags=(-m runs/$run-student-distilled/average.pt --dtype int8); out=runs/$run-student-distilled/test.int8.hyp
          bytes=$("$python" -c "$weight_bytes" int8 runs/$run-student-distilled/average.pt) ;;
    shortlist) flags=(-m runs/$run-student-distilled/average.pt --dtype int8 --shortlist 20)
               out=runs/$run-student-distilled/test.int8.shortlist.hyp
               bytes=$("$python" -c "$weight_bytes" int8 runs/$run-student-distilled/average.pt) ;;
    *) flags=(-m "runs/$name/average.pt"); out=runs/$name/test.hyp
       bytes=$("$python" -c "$weight_bytes" fp32 "runs/$name/average.pt") ;;
  esac
  "$mtx" translate "${flags[@]}" "${search[@]}" -i "$corpus/test.en" -o "$out" 2>/dev/null
  scores=$("$mtx" score -r "$corpus/test.de" -i "$out" --metrics bleu,chrf --json |
    "$python" -c 'import json, sys; s = json.load(sys.stdin); print("%.1f | %.1f" % (s["bleu"], s["chrf"]))')
  size=$("$python" -c "print('%.1f' % ($bytes / 1e6))")
  echo "| ${row%%:*} | $scores | $size | $(speed 1 1 "${flags[@]}") / $(speed 1 2 "${flags[@]}") |" \
       "$(speed 4 1 "${flags[@]}") / $(speed 4 2 "${flags[@]}") |"
done

if "$python" -c "import ctranslate2, transformers" 2>/dev/null; then
  # The exports decode as mtx does: greedy tokens of the whole test set from CTranslate2 and transformers against
  # mtx's own (export.*.greedy_identical lines), then CTranslate2's speed and BLEU beside mtx's, fp32 and int8.
  "$python" bench/export.py --model runs/$run-student-distilled/average.pt --data "$corpus" --repeats 3 |
    grep -E 'greedy_identical|sentences_per_s'
  "$mtx" export -m runs/$run-student-distilled/average.pt --to ctranslate2 --quantization int8 --force \
    runs/$run-student-distilled/ct2-int8 >&2
  echo
  echo "The distilled student in CTranslate2, int8: runs/$run-student-distilled/ct2-int8 ($(du -sm runs/$run-student-distilled/ct2-int8 | cut -f1) MB)"
fi
