#!/usr/bin/env bash
# Repeatability of the measurements near the L2's capacity: the same passes measured
# REPEATS times, each in a fresh process, all rows into two files so that one device call
# brings them back whole:
#   $OUT/levels_repeat.jsonl   (analysis.hwmeasure counters rows + "repeat": i)
#   $OUT/times_repeat.jsonl    (analysis.hwmeasure times rows + "repeat": i)
# PROBES lists KIND:SET:REGEX (KIND counters or times, SET a key of
# analysis.validation_configs.SETS, REGEX on its configuration ids; no spaces in REGEX).
# Rows carry the GPU's UUID, so repeats on several machines can be told apart. Run from
# the repository root on the device machine, a numpy<2.5 wheel in .whl/:
#   PROBES="counters:levels_dev8:fa1-tc_fp16_b1h30_n4096_d64$ times:runtime_dev8:b1h9_n3072" \
#   REPEATS=3 bash scripts/repeat_probe.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
. scripts/_wheel_env.sh || exit 1   # numpy<2.5 from .whl/ (see there)
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv > "$OUT/device.txt" 2>&1
tmp=$(mktemp -d)
for i in $(seq 1 "${REPEATS:-3}"); do
  j=0
  for spec in ${PROBES:?PROBES=\"counters:SET:REGEX times:SET:REGEX ...\"}; do
    kind=${spec%%:*}; rest=${spec#*:}; set_name=${rest%%:*}; only=${rest#*:}
    case $kind in counters) out=levels_repeat ;; times) out=times_repeat ;;
      *) echo "unknown probe kind $kind (counters, times)"; exit 2 ;; esac
    # a file per probe and repeat: hwmeasure appends to (and resumes) its --out, so two
    # probes of one set sharing a file would copy the first one's rows again
    j=$((j + 1)); f="$tmp/$kind-$set_name-$j-$i.jsonl"; t0=$(date +%s)
    timeout $(( ${STAGE_S:-150} + 30 )) python3 -m analysis.hwmeasure "$kind" --set "$set_name" \
        --only "$only" --budget-s "${STAGE_S:-150}" --out "$f" >> "$OUT/repeat_probe.log" 2>&1
    rc=$?
    python3 -c "
import json, sys
with open(sys.argv[1], 'a') as out:
    for ln in open(sys.argv[2]):
        out.write(json.dumps(dict(json.loads(ln), repeat=int(sys.argv[3]))) + '\n')" \
        "$OUT/$out.jsonl" "$f" "$i" 2>/dev/null
    echo "$spec repeat $i: rc=$rc $(( $(date +%s) - t0 )) s, $(cat "$f" 2>/dev/null | wc -l) rows" \
      | tee -a "$OUT/repeat_probe.log"
  done
done
