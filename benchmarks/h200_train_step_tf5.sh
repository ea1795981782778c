#!/usr/bin/env bash
# Device-machine driver for benchmarks/train_step.py with the IMAGE's own transformers (5.x),
# i.e. under spec-compat's T1 patches (spec_compat/patches/training/: pretrained_config_annotations.py,
# speculator_config_own_init.py, speculator_config_validate.py, attn_mask_utils_module.py).
# Expects carried wheels for what the image lacks (speculators 0.3.0, loguru, pydantic,
# pydantic_core, annotated_types, typing_inspection) in .whl/ -- but NOT transformers,
# huggingface_hub or tokenizers: the image's are used. Writes under $OUT.
#   benchmarks/h200_train_step_tf5.sh SEQ_LENS [extra train_step.py args]
# 1. installs the wheels into /tmp/site_base;
# 2. in the background: `import spec_compat; import speculators...` (full traceback on failure)
#    and `python -m spec_compat report` / `report --json` -> $OUT/import_check.txt, report.{txt,json};
# 3. runs the benchmark (results -> $OUT/r/results.json, child logs -> $OUT/r/logs.txt).
set -u -o pipefail
SEQS=${1:-4096,2048}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_base \
  $W/speculators-*.whl $W/loguru-*.whl $W/pydantic-*.whl $W/pydantic_core-*.whl \
  $W/annotated_types-*.whl $W/typing_inspection-*.whl || exit 1
export PYTHONPATH=/tmp/site_base:$PWD PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"
(
  timeout 150 python3 -c '
import traceback
try:
    import spec_compat, transformers, huggingface_hub, tokenizers, pydantic
    print("transformers", transformers.__version__, "huggingface_hub", huggingface_hub.__version__,
          "tokenizers", tokenizers.__version__, "pydantic", pydantic.VERSION)
    import speculators, speculators.models.eagle3, speculators.train.trainer
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from importlib.metadata import version; print("speculators", version("speculators"), "import OK")
except BaseException:
    traceback.print_exc()
    print("speculators import FAILED")
import spec_compat
for r in spec_compat.records():
    if "T1" in getattr(r, "fixes", ()) or r.id in ("pretrained-config-annotations", "speculator-config-own-init",
                                                    "speculator-config-validate", "attn-mask-utils-module"):
        print(f"{r.id}: {r.status.value} -- {r.reason}")
' > "$OUT/import_check.txt" 2>&1
  timeout 150 python3 -m spec_compat report > "$OUT/report.txt" 2>&1
  timeout 150 python3 -m spec_compat report --json > "$OUT/report.json" 2>>"$OUT/report.txt"
) &
RP=$!
python3 benchmarks/train_step.py --seq-lens "$SEQS" --work-dir /tmp/ts --out-dir "$OUT/r" \
  --label "transformers from the image (T1 patches)" "$@" 2>&1
rc=$?
wait $RP
echo "===== import_check ====="; cat "$OUT/import_check.txt"
echo "===== report ====="; cat "$OUT/report.txt"
exit $rc
