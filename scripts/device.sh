#!/usr/bin/env bash
# Run a command on a lent GPU machine (no network; what is written under $OUT comes back),
# from the repository root. Not needed on your own GPU: run the command directly.
#
#   bash scripts/device.sh CMD [ARG...]       set up, then run CMD (its exit status)
#   bash scripts/device.sh measure STAGE...   hwmeasure stages, console gets counts only
#   bash scripts/device.sh session 1|..|11      the open decode / model issues' GPU work, in
#                                             calls under ten minutes each (below)
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
commit=${FLASHSIM_COMMIT:-}
[ -n "$commit" ] || commit="$(git rev-parse --short HEAD 2>/dev/null) (from the device .git, maybe stale)"
{ date -u; echo "$commit"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,uuid --format=csv; } \
  > "$OUT/device.txt" 2>&1
[ $# -gt 0 ] || { echo "usage: bash scripts/device.sh CMD [ARG...] | measure KIND:SET[:SECONDS]... | session 1|2|3|4|5"; exit 2; }
# session: most important first; every stage writes under $OUT as it goes, so a call cut
# short still returns what it made. At the end the text logs are packed into
# $OUT/logs_sN.tgz: a call returns at most 8 files.
# 1: compute-sanitizer memcheck and racecheck on the flat decode kernel (tiny cases: fp16
#    contiguous and paged, fp32, bf16), its fp16 checks against float64 and the ledger at
#    full size (contiguous and paged), the
#    decode benchmark (flashsim bench --decode without the num_splits sweep, at its default
#    budget of 330 s, smallest caches first; BENCH_S=seconds sets another).
# 2: the decode tests on the GPU (-v: each test's outcome is in the log as it ends, so a
#    run cut short still names its failures), then the flat kernel's probe of the split
#    rule (--splits: the default layout at one-wave and just-past-one-wave split counts,
#    every probe shape, beside SDPA).
# 3: the gpu-marked tests (-v, 500 s).
# 4: the issue-39 blind set runtime_blind13 (times, 240 s; a stage resumes from
#    ./out/SET.jsonl: carry out/). blind11 and blind12 were measured on the H100 2026-12-07;
#    SETS="times:SET:S counters:SET:S" names others (on an H200: SETS="times:runtime_blind12:200
#    times:runtime_blind13:240").
# 5: Nsight Compute on the flat decode kernel at issue 37's goal shapes (what binds GQA
#    and MQA: occupancy, warp stalls, DRAM throughput; benchmarks/decode_flat_ncu.py).
# 6: the tensor-core decode kernel (gpu.decode.tc): compute-sanitizer memcheck and racecheck
#    on its tiny checks (decode_flat_probe.py --tc --sanitize), its gpu tests (outputs against float64
#    and SDPA, exact counts, every timed layout), then decode_flat_probe.py --tc (its layouts
#    and split counts beside the flat kernel's defaults and SDPA; TC_S seconds, 280).
# 7: the decode benchmark with main="tc" for impl flashsim (no checks, no sweep; BENCH_S).
# 8: gpu.decode's defaults (the tensor-core kernel; the ragged split rule): the
#    decode benchmark with its checks, no sweep (BENCH_S, 200), then the GPU tests of every
#    file that decodes (-v, 300 s).
# 9: the decode benchmark of the default kernels without checks or sweep (BENCH_S, 170:
#    the whole grid took 90 s on an H100), then Nsight Compute on the goal shapes not yet
#    profiled with the tensor-core default (NCU_SHAPES; 200 s).
# 10: the split-KV combine alone, versions 1, 2 and 3 (benchmarks/decode_combine.py), then
#    the GPU tests of every file that decodes or combines (-v, 330 s); with LAYOUTS set
#    (e.g. LAYOUTS=8x16x3,4x32x3,8x32x2), then the tensor-core probe with those layouts in
#    its pass 2 (TC_S seconds, 200).
# 11: compute-sanitizer memcheck and racecheck on the flat and tensor-core probes' checks
#    (each with the combine), then gpu.decode's defaults' bench, no checks (BENCH_S, 180;
#    CHECKS=1: with its checks).
# Commit: the device's .git can be older than the tree sent, so `git rev-parse` there may
# name the wrong commit: set FLASHSIM_COMMIT to this side's `git rev-parse --short HEAD`.
# the GPU tests of every file that decodes or combines
export DECODE_TESTS="tests/test_gpu_decode.py tests/test_decode_ragged_gpu.py \
tests/test_gpu_decode_tc.py tests/test_flash_attn_iface.py tests/test_hf_backend.py \
tests/test_workload.py tests/test_varlen.py tests/test_bf16.py"
pack() {   # pack the session's text logs (a call returns at most 8 files)
  (cd "$OUT" && shopt -s nullglob && logs=(*.txt *.log) && [ ${#logs[@]} -gt 0 ] \
      && tar czf "logs_s$1.tgz" "${logs[@]}" && rm -f "${logs[@]}")
}
if [ "$1" = session ]; then
  self=$0
  case ${2:-} in
  1)
    bash "$self" bash -c '
      python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
          > $OUT/versions.txt 2>&1
      for tool in memcheck racecheck; do
        extra=""; [ $tool = memcheck ] && extra="--report-api-errors no"
        timeout 60 compute-sanitizer --tool $tool $extra python3 benchmarks/decode_flat_probe.py \
            --sanitize --out $OUT/san_$tool.jsonl > $OUT/san_$tool.txt 2>&1
        echo "$tool rc=$? $(grep -h "SUMMARY" $OUT/san_$tool.txt)"
      done
      timeout 45 python3 benchmarks/decode_flat_probe.py --quick --budget-s 1 \
          --out $OUT/probe_checks.jsonl > $OUT/probe_checks.txt 2>&1
      timeout $((${BENCH_S:-330} + 15)) python3 -m analysis.cli bench --decode --no-sweep \
          --budget-s ${BENCH_S:-330} \
          --out $OUT/decode_bench.jsonl > $OUT/bench.txt 2>&1
      echo "bench rc=$?"' ;;
  2)
    bash "$self" bash -c '
      timeout 240 python3 -m pytest -v -rfE -p no:cacheprovider -n 12 \
          --junitxml=$OUT/decode_tests.xml tests/test_gpu_decode.py \
          tests/test_decode_ragged_gpu.py > $OUT/pytest_decode.txt 2>&1
      echo "decode tests rc=$?: $(grep -c " PASSED" $OUT/pytest_decode.txt) passed," \
           "$(grep -c " FAILED" $OUT/pytest_decode.txt) failed"
      timeout 200 python3 benchmarks/decode_flat_probe.py --splits --budget-s 150 \
          --out $OUT/decode_probe.jsonl > $OUT/probe.txt 2>&1
      echo "probe rc=$?"' ;;
  3)
    bash "$self" bash -c '
      timeout 500 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider -n 14 \
          --junitxml=$OUT/gpu_tests.xml tests > $OUT/pytest_gpu.txt 2>&1
      echo "gpu tests rc=$?: $(grep -c " PASSED" $OUT/pytest_gpu.txt) passed," \
           "$(grep -c " FAILED" $OUT/pytest_gpu.txt) failed"' ;;
  4)
    bash "$self" measure ${SETS:-times:runtime_blind13:240} ;;
  5)
    bash "$self" bash -c '
      timeout 330 python3 benchmarks/decode_flat_ncu.py --timeout 300 \
          --out $OUT/decode_ncu.jsonl > $OUT/ncu.txt 2>&1
      echo "ncu rc=$?: $(tail -1 $OUT/ncu.txt)"' ;;
  6)
    bash "$self" bash -c '
      for tool in memcheck racecheck; do
        extra=""; [ $tool = memcheck ] && extra="--report-api-errors no"
        timeout 90 compute-sanitizer --tool $tool $extra python3 benchmarks/decode_flat_probe.py \
            --tc --sanitize --out $OUT/san_tc_$tool.jsonl > $OUT/san_tc_$tool.txt 2>&1
        echo "tc $tool rc=$? $(grep -h "SUMMARY" $OUT/san_tc_$tool.txt)"
      done
      timeout 240 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider -n 8 \
          --junitxml=$OUT/tc_tests.xml tests/test_gpu_decode_tc.py > $OUT/pytest_tc.txt 2>&1
      echo "tc tests rc=$?: $(grep -c " PASSED" $OUT/pytest_tc.txt) passed," \
           "$(grep -c " FAILED" $OUT/pytest_tc.txt) failed"
      timeout $((${TC_S:-280} + 60)) python3 benchmarks/decode_flat_probe.py --tc \
          --budget-s ${TC_S:-280} --out $OUT/decode_probe_tc.jsonl > $OUT/probe_tc.txt 2>&1
      echo "tc probe rc=$?: $(grep -c flashsim_tc $OUT/decode_probe_tc.jsonl) tc rows"' ;;
  7)
    bash "$self" bash -c '
      timeout $((${BENCH_S:-330} + 30)) python3 -m analysis.cli bench --decode --no-sweep \
          --no-checks --main tc --budget-s ${BENCH_S:-330} \
          --out $OUT/decode_bench_tc.jsonl > $OUT/bench_tc.txt 2>&1
      echo "tc bench rc=$?: $(grep -c "\"status\"" $OUT/decode_bench_tc.jsonl) rows with a status"' ;;
  8)
    bash "$self" bash -c '
      timeout $((${BENCH_S:-200} + 30)) python3 -m analysis.cli bench --decode --no-sweep \
          --budget-s ${BENCH_S:-200} --out $OUT/decode_bench.jsonl > $OUT/bench.txt 2>&1
      echo "bench rc=$?: $(grep -c "\"status\": \"ok\"" $OUT/decode_bench.jsonl) rows ok"
      timeout 300 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider -n 12 \
          --junitxml=$OUT/decode_tests.xml tests/test_gpu_decode.py tests/test_decode_ragged_gpu.py \
          tests/test_gpu_decode_tc.py tests/test_flash_attn_iface.py tests/test_hf_backend.py \
          tests/test_workload.py > $OUT/pytest_decode.txt 2>&1
      echo "decode tests rc=$?: $(grep -c " PASSED" $OUT/pytest_decode.txt) passed," \
           "$(grep -c " FAILED" $OUT/pytest_decode.txt) failed"' ;;
  9)
    bash "$self" bash -c '
      timeout $((${BENCH_S:-170} + 30)) python3 -m analysis.cli bench --decode --no-sweep \
          --no-checks --budget-s ${BENCH_S:-170} --out $OUT/decode_bench.jsonl > $OUT/bench.txt 2>&1
      echo "bench rc=$?: $(grep -c "\"status\": \"ok\"" $OUT/decode_bench.jsonl) rows ok"
      timeout 230 python3 benchmarks/decode_flat_ncu.py --timeout 200 \
          --shapes ${NCU_SHAPES:-b8_gqa_16k_page16,b64_gqa_16k,b8_mha_16k} \
          --out $OUT/decode_ncu.jsonl > $OUT/ncu.txt 2>&1
      echo "ncu rc=$?: $(tail -1 $OUT/ncu.txt)"' ;;
  10)
    bash "$self" bash -c '
      python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
          > $OUT/versions.txt 2>&1
      timeout 150 python3 benchmarks/decode_combine.py --out $OUT/decode_combine.jsonl \
          > $OUT/combine.txt 2>&1
      echo "combine rc=$?: $(tail -1 $OUT/combine.txt)"
      timeout 330 python3 -m pytest -v -rfE -m gpu -p no:cacheprovider -n 12 \
          --junitxml=$OUT/decode_tests.xml $DECODE_TESTS > $OUT/pytest_decode.txt 2>&1
      echo "decode tests rc=$?: $(grep -c " PASSED" $OUT/pytest_decode.txt) passed," \
           "$(grep -c " FAILED" $OUT/pytest_decode.txt) failed"
      [ -z "${LAYOUTS:-}" ] && exit 0
      timeout $((${TC_S:-200} + 60)) python3 benchmarks/decode_flat_probe.py --tc \
          --layouts $LAYOUTS --budget-s ${TC_S:-200} \
          --out $OUT/decode_probe_tc.jsonl > $OUT/probe_tc.txt 2>&1
      echo "tc probe rc=$?: $(grep -c flashsim_tc $OUT/decode_probe_tc.jsonl) tc rows"' ;;
  11)
    bash "$self" bash -c '
      for probe in "" "--tc"; do
        for tool in memcheck racecheck; do
          extra=""; [ $tool = memcheck ] && extra="--report-api-errors no"
          f=san${probe#--}_$tool
          timeout 85 compute-sanitizer --tool $tool $extra python3 benchmarks/decode_flat_probe.py \
              $probe --sanitize --out $OUT/$f.jsonl > $OUT/$f.txt 2>&1
          echo "$f rc=$? $(grep -h "SUMMARY" $OUT/$f.txt)"
        done
      done
      checks=--no-checks; [ -n "${CHECKS:-}" ] && checks=
      timeout $((${BENCH_S:-180} + 60)) python3 -m analysis.cli bench --decode --no-sweep \
          $checks --budget-s ${BENCH_S:-180} --out $OUT/decode_bench.jsonl > $OUT/bench.txt 2>&1
      echo "bench rc=$?: $(grep -c "\"status\": \"ok\"" $OUT/decode_bench.jsonl) rows ok"' ;;
  *) echo "device.sh session: give 1, 2, .., 11"; exit 2 ;;
  esac
  pack "$2"
  exit 0
fi
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
  # resume: a lent machine starts with an empty $OUT, so an earlier call's rows travel in
  # ./out (carry it) and are copied over first; hwmeasure skips the configurations they hold
  if [ -f "out/$set_name.jsonl" ] && [ ! -e "$OUT/$set_name.jsonl" ]; then
    cp "out/$set_name.jsonl" "$OUT/$set_name.jsonl"
  fi
  t0=$(date +%s)
  timeout $((budget + 60)) python3 -m analysis.hwmeasure "$kind" --set "$set_name" \
      --budget-s "$budget" --out "$OUT/$set_name.jsonl" > "$OUT/$set_name.log" 2>&1
  rc=$?
  n=$(cat "$OUT/$set_name.jsonl" 2>/dev/null | wc -l)
  echo "$st: rc=$rc $(( $(date +%s) - t0 )) s, $n rows" | tee -a "$OUT/device.txt"
done
