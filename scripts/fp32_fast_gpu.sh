#!/usr/bin/env bash
# The fp32 fast standard and fa1 forward kernels (gpu.forward.standard_fast, fa1_fast) on a
# GPU, in about 5 minutes on an H100. Run from the repository root:
#     bash scripts/fp32_fast_gpu.sh
# With a numpy<2.5 wheel in .whl/ (numba-cuda 0.30.4 cannot compile kernels on numpy >= 2.5)
# it is installed to /tmp/site and put first on the path. Stages (STAGES narrows them):
#   pytest  the gpu-marked tests of the two kernels (exact counts, accuracy, auto's choice)
#   time    scripts/fp32_fast_gpu.py: registers / local memory of the default builds,
#           CUDA-event medians (20 reps after warm-up) of standard fast / plain / torch
#           MATH at batch x heads 16, fa1 fast / fa2 fast at 128 (N 4096, d 64, dense and
#           causal), and a small tiling sweep of each kernel; compact table at the end
#   bench   flashsim bench rows (fp32, N 4096, d 64) of standard, fa1 and fa2 as
#           gpu.attention runs them by default, with torch MATH / EFFICIENT, at batch x heads
#           16 (both causal modes) and fa1 / fa2 at 128 (dense); JSON in $OUT, ready for
#           `flashsim results add` or a rerun with --record
# Everything lands in $OUT (default ./out).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
. scripts/_wheel_env.sh || exit 1   # numpy<2.5 from .whl/ (see there)
FS="python3 -m analysis.cli"
STAGES=${STAGES:-"pytest time bench"}
for s in $STAGES; do
  t0=$(date +%s)
  case $s in
    pytest) timeout ${T_PYTEST:-240} python3 -m pytest -q -m gpu -p no:cacheprovider \
              tests/test_gpu_standard_fast.py tests/test_gpu_fa1_fast.py \
              > "$OUT/fp32_fast_pytest.txt" 2>&1 ;;
    time)   timeout ${T_TIME:-200} python3 scripts/fp32_fast_gpu.py > "$OUT/fp32_fast_time.txt" 2>&1 ;;
    bench)  { timeout ${T_BENCH:-60} $FS bench --impls standard,fa1,fa2,torch_math,torch_efficient \
                --dtypes fp32 --seq-lens 4096 --head-dims 64 --causal both --batch-heads 16 \
                --budget-s 55 --out "$OUT/bench_fp32_fast_bh16.json"
              timeout ${T_BENCH:-60} $FS bench --impls fa1,fa2 --dtypes fp32 --seq-lens 4096 \
                --head-dims 64 --causal off --batch-heads 128 --budget-s 55 \
                --out "$OUT/bench_fp32_fast_bh128.json"; } > "$OUT/fp32_fast_bench.txt" 2>&1 ;;
    *)      echo "unknown stage $s" > "$OUT/$s.txt" ;;
  esac
  echo "== $s: exit $? after $(( $(date +%s) - t0 )) s"
  case $s in
    pytest) tail -n 15 "$OUT/fp32_fast_pytest.txt" ;;
    time)   sed -n '/^== timings/,$p' "$OUT/fp32_fast_time.txt"; tail -n 3 "$OUT/fp32_fast_time.txt" ;;
    bench)  tail -n 30 "$OUT/fp32_fast_bench.txt" ;;
  esac
done
