#!/usr/bin/env bash
# ONE-OFF investigation (kept for the record): Nsight Compute metrics of one gpu.forward.fa2_tc
# launch (fp16, N=4096, d=64, 16 heads), one ncu run per metric so that a name this ncu
# does not know costs only its own line. It established that ncu counts the kernel's
# cp.async (LDGSTS) loads as 9/8 of the ledger (data set kind `ncu`). The routine check
# is `flashsim check --ncu`. Run on a GPU machine from the repository root:
#     bash scripts/ncu_tc_metrics.sh > ncu_metrics.txt
set -u
for m in l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
         l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum smsp__inst_executed_op_ldgsts.sum \
         smsp__sass_inst_executed_op_ldgsts.sum lts__t_sectors_srcunit_tex_op_read.sum \
         lts__t_sectors_srcunit_tex_op_write.sum l1tex__m_xbar2l1tex_read_bytes.sum \
         lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum; do
  echo "=== $m"
  timeout 60 ncu --clock-control none --metrics "$m" -k regex:^fa2_tc --launch-count 1 --csv \
      --print-units base python3 -m analysis.ncu --child fa2-tc 4096 64 16 fp16 128 64 \
      2>&1 | grep -E "\"$m\"|ERROR|rror" | awk -F'","' '{print $NF}' | tr -d '"'
done
