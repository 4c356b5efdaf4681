#!/usr/bin/env bash
# ONE-OFF driver for the lent H100 (a machine without network access, reached through a
# device tool that returns what is written under $OUT). Not needed on your own GPU: there,
# run `flashsim check`, `flashsim check --sanitizer memcheck|racecheck`, `flashsim check
# --ncu` and `flashsim bench` directly.
#
# Run from the repository root with a numpy<2.5 wheel in .whl/ (numba-cuda 0.30.4 cannot
# compile kernels on numpy >= 2.5):
#     bash scripts/h100_check.sh            (stages: check sanitize backward)
#     STAGES="pytest tc ncu" bash scripts/h100_check.sh
# Stages: check (flashsim check: every suite, full sizes), quick (flashsim check --quick),
# tc / backward (one suite), sanitize (memcheck and racecheck over the quick checks;
# memcheck / racecheck: one tool, a longer limit),
# ncu (flashsim check --ncu), ncu_tc (scripts/ncu_tc_metrics.sh), pytest (the tests
# marked gpu; PYTEST_FILES narrows them, xdist spreads them over PYTEST_WORKERS), matrix
# (flashsim check --suite variants in MATRIX_SHARDS processes, merged), fast (scripts/fa2_fast_variants.py), bench (the sweep: fa2 call and kernel
# alone, fa1, standard, torch SDPA; BENCH_IMPLS narrows it), call (scripts/call_overhead.py:
# gpu.attention's per-call host time against its kernel and torch SDPA).
# Everything lands in $OUT (default ./out); each stage has its own time limit so one hang
# cannot eat the call.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
. scripts/_wheel_env.sh || exit 1   # numpy<2.5 from .whl/ (see there)
FS="python3 -m analysis.cli"
STAGES=${STAGES:-"check sanitize backward"}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; } > "$OUT/device.txt" 2>&1
for s in $STAGES; do
  t0=$(date +%s)
  case $s in
    check)    timeout ${T_CHECK:-420} $FS check --suite forward,tc --json "$OUT/check.json" > /tmp/$s.log 2>&1 ;;
    quick)    timeout ${T_CHECK:-240} $FS check --quick --json "$OUT/check_quick.json" > /tmp/$s.log 2>&1 ;;
    tc)       timeout ${T_TC:-300} $FS check --suite tc --json "$OUT/check_tc.json" > /tmp/$s.log 2>&1 ;;
    backward) timeout ${T_BWD:-200} $FS check --suite backward --json "$OUT/check_backward.json" > /tmp/$s.log 2>&1 ;;
    sanitize) { for tool in memcheck racecheck; do
                  timeout ${T_SAN:-280} $FS check --sanitizer $tool --json "$OUT/sanitize_$tool.json"
                  echo "exit status $?"
                done; } > /tmp/$s.log 2>&1 ;;
    memcheck|racecheck)
              timeout ${T_SAN:-540} $FS check --sanitizer $s --json "$OUT/sanitize_$s.json" > /tmp/$s.log 2>&1 ;;
    ncu)      timeout ${T_NCU:-300} $FS check --ncu --json "$OUT/ncu/ncu.json" > /tmp/$s.log 2>&1 ;;
    ncu_tc)   timeout ${T_NCU:-240} bash scripts/ncu_tc_metrics.sh > /tmp/$s.log 2>&1 ;;
    pytest)   # compilation dominates: spread the tests over the host's cores where pytest-xdist is there
              XD=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${PYTEST_WORKERS:-12}")
              timeout ${T_PYTEST:-300} python3 -m pytest -q -m gpu -p no:cacheprovider $XD \
                  --junitxml="$OUT/gpu_tests.xml" ${PYTEST_FILES:-tests} > /tmp/$s.log 2>&1 ;;
    matrix)   # flashsim check --suite variants (the flash-attn matrix), MATRIX_SHARDS processes
              mkdir -p "$OUT/matrix"; NS=${MATRIX_SHARDS:-12}
              for i in $(seq 0 $((NS - 1))); do
                OMP_NUM_THREADS=1 FLASHSIM_PROGRESS=0 timeout ${T_MATRIX:-420} $FS check --suite variants \
                    ${MATRIX_QUICK:+--quick} --shard $i/$NS --json "$OUT/matrix/s$i.json" > "$OUT/matrix/s$i.log" 2>&1 &
              done; wait
              $FS check --merge "$(ls "$OUT"/matrix/s*.json | paste -sd, -)" --json "$OUT/matrix/variants.json" > /tmp/$s.log 2>&1 ;;
    fast)     timeout ${T_FAST:-200} python3 scripts/fa2_fast_variants.py > /tmp/$s.log 2>&1 ;;
    bench)    timeout ${T_BENCH:-420} $FS bench --impls ${BENCH_IMPLS:-fa2,fa2_kernel,fa1,standard,torch_math,torch_efficient,torch_flash} \
                  --budget-s ${BENCH_BUDGET:-380} --out "$OUT/bench.json" > /tmp/$s.log 2>&1 ;;
    call)     timeout ${T_CALL:-240} python3 scripts/call_overhead.py --out "$OUT/call_overhead.jsonl" > /tmp/$s.log 2>&1 ;;
  esac
  rc=$?
  { echo "===== stage $s: rc=$rc $(( $(date +%s) - t0 )) s"; cat /tmp/$s.log; } >> "$OUT/logs.txt"
  echo "stage $s: rc=$rc $(( $(date +%s) - t0 )) s" >> "$OUT/device.txt"
done
cat "$OUT/device.txt"; for s in $STAGES; do echo "=== $s (tail)"; tail -n 25 /tmp/$s.log; done
# PACK=1: everything under $OUT in one archive (the device tool returns a few files only)
if [ -n "${PACK:-}" ]; then
  tar czf /tmp/out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/out.tgz "$OUT/out.tgz"
fi
