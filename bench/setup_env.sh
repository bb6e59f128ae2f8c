#!/usr/bin/env bash
# Create .bench-venv, the benchmarks' own environment: mtx (editable) plus its peers, Hugging Face
# `transformers` and `ctranslate2`, which are never mtx dependencies. Idempotent: an existing, complete
# environment is left as it is. Run from the repository root: bash bench/setup_env.sh
set -euo pipefail

VENV=.bench-venv
TORCH=2.13.0              # installed first, alone, so that what comes after keeps it
# Where pip finds torch: by default pip's own configuration (here, a local CPU wheel). On a CPU-only machine that
# would otherwise get PyPI's multi-GB CUDA build, pass BENCH_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TRANSFORMERS=5.24.0       # needs torch>=2.6; tested with the pins below
CTRANSLATE2=4.8.5
SENTENCEPIECE=0.2.3

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import mtx, transformers, ctranslate2" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet ${BENCH_TORCH_INDEX:+--index-url "$BENCH_TORCH_INDEX"} "torch==$TORCH"
"$VENV/bin/pip" install --quiet -e . "transformers==$TRANSFORMERS" "ctranslate2==$CTRANSLATE2" \
    "sentencepiece==$SENTENCEPIECE"
