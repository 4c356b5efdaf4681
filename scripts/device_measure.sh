#!/usr/bin/env bash
# One device call that measures configuration sets of analysis.validation_configs:
# `times:SET` (CUPTI kernel times, analysis.hwmeasure times) and `counters:SET` (Nsight
# Compute counters, analysis.hwmeasure counters), optionally `KIND:SET:SECONDS` (that
# stage's budget instead of $BUDGET), each into $OUT/SET.jsonl, in order.
# The console gets only each stage's exit status, duration and row count, never a
# measured value: a blind set's rows stay unread until its predictions are frozen.
# Run from the repository root on the device machine, a numpy<2.5 wheel in .whl/:
#   STAGES="times:runtime_dev3 times:runtime_blind3" BUDGET=250 bash scripts/device_measure.sh
# A stage cut short by its budget resumes when the same stage runs again on the same
# file (hwmeasure skips configurations already measured).
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
. scripts/_wheel_env.sh || exit 1   # numpy<2.5 from .whl/ (see there)
BUDGET=${BUDGET:-250}
{ date -u; git rev-parse --short HEAD 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; } > "$OUT/device.txt" 2>&1
for st in ${STAGES:?STAGES=\"times:SET counters:SET ...\"}; do
  kind=${st%%:*}; rest=${st#*:}; set_name=${rest%%:*}
  budget=$BUDGET; [ "$rest" != "$set_name" ] && budget=${rest#*:}
  case $kind in times|counters) ;; *) echo "unknown stage kind $kind (times, counters)"; exit 2 ;; esac
  t0=$(date +%s)
  timeout $((budget + 60)) python3 -m analysis.hwmeasure "$kind" --set "$set_name" \
      --budget-s "$budget" --out "$OUT/$set_name.jsonl" > "$OUT/$set_name.log" 2>&1
  rc=$?
  n=$(cat "$OUT/$set_name.jsonl" 2>/dev/null | wc -l)
  echo "$st: rc=$rc $(( $(date +%s) - t0 )) s, $n rows" | tee -a "$OUT/device.txt"
done
