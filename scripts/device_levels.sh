#!/usr/bin/env bash
# One device call: the hierarchy-model measurements (Nsight Compute counters over
# analysis.validation_configs.LEVELS), the L2-sector probe, and the kernel timings.
# Run from the repository root on the device machine, numpy<2.5 wheel in .whl/:
#   STAGES="probe counters" bash scripts/device_levels.sh
#   STAGES=counters SET=levels_new bash scripts/device_levels.sh   # the newer default kernels
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
. scripts/_wheel_env.sh || exit 1   # numpy<2.5 from .whl/ (see there)
STAGES=${STAGES:-"probe counters"}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv; } > "$OUT/device.txt" 2>&1
for s in $STAGES; do
  t0=$(date +%s)
  case $s in
    probe)    timeout 120 ncu --csv --print-units base --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,smsp__inst_executed_op_ldgsts.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,dram__bytes_read.sum python3 scripts/l2_sector_probe.py > "$OUT/probe.csv" 2>&1 ;;
    counters) timeout ${T_COUNTERS:-480} python3 -m analysis.hwmeasure counters --set ${SET:-levels} ${ONLY:+--only "$ONLY"} --budget-s ${B_COUNTERS:-450} --out "$OUT/levels.jsonl" > /tmp/$s.log 2>&1 ;;
    variants) timeout ${T_VAR:-200} python3 -m analysis.hwmeasure times --set variants --budget-s ${B_VAR:-180} --out "$OUT/variants.jsonl" > /tmp/$s.log 2>&1 ;;
    tcprobe)  { ncu --query-metrics 2>/dev/null | grep -E "ldgsts|ltcfabric|lookup_hit|lookup_miss" | head -40
                timeout 150 ncu --csv --print-units base -k regex:fa2_tc --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,smsp__inst_executed_op_ldgsts.sum,dram__bytes_read.sum python3 -c "
import torch, gpu
for n in (1024, 4096):
    q,k,v=(torch.randn(1,16,n,64,device='cuda',dtype=torch.float16) for _ in range(3))
    gpu.attention(q,k,v,tensor_cores=True); torch.cuda.synchronize()"; } > "$OUT/tcprobe.txt" 2>&1 ;;
    times)    timeout ${T_TIMES:-480} python3 -m analysis.hwmeasure times --set ${TSET:-runtime} ${ONLY:+--only "$ONLY"} --budget-s ${B_TIMES:-450} --out "$OUT/times.jsonl" > /tmp/$s.log 2>&1 ;;
  esac
  rc=$?
  { echo "===== stage $s: rc=$rc $(( $(date +%s) - t0 )) s"; cat /tmp/$s.log 2>/dev/null; } >> "$OUT/logs.txt"
  echo "stage $s: rc=$rc $(( $(date +%s) - t0 )) s" >> "$OUT/device.txt"
done
cat "$OUT/device.txt"; tail -n 30 "$OUT/logs.txt"
