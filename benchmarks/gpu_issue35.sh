#!/usr/bin/env bash
# Device-machine driver for issue #35 (one H100/H200, the workplace's 'cuda' image; carry .whl/).
#   benchmarks/gpu_issue35.sh STAGE...   stages: env proof fp8 rows train workers
# Wheels (python 3.12, x86-64) in .whl/: speculators 0.9.0, hs-connectors 0.9.0, transformers 5.19.0 and
# what the image lacks of speculators' requirements (benchmarks/RESULTS.md, #35, lists them).
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ ! -d /tmp/site/speculators ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S)"
  case $stage in
    env)
      { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        lscpu | grep -E 'Model name|^CPU\(s\)'; echo "amx flags: $(grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
        python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "amx tiles", torch._C._cpu._is_amx_tile_supported())'
        python3 -c 'import speculators, hs_connectors, transformers; from importlib.metadata import version as v; print("speculators", v("speculators"), "hs-connectors", v("hs-connectors"), "transformers", transformers.__version__)'
      } 2>&1 | tee "$OUT/env.txt" ;;
    proof)  # the hardware proof of fused-loss-own-autotune-lists, traced and keyed like any proof run
      python3 -m pytest -p no:cacheprovider -q -rs tests/gpu/test_fused_loss.py --junitxml="$OUT/junit-fused-loss.xml" 2>&1 | tail -15 ;;
    fp8)  # spec-compat's device quantization writes hs-connectors' bytes
      python3 -m pytest -p no:cacheprovider -q -rs tests/gpu/test_fp8_rows_cuda.py tests/unit/test_fp8_rows.py 2>&1 | tail -5 ;;
    rows)
      python3 benchmarks/fp8_rows_gpu.py --json "$OUT/fp8_rows_gpu.json" 2>&1 | tail -12 ;;
    train)
      python3 benchmarks/fp8_train_gpu.py --num-seqs 32 --deadline-s 280 --out "$OUT/fp8_train_gpu.json" 2>&1 | grep -E '^\[spec09|RESULT_JSON|Error|error' | tail -30
      ;;
    workers)  # the loaders alone with 2, 4, 8, 12 workers (no trainer)
      python3 benchmarks/fp8_train_gpu.py --num-seqs 32 --skip-train --loader-rounds 1 --loader-workers 2,8,12 \
        --out "$OUT/fp8_loader_workers.json" 2>&1 | grep -E '^\[spec09|RESULT_JSON|Error|error' | tail -20 ;;
  esac
done
