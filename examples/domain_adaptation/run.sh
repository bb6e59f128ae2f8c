#!/usr/bin/env bash
# Domain adaptation on the demo grammar, end to end (docs/guides/fine-tuning.md): a general model, a model of the
# small in-domain corpus alone, the general model fine-tuned on it, and both corpora mixed with the in-domain one
# upsampled; then each model's BLEU on the in-domain test and on the general test, as a Markdown table.
#
#   bash examples/domain_adaptation/run.sh        # from the repository root, with mtx installed; ~20 min on 2 cores
#
# Every run goes to runs/dom-*; run it again and finished steps are skipped (prepare and train resume or do nothing).
set -euo pipefail
here=examples/domain_adaptation
mtx=${MTX:-mtx}

for name in general in_domain mixed fine_tune; do   # fine_tune last: it starts from the general model's average
  "$mtx" prepare "$here/$name.yaml"
  "$mtx" train "$here/$name.yaml"
  run=runs/dom-${name//_/-}
  "$mtx" average --dir "$run/checkpoints" --last 5 -o "$run/average.pt"
done

bleu() {  # bleu MODEL TEST_PREFIX LABEL: the model's BLEU on a test set (its recipe's beam and length penalty)
  "$mtx" translate -m "$1" -i "$2.en" -o "${1%.pt}.$3.hyp" 2>/dev/null
  "$mtx" score -r "$2.de" -i "${1%.pt}.$3.hyp" --json | python3 -c 'import json, sys; print("%.1f" % json.load(sys.stdin)["bleu"])'
}

in_domain=runs/dom-in-domain/data/test   # 500 sentences with numbers, dates or clock times
general=runs/dom-general/data/test       # 500 sentences without
echo "| model | in-domain test BLEU | general test BLEU |"
echo "|---|---|---|"
for row in "general model:general" "in-domain data alone:in-domain" "general, fine-tuned in-domain:fine-tune" \
           "both mixed, in-domain upsampled ×10:mixed"; do
  model=runs/dom-${row#*:}/average.pt
  echo "| ${row%%:*} | $(bleu "$model" "$in_domain" in-domain) | $(bleu "$model" "$general" general) |"
done
