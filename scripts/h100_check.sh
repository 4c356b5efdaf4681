#!/usr/bin/env bash
# One device call: correctness + exact counts (gpu_check), compute-sanitizer memcheck and
# racecheck at a tiny size, the fast-fa2 variants, and the backward check.
# Run on the device machine from the repository root with the numpy<2.5 wheel in .whl/:
#     bash scripts/h100_check.sh            (stages: check sanitize fast backward)
#     STAGES="fast" bash scripts/h100_check.sh
# Everything lands in $OUT (default ./out); each stage has its own time limit so one
# hang cannot eat the call.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
STAGES=${STAGES:-"check sanitize fast backward"}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; } > "$OUT/device.txt" 2>&1
for s in $STAGES; do
  t0=$(date +%s)
  case $s in
    check)    timeout ${T_CHECK:-240} python3 scripts/gpu_check.py > /tmp/$s.log 2>&1 ;;
    sanitize) { for tool in memcheck racecheck; do
                  echo "--- compute-sanitizer --tool $tool"
                  # NumPy reference (--no-torch): only our kernels run on the GPU
                  timeout ${T_SAN:-120} compute-sanitizer --tool $tool --print-limit 20 python3 scripts/gpu_check.py --quick --no-torch --repeats 0 --out /tmp/san_$tool > /tmp/san_$tool.log 2>&1
                  echo "exit status $?"
                  grep -E "SUMMARY|Error|error|^(fa1|fa2|standard) |configs" /tmp/san_$tool.log | grep -v "PerformanceWarning" | head -40
                done; } > /tmp/$s.log 2>&1 ;;
    fast)     timeout ${T_FAST:-200} python3 scripts/fa2_fast_variants.py > /tmp/$s.log 2>&1 ;;
    backward) timeout ${T_BWD:-150} python3 scripts/gpu_backward_check.py > /tmp/$s.log 2>&1 ;;
  esac
  rc=$?
  { echo "===== stage $s: rc=$rc $(( $(date +%s) - t0 )) s"; cat /tmp/$s.log; } >> "$OUT/logs.txt"
  echo "stage $s: rc=$rc $(( $(date +%s) - t0 )) s" >> "$OUT/device.txt"
done
# The device returns at most 8 files: logs.txt, device.txt and each script's JSON.
cat "$OUT/device.txt"; for s in $STAGES; do echo "=== $s (tail)"; tail -n 25 /tmp/$s.log; done
