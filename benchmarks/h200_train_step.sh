#!/usr/bin/env bash
# Device-machine driver for benchmarks/train_step.py (one H200, the workplace's 'cuda' image).
# Expects wheels in .whl/ (carried; see benchmarks/RESULTS.md for the list) and writes under $OUT.
#   benchmarks/h200_train_step.sh SEQ_LENS [extra train_step.py args]
# 1. installs speculators 0.3.0 + its missing deps into /tmp/site_base, and transformers 4.57.6 /
#    huggingface_hub 0.36.2 / tokenizers 0.22.2 into /tmp/site_tf (the image has transformers 5.x);
# 2. records whether speculators 0.3.0 imports with the image's own transformers (catalog T1);
# 3. runs the benchmark with transformers 4.57.6.
set -u -o pipefail
SEQS=${1:-2048,4096}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=.whl
if [ ! -d /tmp/site_tf/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_base \
    $W/speculators-*.whl $W/loguru-*.whl $W/pydantic-*.whl $W/pydantic_core-*.whl \
    $W/annotated_types-*.whl $W/typing_inspection-*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_tf \
    $W/transformers-*.whl $W/huggingface_hub-*.whl $W/tokenizers-*.whl || exit 1
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "== speculators 0.3.0 with the image's transformers =="
  PYTHONPATH=/tmp/site_base:$PWD timeout 120 python3 -c '
import spec_compat, transformers, huggingface_hub
print("transformers", transformers.__version__, "huggingface_hub", huggingface_hub.__version__)
import speculators.models.eagle3, speculators.train.trainer
print("speculators import OK")' 2>&1 | tail -4
} 2>&1 | tee -a "$OUT/env.txt"
export PYTHONPATH=/tmp/site_tf:/tmp/site_base PYTHONUNBUFFERED=1
python3 benchmarks/train_step.py --seq-lens "$SEQS" --work-dir /tmp/ts --out-dir "$OUT/r" \
  --label "transformers 4.57.6" "$@" 2>&1 | tee -a "$OUT/run.txt"
