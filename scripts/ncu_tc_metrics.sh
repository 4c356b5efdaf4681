#!/usr/bin/env bash
# Nsight Compute metrics of one gpu.fa2_tc launch (fp16, N=4096, d=64, 16 heads), one ncu
# run per metric so that a name this ncu does not know costs only its own line. Compares
# what L1TEX and L2 saw of the kernel's global loads (cp.async / LDGSTS) and stores with
# iosim's ledger (0.545 GB read, 8.65 MB written at this size). Run on the GPU machine:
#     bash scripts/ncu_tc_metrics.sh > ncu_metrics.txt
set -u
for m in l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
         l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum smsp__inst_executed_op_ldgsts.sum \
         smsp__sass_inst_executed_op_ldgsts.sum lts__t_sectors_srcunit_tex_op_read.sum \
         lts__t_sectors_srcunit_tex_op_write.sum l1tex__m_xbar2l1tex_read_bytes.sum \
         lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum; do
  echo "=== $m"
  timeout 60 ncu --clock-control none --metrics "$m" -k regex:^fa2_tc --launch-count 1 --csv \
      --print-units base python3 scripts/ncu_counts.py --child --algorithm fa2-tc --dtype fp16 \
      2>&1 | grep -E "\"$m\"|ERROR|rror" | awk -F'","' '{print $NF}' | tr -d '"'
done
