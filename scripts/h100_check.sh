#!/usr/bin/env bash
# One device call: correctness + exact counts (gpu_check), compute-sanitizer memcheck and
# racecheck at a tiny size, the fast-fa2 variants, and the backward check.
# Run on the device machine from the repository root with the numpy<2.5 wheel in .whl/:
#     bash scripts/h100_check.sh            (stages: check sanitize fast backward)
#     STAGES="fast" bash scripts/h100_check.sh
# Other stages: pytest (the tests marked gpu), tc (scripts/fa2_tc_check.py), sanitize_tc
# (compute-sanitizer over fa2_tc_check --quick and tests/test_gpu_launch.py), ncu_tc
# (scripts/ncu_tc_metrics.sh), bench (the fa2 / torch SDPA sweep into $OUT/bench.json).
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
    sanitize_tc) { for tool in memcheck racecheck; do
                  echo "--- compute-sanitizer --tool $tool scripts/fa2_tc_check.py --part check --quick"
                  timeout ${T_SAN:-200} compute-sanitizer --tool $tool --print-limit 20 python3 scripts/fa2_tc_check.py --part check --quick --json tc_sanitize_$tool.json > /tmp/san_tc_$tool.log 2>&1
                  echo "exit status $?"
                  grep -E "SUMMARY|ERROR|^(PASS|FAIL)|hazard|checks passed" /tmp/san_tc_$tool.log | head -40
                done
                # the fast repeat launches (gpu._launch) of every kernel family
                echo "--- compute-sanitizer --tool memcheck pytest tests/test_gpu_launch.py"
                timeout ${T_SAN:-200} compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_launch.py > /tmp/san_launch.log 2>&1
                echo "exit status $?"
                grep -E "SUMMARY|ERROR|passed|failed" /tmp/san_launch.log | head -20; } > /tmp/$s.log 2>&1 ;;
    pytest)   timeout ${T_PYTEST:-300} python3 -m pytest -q -m gpu -p no:cacheprovider tests > /tmp/$s.log 2>&1 ;;
    tc)       timeout ${T_TC:-420} python3 scripts/fa2_tc_check.py > /tmp/$s.log 2>&1 ;;
    ncu_tc)   timeout ${T_NCU:-240} bash scripts/ncu_tc_metrics.sh > /tmp/$s.log 2>&1 ;;
    bench)    timeout ${T_BENCH:-420} python3 -m analysis.cli bench --impls fa2,torch_math,torch_efficient,torch_flash \
                  --budget-s ${BENCH_BUDGET:-380} --out "$OUT/bench.json" > /tmp/$s.log 2>&1 ;;
  esac
  rc=$?
  { echo "===== stage $s: rc=$rc $(( $(date +%s) - t0 )) s"; cat /tmp/$s.log; } >> "$OUT/logs.txt"
  echo "stage $s: rc=$rc $(( $(date +%s) - t0 )) s" >> "$OUT/device.txt"
done
# The device returns at most 8 files: logs.txt, device.txt and each script's JSON.
cat "$OUT/device.txt"; for s in $STAGES; do echo "=== $s (tail)"; tail -n 25 /tmp/$s.log; done
