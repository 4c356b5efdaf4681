#!/usr/bin/env bash
# The lent GPU's work for the open decode / model issues, in two calls of under ten
# minutes each, most important first; every stage writes under $OUT as it goes, so a call
# cut short still returns what it made. From the repository root:
#   FLASHSIM_COMMIT=<hash> bash scripts/device_session.sh 1     (about 8 minutes)
#   FLASHSIM_COMMIT=<hash> bash scripts/device_session.sh 2     (about 8 minutes)
# 1: compute-sanitizer memcheck and racecheck on the flat decode kernel (tiny cases), its
#    checks against float64 and the ledger at full size (fp16, fp32, bf16, paged), the
#    decode benchmark (flashsim bench --decode), then the issue-39 blind set's times.
# 2: the rest of the blind set (hwmeasure resumes), the gpu-marked tests (transformers
#    backend, flash-attn interface, ...), the decode tests on the GPU, the flat kernel's
#    tuning probe (timings against the tiled kernel and SDPA).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT
here=$(dirname "$0")
case ${1:-} in
1)
  bash "$here/device.sh" bash -c '
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
        > $OUT/versions.txt 2>&1
    for tool in memcheck racecheck; do
      extra=""; [ $tool = memcheck ] && extra="--report-api-errors no"
      timeout 45 compute-sanitizer --tool $tool $extra python3 benchmarks/decode_flat_probe.py \
          --sanitize --out $OUT/san_$tool.jsonl > $OUT/san_$tool.txt 2>&1
    done
    timeout 60 python3 benchmarks/decode_flat_probe.py --quick --budget-s 1 \
        --out $OUT/probe_checks.jsonl > $OUT/probe_checks.txt 2>&1
    timeout 250 python3 -m analysis.cli bench --decode --no-sweep --budget-s 235 \
        --out $OUT/decode_bench.jsonl > $OUT/bench.txt 2>&1
    echo "bench rc=$?"'
  bash "$here/device.sh" measure times:runtime_blind11:130 ;;
2)
  bash "$here/device.sh" measure times:runtime_blind11:150
  bash "$here/device.sh" bash -c '
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 \
        --junitxml=$OUT/gpu_tests.xml tests > $OUT/pytest_gpu.txt 2>&1
    timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 --junitxml=$OUT/decode_tests.xml \
        tests/test_gpu_decode.py tests/test_decode_ragged_gpu.py > $OUT/pytest_decode.txt 2>&1
    timeout 120 python3 benchmarks/decode_flat_probe.py --budget-s 100 \
        --out $OUT/decode_probe.jsonl > $OUT/probe.txt 2>&1' ;;
*) echo "usage: FLASHSIM_COMMIT=<hash> bash scripts/device_session.sh 1|2"; exit 2 ;;
esac
