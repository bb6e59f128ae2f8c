#!/usr/bin/env bash
# Sequence-level distillation, end to end (docs/guides/distillation.md): teachers translate the training sources with
# `--format jsonl`; the 95% of those translations they are surest of train a student (student-tiny: 3 encoder layers,
# 1 decoder layer, mtx's own vocabulary), beside the same student trained on the original pairs; then each one's
# test BLEU and chrF, size and sentences/s (greedy and beam 4, on one and two threads), as a Markdown table, and the
# distilled student in int8 and exported to CTranslate2 (when mtx[export] is installed).
#
#   bash examples/distillation/run.sh        # the demo grammar: 20,000 pairs, two `tiny` teachers (seeds 1 and 2)
#                                            # as an ensemble (~30 min on 2 cores)
#   bash examples/distillation/run.sh real   # the real-data corpus (bench/real_corpus.py), en-de, 169,910 pairs:
#                                            # `tiny` teachers of 2,000 updates, recipes in real/ (~2 h on 2 cores)
#   bash examples/distillation/run.sh imported [FOLDER_OR_HUB_ID]
#                                            # the demo grammar, one teacher brought in by `mtx import`: a MarianMT
#                                            # folder or a hub id (Helsinki-NLP/opus-mt-en-de, with the network); by
#                                            # default the OPUS-MT-like model marian_teacher.py trains (~1 h on 2 cores)
#   bash examples/distillation/run.sh smoke            # `demo` and `imported` in miniature, in runs/smoke/: 1,000
#   bash examples/distillation/run.sh imported-smoke   # pairs, 25 updates, speeds and exports left out (what CI runs)
#
# From the folder to work in (runs/ is made there), with mtx installed. Resumable: a step whose output exists is not
# run again, so a rerun only measures.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
variant=${1:-demo}
mtx=${MTX:-mtx}
python=${PYTHON:-python3}
# Every model of a variant translates with the same search, whatever its recipe's decode section says: beam 4 and
# fairseq's length penalty |Y|^α, α 1.0 (mtx's default, and transformers' generate's for MarianMT) on the demo, 1.5
# on the real-data corpus, whose teachers translate 0.79 of the references' length with α 1.0 and 0.96 with 1.5
# (docs/benchmarks/defaults.md).
recipes=$here corpus=runs/kd-corpus run=kd alpha=1.0 pairs=(--pairs 20000) sizes=() smoke=
# The imported variant's default teacher: marian_teacher.py's OPUS-MT shape at 3 + 3 layers, width 256, for the
# 983 updates of 2,048 tokens that 32 minutes gave it on 2 shared cores (examples/distillation/README.md).
marian_sizes=(--spm-size 4000 --lr 1e-3 --warmup 200 --max-steps 983)
case $variant in
  demo|imported) ;;
  smoke|imported-smoke)
    mkdir -p runs/smoke && cd runs/smoke
    smoke=1 pairs=(--pairs 1000 --valid 50 --test 50)
    sizes=(--set data.bpe.vocab_size=500 --set model.d_model=64 --set model.d_ff=128 --set train.max_tokens=1024
           --set train.max_steps=25 --set train.warmup=10 --set train.save_every=5 --set train.validate_every=25
           --set train.valid_max_sentences=20 --set train.log_every=5)
    marian_sizes=(--spm-size 300 --d-model 32 --d-ff 64 --heads 2 --layers-enc 1 --layers-dec 1 --lr 3e-3
                  --warmup 10 --max-steps 60 --log-every 20) ;;
  real) recipes=$here/real corpus=runs/real_corpus/en-de run=kd-real alpha=1.5
        [ -s "$corpus/train.en" ] || "$python" "$repo/bench/real_corpus.py" >&2 ;;
  *) echo "usage: $0 [demo|real|imported [FOLDER_OR_HUB_ID]|smoke|imported-smoke]" >&2; exit 2 ;;
esac
[ -s "$corpus/train.en" ] || "$python" -m mtx.data.demo "$corpus" "${pairs[@]}" >&2
search=(--beam 4 --lenpen "$alpha" --lenpen-style fairseq)

train() {  # train RECIPE RUN [--set ...]: prepare, train and average one recipe, unless its average exists
  local recipe=$1 run=$2
  shift 2
  [ -s "runs/$run/average.pt" ] && return
  "$mtx" prepare "$recipes/$recipe.yaml" "$@" ${sizes[@]+"${sizes[@]}"}
  "$mtx" train "$recipes/$recipe.yaml" "$@" ${sizes[@]+"${sizes[@]}"}
  "$mtx" average --dir "runs/$run/checkpoints" --last 5 -o "runs/$run/average.pt"
}

case $variant in
  imported*)
    # One teacher: a published MarianMT model made an mtx checkpoint. Without an argument, the OPUS-MT-like one
    # marian_teacher.py trains on the training pairs, with no mtx code, stands in for a downloaded one.
    marian=${2:-runs/$run-marian}
    if [ -z "${2:-}" ] && [ ! -s "$marian/config.json" ]; then
      "$python" "$here/marian_teacher.py" --train "$corpus/train.en" "$corpus/train.de" \
        --valid "$corpus/valid.en" "$corpus/valid.de" --out "$marian" "${marian_sizes[@]}" >&2
    fi
    # What follows from it (the distilled corpus, the student) is that teacher's: another one needs them deleted.
    if [ -s "runs/$run-imported.source" ] && [ "$(cat "runs/$run-imported.source")" != "$marian" ]; then
      echo "runs/$run-imported.pt was imported from $(cat "runs/$run-imported.source"), not $marian: delete" \
           "runs/$run-imported*, $corpus/train.imported.de.jsonl* and runs/$run-imported-student to change teacher." >&2
      exit 1
    fi
    [ -s "runs/$run-imported.pt" ] || "$mtx" import "$marian" -o "runs/$run-imported.pt" >&2
    echo "$marian" > "runs/$run-imported.source"
    teacher_models=("runs/$run-imported.pt") teacher_label="teacher (imported MarianMT)"
    teacher_hyp=runs/$run-imported.test.hyp
    distilled=$corpus/train.imported.de.jsonl student_recipe=student_imported student=$run-imported-student ;;
  *)
    train teacher $run-teacher1 >&2
    train teacher $run-teacher2 --set name=$run-teacher2 --set seed=2 >&2
    teacher_models=("runs/$run-teacher1/average.pt" "runs/$run-teacher2/average.pt")
    teacher_label="teachers (ensemble of two tiny)" teacher_hyp=runs/$run-teacher1/test.ensemble.hyp
    distilled=$corpus/train.distilled.de.jsonl student_recipe=student_distilled student=$run-student-distilled ;;
esac
teachers=()
for model in "${teacher_models[@]}"; do teachers+=(-m "$model"); done
# The costly step at scale: shard it over processes or GPUs (--shard K/N). One shard of one here, which makes it
# resumable: an interrupted run goes on from its last complete line, a finished one is skipped.
"$mtx" translate "${teachers[@]}" "${search[@]}" -i "$corpus/train.en" -o "$distilled" --format jsonl --shard 1/1 >&2
train student_original $run-student-original >&2
train $student_recipe $student >&2

speed() {  # speed BEAM THREADS MODEL-FLAGS...: the sentences/s mtx translate reports on the test sources (its
  # --beam comes after the search's, and the last one given counts); a dash in the smoke forms, which time nothing
  local beam=$1 threads=$2
  shift 2
  [ -n "$smoke" ] && { echo -; return; }
  "$mtx" translate "$@" "${search[@]}" -i "$corpus/test.en" -o /dev/null --beam "$beam" --threads "$threads" 2>&1 >/dev/null |
    sed -n 's/.*(\([0-9.,]*\) sentences\/s.*/\1/p' | tail -1
}

# The megabytes of models' weights as mtx translate --dtype DTYPE holds them (int8: linear layers packed), saved: a
# line for each argument DTYPE:MODEL[,MODEL...] (one process for all, which loads torch once).
weight_megabytes='
import io, sys, torch
from mtx.decode.translator import load_prepared
for group in sys.argv[1:]:
    dtype, paths = group.split(":", 1)
    total = 0
    for path in paths.split(","):
        [model], _, _ = load_prepared([path], "cpu", dtype)
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        total += buffer.tell()
    print("%.1f" % (total / 1e6))'
mapfile -t megabytes < <("$python" -c "$weight_megabytes" "fp32:$(IFS=,; echo "${teacher_models[*]}")" \
  "fp32:runs/$run-student-original/average.pt" "fp32:runs/$student/average.pt" "int8:runs/$student/average.pt")

echo "| model | test BLEU | chrF | size (MB) | greedy, 1 / 2 threads (sentences/s) | beam 4, 1 / 2 threads |"
echo "|---|---|---|---|---|---|"
rows=("$teacher_label" "student, original pairs" "student, distilled" "student, distilled, int8"
      "student, distilled, int8, shortlist of 20")
for i in "${!rows[@]}"; do
  case $i in
    0) flags=("${teachers[@]}"); out=$teacher_hyp size=${megabytes[0]} ;;
    1) flags=(-m runs/$run-student-original/average.pt); out=runs/$run-student-original/test.hyp size=${megabytes[1]} ;;
    2) flags=(-m runs/$student/average.pt); out=runs/$student/test.hyp size=${megabytes[2]} ;;
    3) flags=(-m runs/$student/average.pt --dtype int8); out=runs/$student/test.int8.hyp size=${megabytes[3]} ;;
    4) flags=(-m runs/$student/average.pt --dtype int8 --shortlist 20); out=runs/$student/test.int8.shortlist.hyp
       size=${megabytes[3]} ;;
  esac
  "$mtx" translate "${flags[@]}" "${search[@]}" -i "$corpus/test.en" -o "$out" 2>/dev/null
  scores=$("$mtx" score -r "$corpus/test.de" -i "$out" --metrics bleu,chrf --json |
    "$python" -c 'import json, sys; s = json.load(sys.stdin); print("%.1f | %.1f" % (s["bleu"], s["chrf"]))')
  echo "| ${rows[$i]} | $scores | $size | $(speed 1 1 "${flags[@]}") / $(speed 1 2 "${flags[@]}") |" \
       "$(speed 4 1 "${flags[@]}") / $(speed 4 2 "${flags[@]}") |"
done

if [ -z "$smoke" ] && "$python" -c "import ctranslate2, transformers" 2>/dev/null; then
  # The exports decode as mtx does: greedy tokens of the whole test set from CTranslate2 and transformers against
  # mtx's own (export.*.greedy_identical lines), then CTranslate2's speed and BLEU beside mtx's, fp32 and int8.
  "$python" "$repo/bench/export.py" --model runs/$student/average.pt --data "$corpus" --repeats 3 |
    grep -E 'greedy_identical|sentences_per_s'
  "$mtx" export -m runs/$student/average.pt --to ctranslate2 --quantization int8 --force runs/$student/ct2-int8 >&2
  echo
  echo "The distilled student in CTranslate2, int8: runs/$student/ct2-int8 ($(du -sm runs/$student/ct2-int8 | cut -f1) MB)"
fi
