#!/usr/bin/env bash
# Run a command on a lent GPU machine (no network; what is written under $OUT comes back),
# from the repository root. Not needed on your own GPU: run the command directly.
#
#   bash scripts/device.sh CMD [ARG...]       set up, then run CMD (its exit status)
#   bash scripts/device.sh measure STAGE...   hwmeasure stages, console gets counts only
#
# Set-up: numba-cuda 0.30.4 cannot compile kernels on numpy >= 2.5, so a numpy<2.5 wheel
# carried in .whl/ is installed into /tmp/site and put first on PYTHONPATH, then the
# repository root (without a wheel: the root only, and the machine's numpy must be < 2.5).
# $OUT (default ./out) is created; $OUT/device.txt gets the date, the commit and the GPU.
# Examples:
#   bash scripts/device.sh python3 -m analysis.cli check --quick --json out/check.json
#   bash scripts/device.sh python3 -m analysis.cli bench --decode --out out/decode_bench.jsonl
#   bash scripts/device.sh python3 -m pytest -q -m gpu
#   bash scripts/device.sh measure times:runtime_dev3 counters:levels_dev10:400
#
# measure: each STAGE is KIND:SET[:SECONDS], KIND times (CUPTI kernel times) or counters
# (Nsight Compute), SET a key of analysis.validation_configs.SETS, SECONDS its budget
# (default $BUDGET, 250); rows to $OUT/SET.jsonl, the log to $OUT/SET.log. The console
# gets each stage's exit status, duration and row count, never a measured value: a blind
# set's rows stay unread until its predictions are frozen. A stage cut short by its budget
# resumes when run again on the same file (hwmeasure skips configurations measured).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "device.sh: the wheel in .whl/ did not install"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
{ date -u; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,uuid --format=csv; } \
  > "$OUT/device.txt" 2>&1
[ $# -gt 0 ] || { echo "usage: bash scripts/device.sh CMD [ARG...] | measure KIND:SET[:SECONDS]..."; exit 2; }
if [ "$1" != measure ]; then
  "$@"
  exit $?
fi
shift
[ $# -gt 0 ] || { echo "device.sh measure: give stages KIND:SET[:SECONDS] (KIND times or counters)"; exit 2; }
BUDGET=${BUDGET:-250}
for st in "$@"; do
  kind=${st%%:*}; rest=${st#*:}; set_name=${rest%%:*}
  budget=$BUDGET; [ "$rest" != "$set_name" ] && budget=${rest#*:}
  case $kind in times|counters) ;; *) echo "device.sh measure: stage kind '$kind' is not allowed; allowed: times, counters"; exit 2 ;; esac
  t0=$(date +%s)
  timeout $((budget + 60)) python3 -m analysis.hwmeasure "$kind" --set "$set_name" \
      --budget-s "$budget" --out "$OUT/$set_name.jsonl" > "$OUT/$set_name.log" 2>&1
  rc=$?
  n=$(cat "$OUT/$set_name.jsonl" 2>/dev/null | wc -l)
  echo "$st: rc=$rc $(( $(date +%s) - t0 )) s, $n rows" | tee -a "$OUT/device.txt"
done
