"""What a kernel pass costs in time: a model from work, traffic, parallelism and a few
fitted constants.

For each kernel launch of a pass (the launches of `analysis.levels`):

    T = t_launch + ( (imbalance t_work)^p + (imb_m B_L2 / (R_L2 e_L2))^p + (imb_m t_DRAM)^p
                     [+ (imbalance t_smem)^p + (imbalance t_local)^p] )^(1/p)
                 [+ t_lat]

    t_lat = n_rounds (t_round + miss t_miss)

    imb_m = max(1, imbalance / g_mem)

    t_DRAM = B_DRAM,read / (e_DRAM R_DRAM) + B_DRAM,write / (e_DRAM_w R_L2)

    t_work = ( W / R + ops / R_fp32 ) / e_k

* W is the kernel's work on the unit that does it: FLOPs on the tensor cores (fa2_tc,
  fa1_tc, the standard tensor-core products, the fa2 tensor-core backward) or the CUDA
  cores (4 d per active score entry in the forward, 10 d in the fa2 backward, 2 d per
  tile product), or, for the kernels that only move data (the backward's
  pre/convert/group-sum passes), its requested bytes; R is that unit's peak
  (`Hardware.fp16_tensor_flops`, `fp32_flops`, or the HBM bandwidth) and e_k the kernel
  family's achieved fraction of it (fitted; sibling launches share one: the standard
  tensor-core products `std_tc_mm`, its row passes `std_tc_row`; the grouped-K/V
  backward's group sum, never measured alone, takes bwd_convert's).
* The standard row passes (softmax S -> P, the backward's dS; tensor-core, plain and the
  fast fp32 standard's softmax), one CTA a row: W = ROW_OPS (32) per entry at the fp32
  rate, their per-entry CUDA-core instructions (two exps, max, sum, conversions; dS: P dP,
  the row sum D, the product), not their bytes at HBM: they take the same time on the
  H100 and the H200 (softmax at 24 heads, N = 4096, d = 128: 0.883 and 0.881 ms),
  whose SMs and clocks are the same and whose HBM is 1.4x faster.
* ops: the CUDA-core operations besides the products, at the fp32 rate, counted from the
  launch's tiling: kappa per score entry (online softmax: scale, max, exp, sum) in the
  forward kernels, kappa_c more per entry in a causal fa2 forward build (the band test),
  kappa_c1 more per entry in a causal fa1_tc / fa1_fast build (their band test and masked
  tile code: one CTA per head sweeps the same steps, and a causal step takes 1.25x a
  non-causal one at any d, 5.7-6.0 against 4.5-5.0 us on the H100),
  kappa_b per entry and product in the fast fp32 fa2 backward (P and dS recomputed; the
  tensor-core backward is bound by its MMAs, the plain one by its shared-memory bank
  conflicts, t_smem: no such term in either), and rho per query row and
  key tile visited (RA: the running max / sum update and the rescaling of O, the same for
  every key tile whatever its width, so narrow key tiles cost more per entry).
* B_L2, B_DRAM: the bytes the pass's kernel moves at L2 (requested sectors) and DRAM
  (`iosim.hierarchy`'s prediction), over the preset's L2 and HBM bandwidths times the
  fitted fractions e_L2, e_DRAM (shared by all kernels). DRAM writes are dirty lines the
  L2 evicts: they drain at the L2's write-back rate, e_DRAM_w times the L2 bandwidth, not
  at the HBM's (every write-heavy launch, the standard kernels' N x N S / P / dP / dS
  stores at 1.2-2.2 TB/s, takes the same time on the H100 and the H200 within 1 %, while
  the read-heavy ones (PV, dQ, the dQ convert) run 11-19 % faster on the H200: a
  preset-change choice the H200 rows informed; on the H100 alone it is the old fit).
  (The standard tensor-core tile products' L2 reads are 1.5 sectors per requested sector,
  like fa2_tc's: cp.async into padded rows, Nsight Compute; counting them so lowered their
  CV error but raised e_L2 and fa2_tc's: 5-fold CV 3.1 % against 2.8 % overall, not kept.)
* sigma, sigma_r (the plain row passes std_softmax, std_bwd_dS, one CTA a row; the fast
  fp32 standard runs the same softmax kernel): ops += sigma per warp and row step (a step:
  an active key tile of the row, or 4 x threads entries of the fast kernel's flat sweep
  of a dense row) + sigma_r per partial value read in the row's reductions (softmax: max
  and sum, dS: D = rowsum P dP; every thread reads all `threads` partial values, with
  warp shuffles (the fast standard) one value a warp): the plain kernels' time is their
  per-tile loop and their threads^2 reductions, not their bytes. The tensor-core row
  passes (std_tc_softmax, std_tc_bwd_dS: warp shuffles, then one value a warp in shared
  memory) take the same sigma_r per partial value read: a fixed cost per row that weighs
  on short rows (N = 1024). Form 10: + sigma_w per warp that holds entries of a tile step
  of the per-tile loop (`row_wsteps`: ceil(min(B_c, threads) / 32) warps, ceil(B_c /
  threads) entries a thread; one load in flight per thread, then its use, in each pass);
  the fast standard's flat sweep (4 independent loads in flight a thread) takes none.
* t_smem (the register-tiled fp32 CUDA-core kernels: the fast fa2 forward, the fast fa1
  forward, the fast standard's S and PV products): their shared-memory loads, from their
  register tile (RM x RN for S, RM x DN for O: RM + RN words per RM RN FMAs), over 128
  bytes per clock per SM times e_smem: the tiling's arithmetic intensity on shared memory.
  The plain fa2 backward (one thread per tile entry, no register tile) is bound by its
  shared-memory wavefronts: in its S / dP phase a warp's 32 entries span min(B_c, 32)
  keys and ceil(32 / B_c) query rows whose K, V (Q, dO) rows lie d s / 4 words apart,
  in one bank for d s / 4 a multiple of 32: min(B_c, 32)-way (ceil(32 / B_c)-way)
  conflicts per head column (`_bwd_wavefronts`); its dV / dK and dQ phases are
  conflict-free; 128 bytes per wavefront, the same e_smem.
  The fast fa1 / standard forward launches take fa1's / standard's work and traffic
  formulas with an efficiency each (fa1_fast, std_fast_S, std_fast_PV: two measured
  configurations each; a cross-validation fold without them takes fa2_fast_fp32's).
* t_local: register spills and local arrays (`analysis.levels.SPILLS`), where the resident
  CTAs' spills overflow the L1 (256 KB per SM less the shared memory in use), over
  R_L2 e_local.
* p = 4 blends the terms (a smooth maximum: the binding resource dominates, the others
  add a little where they are close).
* imbalance: the makespan of the kernel's CTAs over the perfectly balanced time, with
  each SM sharing its throughput equally among its resident CTAs (at most ctas_per_sm):
  CTAs are dispatched in grid order to the first slot that frees (a CTA's work
  proportional to its tiles; `_shared_makespan`, an event simulation), so the tail
  (ceil(CTAs / SMs) against CTAs / SMs) and causal imbalance both show, including a long
  CTA that starts late and shares its SM to the end (the causal fa2 and standard
  backward: one CTA per key block, the longest first in each head; the causal fast fa2
  backward's grid is (instances, T_c), so every head's key block 0 launches first, then
  every head's block 1, ...: the whole grid heaviest first (form 9); the causal fa2_tc and
  fa2_fast forwards launch the heaviest query blocks first, the plain fa2 in order).
  CTAs resident per SM come from analysis.levels' launch plans (its REGISTERS table holds
  Nsight Compute's register counts where they differ from ptxas', e.g. the fast
  standard's PV at d = 128: 255 registers, 2 CTAs per SM). Grids of equal CTAs
  (and, for speed, past SHARED_MAX_CTAS) use the sequential list schedule. A grid
  smaller than the SM count leaves SMs idle (fa1 with few heads).
* g_mem: an SM can draw up to g_mem times its even share (1 / SMs) of the L2 and DRAM
  bandwidth, so the memory terms take imb_m = max(1, imbalance / g_mem) where the compute
  terms take the full imbalance (fitted, shared, to form 8; form 9 holds it at the SM
  count, G_MEM = 132: an SM may draw the whole bandwidth, where the fit had put it).
* w_sat: warps an SM needs to reach its throughput: a CTA of w warps progresses at no
  more than min(1, w / w_sat) of its SM's rate, so a lone CTA (a small grid, or the
  longest CTAs of a causal grid) is latency-bound (fitted, shared by all kernels).
* t_launch: a fixed cost per launch (fitted). A CTA's prologue and epilogue (Q_i in,
  O_i out) count as one tile of work in its duration.
* t_lat (form 7; `LATENCY_KERNELS`): the kernels that load their operand tiles element by
  element (a thread loads one 4-byte element of each tensor per loop round, stores it to
  shared memory, then a barrier) wait a memory round trip per round: the plain and fast
  fa1 forward (step 8: Q_i, O_i, ceil(B_r d / threads) rounds, + 1 for l_i, m_i, per
  active tile), the fast standard's S (Q_i, K_j: ceil(B_r d / threads) +
  ceil(B_c d / threads) per CTA) and PV (P_ij, V_j per key tile of its row block).
  n_rounds counts them along one slot's chain (rounds per CTA times the CTAs per slot,
  ceil(CTAs / (SMs ctas_per_sm))); a round costs t_round (us, fitted: the L2 hit
  round trip with the loop's own instructions) plus t_miss (us, fitted) times the
  fraction of the launch's L2 reads that miss to DRAM (`lat_miss`, from iosim.hierarchy's
  bytes). It adds to the blend: the loads and the compute of one CTA are separated by
  barriers, and a lone CTA (fa1: one per instance) has no other CTA to hide them.
  Measured cause (H100, RUNTIME_DEV4 counters): the fast fa1 takes 26-31 us per tile step
  at d = 64 (128 x 128, 512 threads, 16 rounds, 4.2 MFLOP a step) and at d = 128
  (64 x 64, 256 threads, 32 rounds, 2.1 MFLOP) alike, 1 CTA per SM, 12.5 % warps active,
  9 % of peak throughput: neither FLOPs nor bytes set its time; L2-resident instances
  (16 heads, N = 2048, d = 128: 26 us a step) are faster than DRAM-bound ones (32 heads:
  30 us). The fast standard's S at d = 128 (64 x 64, 128 threads: 128 rounds per CTA for
  1 MFLOP) is 3.5x its d = 64 time (128 x 128, 256 threads: 64 rounds, 2 MFLOP) for 2x
  the FLOPs.
* t_cta (form 8; `CTA_LATENCY_KERNELS`: the fa2 tensor-core and fast fp32 forward and
  backward): a CTA's prologue and epilogue latency (its first operand tiles, Q_i / K_j,
  V_j, in before the first product; O_i or dK_j, dV_j out after the last), which the
  CTAs of one wave, started together, wait at once: lat += t_cta (us, fitted) times the
  waves ceil(CTAs / (SMs ctas_per_sm)) (the `cta_waves` feature). It weighs on small
  grids: fa2_tc at N = 1-2K (0.03-0.27 ms, one to eight waves) was under-predicted by
  12-14 % with about 3.5-6 us missing per wave, the same per wave at one wave (b1 h16
  N 1024, 128 CTAs) and at eight (b32 h8 N 1024 causal, 2048 CTAs).
* the tensor-core backward's lockstep phases (form 8; `_bwd_tc_lockstep`, no fitted
  constant): where an SM holds one CTA of it, its warps pass each tile's phases together
  (barriers around dS^T and dQ_i), so in the S^T and dP^T products (2 of the 5) each warp
  has B_r / 8 independent accumulator fragments, warps / 4 warps a sub-partition; below
  MMA_INFLIGHT (12) fragments in flight the tensor pipe idles in proportion:
  W x (0.6 + 0.4 max(1, 12 / ((warps / 4) (B_r / 8)))). The causal d = 128 build (32 x 128,
  8 warps, 1 CTA a SM: 8 in flight) takes 1.2 x its FLOPs' time; the d = 64 build
  (64 x 128, 8 warps: 16) none; the non-causal d = 128 build (32 x 64, 4 warps, 2 CTAs a
  SM) none: its two CTAs interleave their phases. Measured (Nsight Compute, RUNTIME_DEV5):
  142-154 TFLOP/s for the causal 32 x 128 build against 182 for 32 x 64 and 178-183 at
  d = 64, causal or not, with equal shared-memory bytes per MAC (0.81) and no spills.
* kappa_o (form 7; `O_ROUNDTRIP`): Algorithm 1 re-reads O_i, rescales it and writes it
  back at every tile step (fa1_tc: fp16 -> fp32 fragments, scale, pack, 16-byte stores):
  ops += kappa_o per element of O_i per active tile (B_r d per step), at the fp32 rate.
  The tensor-core fa1 takes 4.6-4.8 us a non-causal step at d = 64 (128 x 128) and at
  d = 128 (128 x 64) alike: the same MMA FLOPs, half the score entries, twice the O_i
  elements; without it d = 128 was under-predicted by 17-21 %.

Every prediction reports each term's time and share, so the model says which resource
binds. The constants are fitted (`fit`, robust least squares on log(predicted /
measured) per launch, bounded, best of three starts) on every H100 development row:
analysis.validation_configs.RUNTIME (all splits), LEVELS_NEW (the newer default
kernels), RUNTIME_BLIND, RUNTIME_BLIND2 and RUNTIME_BLIND3 (the blind sets, each once
scored against its frozen predictions; the latest row per configuration); the model form
was chosen by 5-fold cross-validation within them (form 6 on the 278 rows before the
third blind set, which joined after it was scored, for the constants only)
(analysis.validate.runtime_rows). Form 6 (`FORM`: the row passes' work on the CUDA
cores and their reduction cost, DRAM writes at the L2 write-back rate, heaviest-first
causal fa2_tc / fa2_fast grids, the fast standard PV's measured occupancy, kappa_c1) was
chosen by the same 5-fold CV on the 278 H100 rows (median 3.0 -> 2.6 %, worst 68 -> 44 %
with the L2 model v4's DRAM bytes; 2.7 % / 44 % with v5's); the write-back rate was
informed by the H200 rows (on the H100 it is a re-parametrisation). Tried and dropped:
the standard tensor-core products' 1.5 L2 sectors per requested sector (CV 3.1 %),
fa2's kappa_c on the causal fa1 builds (fa1_tc CV 5.5 -> 8.5 %). The H200 rows are
never fitted: for another preset only its published peaks and L2 size change. Times are
milliseconds, the kernels' own (CUPTI), warm clocks.

Form 7 (the eighth session, issue 21): form 6 plus t_lat (t_round, t_miss) and kappa_o,
chosen by the same 5-fold CV on the 347 H100 development rows (RUNTIME_DEV3 joined):
median 3.0 -> 2.8 %, worst 40 -> 16 %, within 10 % 297 -> 322 rows (fa1_fast 14.0 / 40 % ->
5.6 / 11 %, standard_fast 14.6 / 36 % -> 4.8 / 16 %, fa1_tc 2.9 / 21 % -> 1.8 / 8 %); the
H200 rows (not fitted) 3.2 / 40 % -> 2.6 / 17 % (form 6 refitted on the same 347 rows).
Steps: the latency rounds on fa1_fast alone (one t_round) 3.0 / 37 %, 308 rows; with
t_miss 2.9 / 37 %, 311; on the plain fa1 too (same step-8 loop) fa1 2.6 -> 2.4 %; kappa_o on
fa1_tc 2.9 / 35 %, 314; the rounds on the fast standard's S 2.8 / 27 %, 317, and PV
2.8 / 16 %, 322; kappa_o on all three fa1 kernels rather than fa1_tc alone: the same
aggregate (kept for one mechanism). With them g_mem rises from 1.4 to about 21 (the
fa1 rows it held down are explained by t_lat and kappa_o; an SM's share of the memory
bandwidth now seldom limits a row); it stays in the form. Not addressed: the
fa2_bwd_tc causal / non-causal d = 128 split, plain fa2 causal 64 x 64, small fa2_tc
grids (CV worst 13-16 %).

Form 8 (the ninth session, issue 21): form 7 plus t_cta, a prologue / epilogue latency per
wave of CTAs of the fa2 tensor-core and fast fp32 forward and backward kernels, chosen by
the same 5-fold CV on the 389 H100 development rows (RUNTIME_DEV5 not yet joined): median
2.8 -> 2.6 %, worst 16.1 -> 16.1 %, within 10 % 358 -> 361 rows (fa2_tc 3.1 / 14.8 % ->
2.2 / 12.2 %, 67 -> 72 of 75; fa2_bwd_tc 5.9 -> 3.2 % median, worst 13 %; fa2_fast
2.1 / 12.4 -> 2.2 / 11.4 %); the H200 rows (not fitted) 2.6 / 28.6 %, 294 -> 2.4 / 27.8 %,
303 of 323 rows (the 28 % row, fa2_bwd_tc b2 h16 N 3072 d 64 causal, measured 0.99 ms on
the H200 against 0.72 on the H100; timed again on the H200, 1.00 ms: it reproduces, and
the fifth blind set has an H100 twin, below). t_cta fits about 3.8 us a wave.
Steps: t_cta on fa2_tc alone: CV 2.6 / 16.1 %, 361 rows (fa2_tc 2.3 / 11.6 %), H200
2.5 %, 300; on fa2_tc and fa2_bwd_tc: 360 rows, H200 302; on the four kernels (kept:
one mechanism for the kernels that share the fa2 schedule): 361, H200 303. It moves the
non-causal d = 128 fa2_tc rows of many waves up (b16 h16 N 1024: +2 -> +12 %): the
per-wave cost is seen in the causal and one-wave grids more than in long non-causal
ones. Also: `predict` computes the levels without the L2 model's background DRAM writes
and adds them from its own launch times (the pass predicted once, not twice; identical
predictions). Not addressed (measured cause): the fa2_bwd_tc d = 128 split is its two
builds, not causality: Nsight Compute gives 182 TFLOP/s for the non-causal 32 x 64 build
(4 warps, 2 CTAs per SM) and 142-154 for the causal 32 x 128 one (8 warps, 1 CTA per
SM), while d = 64 (64 x 128, 1 CTA per SM) runs 178-183 causal or not; no term of the
form tells those builds apart yet (their shared-memory bytes per MAC are equal, 0.81).
The plain fa2 causal 64 x 64, the fast standard causal and the fa2_bwd_fast rows keep
their form 7 misses.
With RUNTIME_DEV5 joined (16 H100 passes, 405 rows; run-to-run noise about 1 %: its
repeat run agrees within 1 %) form 8 as above scored 5-fold CV 2.7 % / 19.5 % / 371 within
10 %, H200 2.5 % / 27.6 % / 311 of 339. Then the tensor-core backward's lockstep phases
(above; MMA_INFLIGHT not in the least-squares fit but chosen by this 5-fold CV among 10,
12 and 14: fa2_bwd_tc median 3.2 / 2.3 / 4.5 %, worst 9.0 / 6.1 / 9.7 %; 381-382 rows
within 10 % each: in effect one fitted constant for the one build it changes; it must stay
at most 16, the d = 64 build's count, which runs at full rate): CV 2.6 % / 19.5 % / 381 within 10 % (fa2_bwd_tc 4.0 / 15.0 %, 20 of 31 ->
2.3 / 6.1 %, 31 of 31: the causal d = 128 rows -11...-15 % -> -2...+3 %, the non-causal
d = 128 ones +4...+10 % -> +2...+6 %), H200 2.4 % / 29.9 % / 318 of 339 (fa2_bwd_tc
6.5 % -> 4.0 %, 14 -> 21 of 22; the worst row is the 0.99 ms H200 pass above).
Tried and dropped: the plain fa2 forward's lone CTA at its SM's full rate (no w_sat share:
b1 h12 N 3072 64 x 64 takes 44 ms against 52 at h16, so a CTA alone in the last round
runs 1.85 x a paired one): fa2_plain CV median 5.3 -> 3.9 % but the causal 32 x 32 rows
+5 -> +16 %, worst 17 %, within 10 % 371 -> 371 overall, H200 311 -> 309; the row passes'
steps counted per row rather than per warp (the fast standard's causal softmax takes about
the time per row step of the plain one at 4 warps, not twice): CV 366 within 10 %, worst
26 %; t_cta's waves counted as 1 + (waves - 1) / ctas_per_sm (a later CTA's prologue
overlapping its SM's other resident CTAs: b16 h16 N 1024 d 128 fa2_tc, 15.5 waves at 2 CTAs
a SM, is +12 % with t_cta): CV 379 within 10 %, worst 18 %, fa2_tc 75 -> 73 of 79. The
fa2_plain, standard_fast causal, fa2_bwd_fast causal and small fa2_tc causal grids
(b1 h8 N 3072 d 64: -19 %: 384 CTAs in one wave, its 49-tile CTA about 2.1 us a tile alone,
slower than the w_sat share allows) keep their misses. fa2_bwd_fast (1 CTA a SM, 8 warps):
the simulated causal imbalance is 1.33 at 768 CTAs (+15 %), 1.21-1.23 at 1536 (+1 %) and
1.14 at 4096 (N 16384: -12 %) against 1.18 for every non-causal grid (the w_sat share):
the causal tail costs less than simulated on small grids and the long causal grid more.
Frozen at a8501ef and scored on the fifth blind set (RUNTIME_BLIND5, declared and measured
before any of the above): H100 median 2.4 %, worst 28.8 %, 39 of 42 within 10 %; H200
3.7 % / 30.4 %, 38 of 42. The worst on both chips is fa2_bwd_tc b2 h12 N 4096 d 64 causal
(1.27 ms against 0.90 predicted): like the H200 pass above, it takes 3.2 ms per 10^9
B H N^2 where the causal d = 64 rows measured before 2026-11-27 07:55 take 1.8-2.5. The
kernel changed then: an A/B timing of the main kernel at fa03137 against today's, same
process and inputs (run 2026-11-27-h100-bwd-tc-ab-probe), gives 0.684 -> 0.956 ms
(b2 h16 N 3072), 0.889 -> 1.253 (b2 h12 N 4096), 3.94 -> 5.57 (b2 h16 N 8192): the band
support of 37df206 (N_k != N_q, windows) made the causal d = 64 build 40 % slower (d = 128
causal +3 %, non-causal +1 %). Mended in 289b8c6 (the square causal band compiled as
before: 0.676 ms against fa03137's 0.678); the six causal fa2_bwd_tc H100 passes measured
between were timed again with it (run 2026-11-27-h100-bwd-tc-fix-remeasure: b2 h12 N 4096
d 64 1.269 -> 0.932 ms) and are the rows fitted on; the H200's rows of those passes
(blind4's b2 h16 N 3072 d 64, the DEV5 and blind5 ones) still describe the slower build.
The set then joined the
development rows (constants refitted, form unchanged): CV on 447 H100 rows 2.8 % / 22 % /
421 within 10 % with the re-timed tc backward rows (29 % / 420 with the slower build's),
fa2_bwd_tc 3.0 / 7 %; H200 (never fitted) 2.7 % / 30 % / 355 of 381.

Form 9 (the tenth session): RUNTIME_DEV6 joined (16 H100 passes where form 8 missed most;
463 H100 rows). Form 8 refitted on them, 5-fold CV: median 2.9 %, worst 24.9 %, 426 of 463
within 10 % (456 within 15 %); fa2_bwd_fast 5.2 / 24.9 %, 18 of 26; H200 (never fitted)
2.8 % / 30.4 %, 353 (373 within 15 %) of 381. Two changes, chosen by that CV:
* the causal fast fa2 backward's grid order. Its grid is (instances, T_c) (blockIdx.x the
  instance, gpu.backward.fa2_fast.run), so the CTAs launch as every head's key block 0
  (T_r query blocks), then every head's block 1, ...: the whole grid heaviest first, a
  longest-processing-time-first list schedule; form 8 simulated it head by head (each
  head's blocks heaviest to lightest, then the next head's: late heavy CTAs). Its
  simulated causal imbalance falls from 1.33 (768 CTAs) / 1.21-1.23 (1536) to 1.14-1.16,
  the w_sat floor of its 8 warps, except the 384-CTA grid (b1 h8 N 3072 d 128: 1.26): the
  causal rows are no longer over-predicted on small grids (b2 h8 N 2048 d 64 +25 -> +4 %,
  b1 h12 N 4096 d 64 +15 -> +2 %, b1 h8 N 3072 d 128 +16 -> +4 %, b1 h16 N 2048 d 128
  +9 -> -6 % in CV) and kappa_b, which had taken some of the causal tail, falls from 139 to
  80. 5-fold CV fa2_bwd_fast 5.2 / 24.9 % -> 2.0 / 10.9 %, 18 -> 25 of 26 within 10 % (the
  one left: b1 h16 N 16384 d 64 causal, -13 -> -11 %, the largest causal grid; the
  non-causal d = 128 rows move from -4...-14 % to -3...+7 %); H200 fa2_bwd_fast
  3.2 / 15.4 % -> 0.7 / 6.8 %, 15 of 15. No row of another family moves by 1 % or more.
  Alone: CV 2.8 % / 27.5 % / 432 within 10 %: the worst row, fa1_tc b1 h32 N 8192 d 128
  (+3 -> +27 %), is fold 0's g_mem, fitted at 1.25 (against 6.2 in form 8's fold 0): an SM
  limited to 1.25 x its share of the bandwidth puts the one-CTA-per-instance fa1 grid's
  memory terms under the full imbalance. The fit barely tells g_mem apart (fold 0's cost
  1.120 with g_mem = 1.25 against 1.134 held at 26; the five folds 1.2 ... 92, the full fit
  on 463 rows 26 (form 8) and 131.7 at its upper bound on 447), so
* g_mem is held at the SM count (G_MEM = 132, no longer fitted): an SM may draw the whole
  L2 / DRAM bandwidth; one fitted constant fewer.
Together (form 9): CV median 2.7 %, worst 21.8 %, 433 of 463 within 10 % (458 within 15 %);
no family's median or worst CV error is higher than form 8's (fa1_tc 1.5 / 9.7 %, fa2_tc
2.3 / 19.2 %, fa2_plain 5.2 / 21.1 %, standard_fast 5.3 / 21.8 %: unchanged); H200 2.7 % /
30.4 %, 356 (374 within 15 %) of 381.
Tried and dropped (the same CV, each with the grid order above):
* the fast standard PV's latency rounds along the slot chain of its grid (`_makespan` of
  the CTAs' tiles over SMs x CTAs-per-SM slots, light row blocks first) instead of
  max(work) x waves, which over-counts a causal grid's chain: the causal d = 128 rows
  improve (b1 h8 N 3072 +22 -> +10 %) but the causal d = 64 ones fall further under
  (b2 h12 N 3072 -5 -> -18 %): standard_fast 5.3 / 21.8 %, 18 of 24 -> 10.0 / 18.2 %, 12 of
  24; overall 428 within 10 %.
* the row passes' per-tile steps counted by the warps that hold entries of the tile,
  ceil(min(B_c, threads) / 32), not all of the CTA's warps (thread t takes entries c0 + t,
  c0 + t + threads, ... of a tile; 256 threads at B_c = 64 or 128 leave 4-6 of 8 warps
  idle): standard 1.4 -> 1.1 %, standard_fast worst 21.8 -> 17.6 % but median 5.3 ->
  6.1 %, 18 -> 16 of 24, standard_bwd_tc 3.1 -> 4.0 %; overall 431 within 10 % (432
  without it), H200 356 -> 354. With the PV chain as well: 423, standard_fast 10.6 %.
Not addressed: the small causal fa2_tc grids (one wave, 3 CTAs a SM: b1 h8 N 3072 -19 %,
b1 h4 N 4096 -17 %, b1 h12 N 2048 -13 %): the shared-SM simulation and the w_sat slot
bound agree there (both 1.50 for b1 h8 N 3072) and the measured time is about 20 % longer;
the CTA-to-SM placement (assumed CTA c on SM c mod 132 in the first wave) and a lone
CTA's tile latency are candidates that no measured row yet separates. The plain fa2
(fp32 64 x 64 over-predicted in its tails, fp16 64 x 64 causal and 32 x 32 under) and the
fast standard's causal forward (d = 64 under via the softmax, d = 128 over via PV) keep
their form 8 errors.
Frozen at ac08151 (constants refitted on the 463 rows with L2 v9) and scored on the sixth
blind set (RUNTIME_BLIND6, declared in 305741c and measured before either model changed;
predictions committed in 5b9e774 before the rows were read): H100 median 2.8 %, worst
11.7 %, 41 of 42 within 10 % (the one outside: the fast standard's causal forward, b2 h10
N 3072 d 64, -11.7 %: the known d = 64 under-prediction); H200 (preset change only) 3.4 %,
worst 12.2 %, 41 of 42 within 10 %, 42 of 42 within 15 %. Per family (H100 median / worst):
fa2_tc 1.6 / 6.9, fa2_fast 1.9 / 3.1, fa2_plain 5.2 / 6.1, fa1_tc 1.9 / 4.7, fa1_fast
2.1 / 2.8, standard_tc 4.8 / 8.0, standard_fast 6.3 / 11.7, fa2_bwd_tc 4.1 / 7.2,
fa2_bwd_fast 1.9 / 3.4, fa2_bwd 3.7 / 4.4, standard_bwd_tc 1.3 / 3.8, standard_bwd 2.0.
The sixth blind set then joined the fit (505 H100 rows).

Form 10 (the eleventh session): RUNTIME_DEV7 joined (12 H100 passes; 517 H100 rows). The
comparisons below are 5-fold CV on the 517 rows with one start of the fit (start scale 1,
not fit_best's three: the machine was shared and a three-start CV run took too long;
before and after alike), the H200 rows (423, never fitted) predicted with the full fit.
Form 9 so: median 2.8 %, worst 23.0 %, 479 of 517 within 10 % (standard_fast 5.7 /
23.0 %, 23 of 33); H200 2.8 % / 23.2 %, 399 of 423 (standard_fast 4.1 / 12.8 %, 19 of 22).
Kept:
* the plain row passes' rounds (sigma_w, one fitted constant; `row_wsteps`). The row
  kernel (gpu.forward.standard.softmax_kernel, its backward twin ds_kernel) walks a row's
  active tiles in each of its passes (softmax: read S and max, exp and sum, store P);
  thread t takes entries c0 + t, c0 + t + threads, ... of a tile, so in a tile step only
  ceil(min(B_c, threads) / 32) warps hold entries, each thread one load in flight, used
  at once (the warps without entries still run the loop: sigma per warp, as before). The
  fast standard's dense rows take the flat sweep instead: 4 independent loads a thread
  and step, every warp, no such round. Measured (H100, per launch, 65 softmax launches):
  the causal fast softmax costs 18.5-20 ps per active entry at B_c = 128 (d = 64) and
  30-32 at B_c = 64 (d = 128), 2.4 and 1.9 ns per row step: not proportional to the
  steps (sigma) nor to the entries (ROW_OPS) alone; the flat sweep 3.5-5.7 ps per
  entry. A least-squares fit on the softmax launches alone (entries, steps of all warps,
  steps of the warps holding entries, reduction reads, CTAs): median / worst |error|
  5.3 / 14.7 % without the holding-warp steps, 1.6 / 7.3 % with them. In the model (the
  CV's fold fits; launch errors, H100): the fast causal softmax -11.1 % median
  (-13.7...+6.9 %) -> -2.5 % (-10.2...+4.0 %), the fast flat softmax +7.7 % -> +0.3 %, the
  plain causal softmax -9...+12 % -> -3.4...+2.7 %, the plain dS about as before
  (non-causal +5.2 -> +6.4 % median, causal -5.5 -> -6.5 %). 5-fold CV: median 2.8 ->
  2.8 %, worst 23.0 -> 21.4 %, 479 -> 484 of 517 within 10 %; standard_fast 5.7 / 23.0 %,
  23 -> 4.9 / 20.0 %, 28 of 33 (the dev7 causal d = 64 rows -5.8 / -5.6 / -11.0 % ->
  -2.7 / -2.0 / -7.7 %, the d = 128 causal one +23.0 -> +20.0 %, non-causal d = 64
  +12.1 / +7.1 -> +11.1 / +6.0 %); standard 1.4 / 5.6 -> 1.4 / 5.3 %; the families that
  share sigma_r or sigma move a little: standard_tc 2.9 / 10.3 -> 3.1 / 11.0 % (28 of 29
  both; blind2's fp16 d = 128 causal b8 h16 N 1024 -4.9 -> -7.6 %), standard_bwd 2.8 /
  7.4 -> 2.9 / 7.4 %, standard_bwd_tc 3.0 / 8.1 -> 3.0 / 8.3 %, fa1_fast median 3.5 ->
  3.6 %; the others unchanged. H200: 2.8 / 23.2 %, 399 -> 2.6 / 23.2 %, 400 of 423
  (standard_fast 4.1 / 12.8 %, 19 -> 3.4 / 9.6 %, 22 of 22; standard_tc 5.8 / 13.5 %,
  20 -> 5.4 / 14.2 %, 18 of 22; standard_bwd_tc 7.0 / 14.7 -> 6.7 / 14.5 %). The full fit:
  sigma_w about 7800, sigma 10000 -> 5150, sigma_r 26.3 -> 21.5 (FLOP-equivalents),
  e[std_softmax] 0.63 -> 0.52, e[std_bwd_dS] 0.70 -> 0.61 (one-start fits on the 517 rows).
  Steps: sigma_w on the flat sweep's warp steps too (every warp, a round per step):
  CV 2.8 % / 22.4 %, 480 within 10 %, standard_fast 5.9 / 22.4 %, 24 of 33 (the flat
  softmax then +15 % median): dropped for the form above.
Tried and dropped:
* the fast standard PV's latency rounds along its grid's slot chain (`_makespan` of the
  CTAs' tiles over SMs x CTAs-per-SM slots, grid order) instead of max(work) x waves,
  again, now with sigma_w: CV median 2.9 %, worst 21.0 %, 476 within 10 %; standard_fast
  8.5 / 17.1 %, 21 of 33; H200 399. Measured per tile of the slot chain (H100): d = 128
  non-causal 40-43 us, causal 36-37 (several waves) and 43 (one wave): the slot chain
  fits d = 128 (a two-constant fit: every d = 128 row within 4 % but b1 h8 N 2048 causal,
  -12 %); d = 64 non-causal 44-50 us, a lone CTA 44-46, but causal 59-61 (one wave, heavy
  CTAs paired) and 64-70 (several waves): the causal d = 64 PV (128 x 128, 8 warps, 2 CTAs
  a SM) is about 1.3 x slower per tile than its non-causal build, which neither chain
  form explains (max(work) x waves fits it only by over-counting its chain). No cause
  found in the kernel's code (the same loads, products and barriers per tile).
* the fa2 tensor-core forward's lone CTA no faster than at full occupancy (a CTA's rate
  at most 1 / ctas_per_sm of its SM's; no constant): the long one-wave causal grids'
  heaviest CTA runs 2.1-2.5 us a tile (b1 h8 N 3072 d 64, b1 h2 N 8192 d 128), about
  the per-CTA rate of the largest grids (2.4-2.5 us), where the w_sat share (4 / 9 warps)
  lets it run faster; but screened with form 9's constants (not refitted) it moved
  fa2_tc on the H100 from 95 to 91 of 102 within 10 %, worst 18.7 -> 50.6 % (short
  one-wave grids, b1 h8 N 2048 128 x 64 non-causal -8 -> +51 %, b1 h16 N 1024 causal
  +2 -> +28 %: their lone CTAs do run faster): not taken to CV. Not addressed: the small
  causal fa2_tc grids (-10...-19 %), the plain fa2 (fp32 64 x 64 causal +9...+22 %;
  its lone last-round CTAs run 1.85 x a paired one, where fa2_tc's do not: a per-kernel
  saturation, w_sat, that no code count of ours yet predicts), the fast standard's causal
  PV (d = 128 over, d = 64 under, above).
Form 10 with fit_best's three starts (the official fit), 5-fold CV on the 517 H100 rows:
median 2.4 %, worst 21.0 %, 495 of 517 within 10 % (512 within 15 %); per family
(median / worst %, within 10 %): fa2_tc 2.1 / 18.3 (96 of 102), fa2_fast 1.8 / 9.7 (47),
fa2_plain 5.2 / 21.0 (41 of 51), fa1 2.8 / 3.9, fa1_fast 2.1 / 11.7 (24 of 25), fa1_tc
1.4 / 10.5 (31 of 32), standard 1.1 / 4.7, standard_fast 4.2 / 20.4 (31 of 33),
standard_tc 2.7 / 10.8 (28 of 29), fa2_bwd 2.9 / 9.4, fa2_bwd_fast 2.0 / 10.6 (28 of 29),
fa2_bwd_tc 2.6 / 7.0, standard_bwd 2.4 / 6.1, standard_bwd_tc 3.4 / 7.0; H200 (never
fitted) 2.6 % / 23.2 %, 400 of 423 within 10 %. Form 9 with L2 v9 (commit c156044) under
the same three-start CV on the same 517 rows: median 2.5 %, worst 23.8 %, 487 within 10 %
(standard_fast 5.4 / 23.8 %, 25 of 33; fa1_fast 2.4 / 12.1 %, 22 of 25; fa1_tc 1.4 /
9.2 %, 32 of 32; fa2_tc 95 of 102; fa2_plain 41 of 51); H200 2.7 % / 23.9 %, 402 of 423
(standard_fast 19 -> 22 of 22, fa2_plain 33 -> 30 of 39, standard_tc 20 -> 18 of 22).
Frozen at bf23b81 (refitted on the 517 rows, with L2 v10) and scored on the seventh blind
set (RUNTIME_BLIND7, declared in 0f6a411 and measured before either model changed;
predictions committed in f31d458 before the rows were read): H100 median 2.1 %, worst
16.1 %, 41 of 42 within 10 %; H200 (preset change only) 2.6 %, worst 12.5 %, 41 of 42
within 10 %, 42 of 42 within 15 %. The one row outside on both chips: the fast fa1
forward, b1 h10 N 3072 d 128 (10 CTAs, one a SM: 61.1 ms measured on the H100 against
51.2 predicted, -16.1 %; H200 56.7 against 49.6, -12.5 %). Its per-step time rises with
the instances' working set on the H100 and not on the H200 (64 x 64 steps, N 3072: 8
instances 24.4 us a step on the H100, 21.6 on the H200; N 2048: 21.9 on both): fa1's
O / l / m round trips start to miss the H100's L2 at W = 0.5-0.6 of it, earlier than the
L2 model's edge (the fa1 onset that analysis.levels v10 also leaves out), so t_miss sees
no misses there. Per family (H100 median / worst %): fa2_tc 2.2 / 8.8, fa2_fast 1.4 /
3.0, fa2_plain 5.8 / 6.5, fa1_tc 2.3 / 3.5, fa1_fast 3.6 / 16.1, standard_tc 3.1 / 6.7,
standard_fast 2.4 / 8.6, fa2_bwd_tc 3.8 / 6.2, fa2_bwd_fast 1.0 / 3.4, fa2_bwd 1.3 / 1.6,
standard_bwd_tc 1.9 / 3.4, standard_bwd 0.9. The seventh blind set then joined the fit
(559 H100 rows).
The twelfth session changed no constant and no term (the fa1_fast row above is, by the
repeat probe of analysis.levels v11's block, largely the chip: b1 h10 N 3072 d 128 ran
61.8 ms on a second H100, b1 h9 60.3 ms there against 55.2 on the first) and froze the
model at 1630114 for the eighth blind set (RUNTIME_BLIND8, declared in 45c6258, measured
before the freeze; predictions committed in e836fd9): H100 median 2.0 %, worst 8.7 %, 42
of 42 within 10 %; H200 (preset change only) 3.1 %, worst 10.1 %, 41 of 42 within 10 %,
42 of 42 within 15 %. Per family (H100 median / worst %): fa2_tc 1.9 / 8.4, fa2_fast 1.8 /
2.9, fa2_plain 4.5 / 5.2, fa1_tc 1.5 / 2.8, fa1_fast 0.9 / 2.6, standard_tc 3.4 / 6.3,
standard_fast 2.8 / 8.7, fa2_bwd_tc 5.0 / 6.5, fa2_bwd_fast 1.2 / 3.0, fa2_bwd 3.0 / 4.4,
standard_bwd_tc 2.4 / 2.9, standard_bwd 0.1. The eighth blind set and RUNTIME_DEV8 then
joined the development rows (constants not refitted this session).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

import iosim
from iosim import Problem, Tiling, get_hardware
from iosim.hierarchy import _heap_push, _heap_sift_down, _schedule, njit
from iosim.launch.plan import _fast_smem_bytes

P_NORM = 4.0
#: the model form the constants were fitted for (it names them in `source`)
FORM = ("form 10 (form 9 + the plain row passes' rounds per warp holding a tile's entries, "
        "sigma_w; form 9: form 8 (form 7 + a prologue / epilogue latency per wave of CTAs of "
        "the fa2 tensor-core and fast kernels, the tensor-core backward's lockstep phases at "
        "one CTA a SM) + the causal fast fa2 backward's grid heaviest first across heads, "
        "g_mem held at the SM count)")
#: kernels that only move data: their work W is their requested bytes, R the HBM peak (the
#: row passes std_softmax, std_bwd_dS keep their family keys here; their W: ROW_PASSES)
MEMORY_KERNELS = ("std_softmax", "std_bwd_dS", "fa2_bwd_pre", "bwd_convert", "bwd_group_sum")
CONSTANTS_PATH = os.path.join(os.path.dirname(__file__), "runtime_constants.json")


#: the newer default kernels (analysis.levels._newer_plan's launch names) -> the kernel
#: whose work and traffic formulas they share (same products, same operands)
NEWER = {"fa1_tc": "fa1_fwd", "std_tc_softmax": "std_softmax", "std_tc_S": "std_S",
         "std_tc_PV": "std_PV", "std_tc_bwd_dV": "std_bwd_dV", "std_tc_bwd_dP": "std_bwd_dP",
         "std_tc_bwd_dS": "std_bwd_dS", "std_tc_bwd_dQ": "std_bwd_dQ",
         "std_tc_bwd_dK": "std_bwd_dK", "fa2_bwd_tc": "fa2_bwd_main",
         "fa2_bwd_fast": "fa2_bwd_main", "fa2_bwd_pre_fast": "fa2_bwd_pre",
         "std_fast_S": "std_S", "std_fast_PV": "std_PV", "fa1_fast": "fa1_fwd"}
#: kernels on the tensor cores (W over Hardware.fp16_tensor_flops)
TENSOR_KERNELS = ("fa2_tc", "fa1_tc", "std_tc_S", "std_tc_PV", "std_tc_bwd_dV", "std_tc_bwd_dP",
                  "std_tc_bwd_dQ", "std_tc_bwd_dK", "fa2_bwd_tc")
#: constants shared by sibling launches (few measured rows each): the standard tensor-core
#: tile products share one efficiency, its two row passes (softmax, dS) another
SHARED = {"std_tc_S": "std_tc_mm", "std_tc_PV": "std_tc_mm", "std_tc_bwd_dV": "std_tc_mm",
          "std_tc_bwd_dP": "std_tc_mm", "std_tc_bwd_dQ": "std_tc_mm", "std_tc_bwd_dK": "std_tc_mm",
          "std_tc_softmax": "std_tc_row", "std_tc_bwd_dS": "std_tc_row"}


#: a family without a fitted constant (too few rows: a cross-validation fold may hold all
#: of them) takes its sibling's: the fast fp32 fa2 forward's register-tiled products
FALLBACK = {"fa1_fast": "fa2_fast_fp32", "std_fast_S": "fa2_fast_fp32",
            "std_fast_PV": "fa2_fast_fp32"}


def family_key(name: str) -> str:
    """The kernel a launch is (fa2_tc, std_S, std_tc_S, fa2_bwd_fast, ...), from its name
    (a launch name of analysis.levels or a measured CUDA kernel name)."""
    if "std_fast_softmax" in name:       # the fast standard runs the plain softmax kernel
        return "std_softmax"
    for k in ("std_fast_S", "std_fast_PV", "fa1_fast", "fa2_bwd_pre_fast", "fa2_bwd_tc", "fa2_bwd_fast", "fa1_tc", "std_tc_softmax",
              "std_tc_S", "std_tc_PV", "std_tc_bwd_dV", "std_tc_bwd_dP", "std_tc_bwd_dS",
              "std_tc_bwd_dQ", "std_tc_bwd_dK",
              "fa2_tc", "fa2_fast", "fa2_fwd", "fa1_fwd", "std_softmax", "std_S", "std_PV",
              "fa2_bwd_pre", "fa2_bwd_main", "bwd_convert", "bwd_group_sum", "std_bwd_dV",
              "std_bwd_dP", "std_bwd_dS", "std_bwd_dQ", "std_bwd_dK"):
        if k in name:
            return k
    raise ValueError(f"kernel {name!r} has no time-model family")


@dataclass(frozen=True)
class RuntimeModel:
    """The fitted constants: e (family -> achieved fraction of its unit's peak), e_l2,
    e_dram, t_launch_ms. `source`: what they were fitted on."""
    e: dict
    e_l2: float
    e_dram: float
    t_launch_ms: float
    w_sat: float = 8.0
    e_local: float = 0.2
    kappa: float = 0.0
    source: str = ""
    rho: float = 0.0
    kappa_c: float = 0.0
    e_smem: float = 0.5
    kappa_b: float = 0.0
    e_dram_w: float = 0.1
    sigma: float = 0.0
    sigma_r: float = 0.0
    g_mem: float = 1.0
    kappa_c1: float = 0.0
    t_round_us: float = 0.0
    t_miss_us: float = 0.0
    kappa_o: float = 0.0
    t_cta_us: float = 0.0
    sigma_w: float = 0.0

    @classmethod
    def load(cls, path: str = CONSTANTS_PATH) -> "RuntimeModel":
        with open(path) as f:
            d = json.load(f)
        return cls(d["e"], d["e_l2"], d["e_dram"], d["t_launch_ms"], d.get("w_sat", 8.0),
                   d.get("e_local", 0.2), d.get("kappa", 0.0), d.get("source", ""),
                   d.get("rho", 0.0), d.get("kappa_c", 0.0),
                   d.get("e_smem", 0.5), d.get("kappa_b", 0.0), d.get("e_dram_w", 0.1),
                   d.get("sigma", 0.0), d.get("sigma_r", 0.0), d.get("g_mem", 1.0),
                   d.get("kappa_c1", 0.0), d.get("t_round_us", 0.0),
                   d.get("t_miss_us", 0.0), d.get("kappa_o", 0.0), d.get("t_cta_us", 0.0),
                   d.get("sigma_w", 0.0))

    def save(self, path: str = CONSTANTS_PATH):
        with open(path, "w") as f:
            json.dump({"e": self.e, "e_l2": self.e_l2, "e_dram": self.e_dram,
                       "t_launch_ms": self.t_launch_ms, "w_sat": self.w_sat,
                       "kappa": self.kappa, "e_local": self.e_local, "rho": self.rho,
                       "kappa_c": self.kappa_c, "e_smem": self.e_smem,
                       "kappa_b": self.kappa_b, "e_dram_w": self.e_dram_w,
                       "sigma": self.sigma, "sigma_r": self.sigma_r, "g_mem": self.g_mem,
                       "kappa_c1": self.kappa_c1, "t_round_us": self.t_round_us,
                       "t_miss_us": self.t_miss_us, "kappa_o": self.kappa_o, "t_cta_us": self.t_cta_us,
                       "sigma_w": self.sigma_w, "source": self.source}, f, indent=1,
                      sort_keys=True)
            f.write("\n")

    def table(self) -> str:
        rows = [f"  e[{k}] = {v:.4f}" for k, v in sorted(self.e.items())]
        return "\n".join([f"time-model constants ({self.source}):"] + rows +
                         [f"  e_l2 = {self.e_l2:.4f}", f"  e_dram = {self.e_dram:.4f}",
                          f"  e_dram_w = {self.e_dram_w:.4f} of the L2 bandwidth (DRAM writes: the L2 write-back rate)",
                          f"  t_launch = {self.t_launch_ms * 1e3:.2f} us",
                          f"  w_sat = {self.w_sat:.2f} warps", f"  e_local = {self.e_local:.4f}",
                          f"  g_mem = {self.g_mem:.2f} (an SM's L2 / DRAM bandwidth over its even share; held, not fitted)",
                          f"  e_smem = {self.e_smem:.4f}",
                          f"  kappa = {self.kappa:.1f} FLOP-equivalents per score entry",
                          f"  kappa_c = {self.kappa_c:.1f} more per score entry of a causal fa2 forward build",
                          f"  kappa_c1 = {self.kappa_c1:.1f} more per score entry of a causal fa1_tc / fa1_fast build",
                          f"  kappa_b = {self.kappa_b:.1f} per score entry and product of the fa2 backward",
                          f"  rho = {self.rho:.1f} FLOP-equivalents per query row and key tile",
                          f"  sigma = {self.sigma:.0f} FLOP-equivalents per warp and row step of a row pass",
                          f"  sigma_r = {self.sigma_r:.1f} FLOP-equivalents per partial value read in a row reduction",
                          f"  sigma_w = {self.sigma_w:.0f} FLOP-equivalents per warp and row step that holds entries (one load round)",
                          f"  t_round = {self.t_round_us:.3f} us per element-wise load round on a CTA's path (fa1 plain / fast, fast standard)",
                          f"  t_miss = {self.t_miss_us:.3f} us more per round that misses the L2 (DRAM)",
                          f"  kappa_o = {self.kappa_o:.1f} per element of O_i a fa1 tile step re-reads and re-writes",
                          f"  t_cta = {self.t_cta_us:.3f} us per wave of CTAs (prologue / epilogue latency: first tiles in, O out)",
                          f"  p = {P_NORM}"])


# ---------------------------------------------------------------------------------------
# Work and traffic of each launch
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UniformWork:
    """The work vector of a launch whose n CTAs all do the same work `value` (units of
    work at one SM's full rate), np.full(n, value) without the array: the standard
    kernels' tile products, fa1's heads and the backward's elementwise passes launch up to
    millions of equal CTAs whose work is only summed (`sum`, the spill term's
    `excess_sum`), maximised and scheduled (`makespans`: equal CTAs fill the machines in
    waves), which is arithmetic. Each gives the float the array's numpy expression gives."""
    n: int
    value: float

    @property
    def size(self) -> int:
        return self.n

    def sum(self) -> float:
        """np.full(n, value).sum(): n x value where every partial sum of numpy's pairwise
        summation is exact (an integer value, |n x value| < 2^53), else that sum."""
        v = float(self.value)
        if v.is_integer() and abs(v) * self.n < 2.0 ** 53:
            return 0.0 + float(self.n) * v          # (np.sum starts from +0.0)
        return float(np.full(self.n, v).sum())

    def max(self) -> float:
        """np.max(np.full(n, value)) (n > 0)."""
        return float(self.value)

    def excess_sum(self) -> float:
        """(work - 1).clip(0).sum(): the CTAs' work beyond their first unit (the spilling
        builds' local-memory steps)."""
        return UniformWork(self.n, float((np.float64(self.value) - 1).clip(0))).sum()


def _work_excess(work) -> float:
    """sum(max(work - 1, 0)) of a CTA work vector (array or `UniformWork`)."""
    if isinstance(work, UniformWork):
        return work.excess_sum()
    return (work - 1).clip(0).sum()


def _equal_work(work, uniform=None):
    """The work each CTA of `work` does (units at one SM's full rate) where all do the
    same, else None: a `UniformWork`'s value (equal by construction: no array), an
    array's first entry where every entry equals it (NaN equals none). uniform: whether
    all of an array is work[0], where the caller knows (one pass fewer over a grid of
    millions of CTAs)."""
    if isinstance(work, UniformWork):
        return float(work.value)
    if np.all(work == work[0]) if uniform is None else uniform:
        return float(work[0])
    return None


def _sums(p: Problem, t: Tiling):
    nA, RA, CA, RCA = (int(x) for x in iosim.tile_sums(p.N, t.B_r, t.B_c, p.causal))
    return nA, RA, CA, RCA


def launch_features(p: Problem, lv: dict, hw) -> list[dict]:
    """Per launch of the pass: W (work), R (its unit's peak), B_L2, B_DRAM and the CTA
    work vector for the imbalance. `lv` is `analysis.levels.levels(...)`'s result."""
    from analysis.levels import _active_prefix, _first_query_block
    t = Tiling(lv["block_rows"], lv["block_cols"])
    N, d, s, I = p.N, p.d, p.itemsize, p.instances
    nA, RA, CA, RCA = _sums(p, t)
    T_r, T_c = -(-N // t.B_r), -(-N // t.B_c)
    a = _active_prefix(N, t.B_r, t.B_c, p.causal)                 # key blocks per query block
    first = _first_query_block(N, t.B_r, t.B_c, p.causal)
    qb_per_kb = T_r - first                                        # query blocks per key block
    ones = lambda n: UniformWork(int(n), 1.0)        # equal CTAs: no array
    tc = lv["kernel"] == "tc"
    out = []
    for k in lv["kernels"]:
        name = k["name"]
        kern = family_key(name)
        if kern == "fa2_bwd_pre" and lv["kernel"] in ("tc", "fast") and lv.get("pass") != "fwd":
            kern = "fa2_bwd_pre_fast"          # the tensor-core backward runs the fast pre-pass
        fam = NEWER.get(kern, kern)            # whose work / traffic formulas it shares
        mem = fam in MEMORY_KERNELS
        if fam in ("fa2_tc", "fa2_fast", "fa2_fwd"):
            # the causal tensor-core and fast builds launch the heaviest query blocks first
            # (blockIdx.x reversed, gpu.forward.fa2_tc / fa2_fast); the plain one in order
            heavy_first = p.causal and kern in ("fa2_tc", "fa2_fast")
            W, B2 = 4.0 * RCA * d * I, _l2_global(lv)
            work = np.tile((a + 1)[::-1] if heavy_first else a + 1, I)
        elif fam == "fa1_fwd":
            W, work = 4.0 * RCA * d * I, UniformWork(int(I), float(nA + T_c))
            B2 = _l2_global(lv)
        elif fam in ("std_S", "std_bwd_dP"):          # tile products S = QK^T, dP = dO V^T
            W, work, B2 = 2.0 * RCA * d * I, ones(nA * I), ((RA + CA) * d + RCA) * s * I
        elif fam in ("std_softmax", "std_bwd_dS"):    # row passes: S -> P; P, dP -> dS
            W = (2.0 if fam == "std_softmax" else 3.0) * RCA * s * I
            work, B2 = np.tile(np.repeat(np.minimum(a * t.B_c, N), t.B_r)[:N], I), W
        elif fam in ("std_PV", "std_bwd_dQ"):         # row-block products O = PV, dQ = dS K
            W, work, B2 = 2.0 * RCA * d * I, np.tile(a + 1, I), (RCA + CA * d + N * d) * s * I
        elif fam == "fa2_bwd_pre":
            W = (2 * N * d * s + N * 4 + N * d * 4) * I
            work, B2 = ones(T_r * I), W
        elif fam == "fa2_bwd_main":
            W = 10.0 * RCA * d * I
            if p.causal and kern == "fa2_bwd_fast":
                # grid (instances, T_c): blockIdx.x is the instance, so the launch order
                # is every head's key block 0 (the heaviest), then every head's block 1,
                # ...: the whole grid heaviest first (longest processing time first), not
                # head by head (gpu.backward.fa2_fast.run)
                work = np.repeat(qb_per_kb + 1, I)
            else:                         # grid (T_c, instances): head by head
                work = np.tile(qb_per_kb + 1, I)
            B2 = ((2 * RA * d + 2 * N * d) * s + 2 * RA * 4 + 2 * RA * d * 4 + 2 * N * d * s) * I
        elif fam == "bwd_convert":
            W = N * d * (4 + s) * I
            work, B2 = ones(k["ctas"]), W
        elif fam == "bwd_group_sum":
            W = (2 * I + 2 * p.batch * p.kv_heads) * N * d * s
            work, B2 = ones(k["ctas"]), W
        elif fam in ("std_bwd_dV", "std_bwd_dK"):
            W, work, B2 = 2.0 * RCA * d * I, np.tile(qb_per_kb + 1, I), (RCA + RA * d + N * d) * s * I
        else:
            raise ValueError(f"kernel {name!r}: no work model")
        if mem:
            R = hw.hbm_bandwidth
        elif kern in TENSOR_KERNELS and (tc or kern != "fa2_tc"):
            R = hw.fp16_tensor_flops
        else:
            R = hw.fp32_flops
        if fam == "fa2_tc":
            B2 = _l2_global(lv)
        if fam in ROW_PASSES:
            # the row passes' work is their per-entry CUDA-core instructions (two exps, max,
            # sum, conversions; dS: P dP, D, the product) at the fp32 rate: the same on
            # every chip of the same SMs and clocks, not the HBM's
            W, R = ROW_OPS * RCA * I, hw.fp32_flops
        if not isinstance(work, UniformWork):
            work = np.asarray(work, dtype=np.float64)
        spill = k.get("spill_bytes", 0)
        local = 0.0
        if spill:
            l1_free = 256 * 1024 - k["ctas_per_sm"] * k["smem_bytes"]
            if spill * k["threads"] * k["ctas_per_sm"] > l1_free:   # loads and stores
                local = float(2 * spill * k["threads"] * _work_excess(work))
        entries = {"fa2_tc": 1, "fa2_fast": 1, "fa2_fwd": 1, "fa1_fwd": 1, "std_S": 0,
                   "std_PV": 0, "fa2_bwd_main": 2, "std_bwd_dP": 0, "std_bwd_dQ": 0,
                   "std_bwd_dK": 0, "std_bwd_dV": 0}.get(fam, 0) * float(RCA) * I
        if kern in ("fa2_bwd_tc", "fa2_bwd_main"):
            entries = 0.0   # measured: the tensor-core one tensor-FLOP-bound (~180 TFLOP/s at
            # d 64 and 128), the plain one shared-memory bound (its bank conflicts, B_smem)
        # fp16 and fp32 builds of a CUDA-core kernel are different specialisations (the
        # fp16 ones convert every load): one constant each
        if kern in NEWER:
            key = SHARED.get(kern, kern)
        elif kern == "bwd_group_sum":          # no measured rows: the backward's other
            key = "bwd_convert"                # elementwise memory pass's constant
        else:
            key = fam if (mem or fam == "fa2_tc") else f"{fam}_{p.dtype}"
        steps = rows_pass = wsteps = 0.0
        if kern in ("std_softmax", "std_bwd_dS"):   # the plain row passes (one CTA a row)
            thr, warps = k["threads"], -(-k["threads"] // 32)
            shfl = name == "std_fast_softmax"        # warp shuffles, then one value a warp
            nred = thr // 32 if shfl else thr        # partial values each thread reads
            # reductions per row: softmax max and sum, dS one (D = rowsum P dP)
            rows_pass = float(N * I) * (2 if kern == "std_softmax" else 1) * thr * nred
            if shfl and not p.causal:                # one flat sweep, 4 entries a thread
                # (4 independent loads in flight per thread: no sigma_w)
                steps = float(N * I) * -(-N // (4 * thr)) * warps
            else:                                    # a step per active tile of the row
                steps = float(RA * I) * warps        # (the tile loop, every warp)
                # sigma_w (form 10) per warp that holds entries of the tile (thread t:
                # c0 + t, c0 + t + threads, ...) and per entry of each of its threads:
                # one load in flight per thread, then its use, in each pass
                wsteps = float(RA * I) * -(-min(t.B_c, thr) // 32) * -(-t.B_c // thr)
        elif kern in ("std_tc_softmax", "std_tc_bwd_dS"):   # the same block reductions
            thr = k["threads"]                       # (warp shuffles, one value a warp)
            rows_pass = float(N * I) * (2 if kern == "std_tc_softmax" else 1) * thr * (thr // 32)
        loop = fam in ("fa2_tc", "fa2_fast", "fa2_fwd", "fa1_fwd", "fa2_bwd_main")
        smem = _fast_smem_bytes(p, t, k["threads"], kern) if kern in FAST_SMEM else 0.0
        if kern == "fa2_bwd_main":
            smem = 128.0 * nA * I * _bwd_wavefronts(t.B_r, t.B_c, d, s)
        if kern == "fa2_bwd_tc" and k["ctas_per_sm"] == 1:
            W *= _bwd_tc_lockstep(t.B_r, -(-k["threads"] // 32))
        rounds = miss = 0.0
        if kern in LATENCY_KERNELS:
            # fa1's step 8: Q_i, O_i element by element, one pair per thread and round, then
            # l_i, m_i (one more round), behind a barrier, by the instance's only CTA: each
            # round waits a memory round trip that no other CTA on the SM hides
            thr = k["threads"]
            waves = -(-k["ctas"] // (hw.sm_count * max(1, k["ctas_per_sm"])))
            if kern == "std_fast_S":          # Q_i, K_j element by element, one tile a CTA
                rounds = float((-(-t.B_r * d // thr) + -(-t.B_c * d // thr)) * waves)
            elif kern == "std_fast_PV":       # P_ij, V_j per key tile of its row block
                rounds = float((-(-t.B_r * t.B_c // thr) + -(-t.B_c * d // thr))
                               * float(work.max()) * waves)       # (array or UniformWork)
            else:
                rounds = float(nA * (-(-t.B_r * d // thr) + 1) * waves)
            miss = min(1.0, k["dram_read_bytes"] / max(1.0, lv["l2_read_bytes"]
                                                        - lv.get("l2_local_read_bytes", 0.0)))
        out.append({"name": name, "family": key, "kernel": kern, "W": float(W), "R": float(R),
                    "lat_rounds": rounds, "lat_miss": miss,
                    "cta_waves": float(-(-k["ctas"] // (hw.sm_count * max(1, k["ctas_per_sm"]))))
                    if kern in CTA_LATENCY_KERNELS else 0.0,
                    "o_elems": float(nA * t.B_r * d * I) if kern in O_ROUNDTRIP else 0.0,
                    "entries": entries, "backward": fam == "fa2_bwd_main",
                    "causal": bool(p.causal) and fam in ("fa2_tc", "fa2_fast", "fa2_fwd"),
                    "causal_fa1": bool(p.causal) and kern in ("fa1_tc", "fa1_fast"),
                    "B_smem": smem, "row_steps": steps, "row_rows": rows_pass,
                    "row_wsteps": wsteps,
                    "rows": float(RA * I) if (loop and fam != "fa2_bwd_main") else 0.0,
                    "B_l2": float(B2), "B_local": local,
                    "B_dram": float(k["dram_read_bytes"] + k["dram_write_bytes"]),
                    "B_dram_write": float(k["dram_write_bytes"]),
                    **makespans(work, hw, k["ctas_per_sm"]),
                    "warps": -(-k["threads"] // 32),
                    "ctas": k["ctas"], "ctas_per_sm": k["ctas_per_sm"]})
    return out


#: the standard row passes (one CTA a row: softmax S -> P, the backward's dS)
ROW_PASSES = ("std_softmax", "std_bwd_dS")
#: nominal CUDA-core operations per entry of a row pass (its fitted efficiency scales it)
ROW_OPS = 32.0


#: kernels whose lone CTA (one per instance) loads each tile step's operands in
#: latency-bound rounds behind a barrier (their `lat_rounds` feature, t_round each)
LATENCY_KERNELS = ("fa1_fast", "fa1_fwd", "std_fast_S", "std_fast_PV")
#: kernels whose CTAs wait a prologue / epilogue latency per wave (t_cta): the first
#: operand tiles in before the first product, O_i out after the last
CTA_LATENCY_KERNELS = ("fa2_tc", "fa2_fast", "fa2_bwd_tc", "fa2_bwd_fast")
#: Algorithm 1's kernels: O_i re-read, rescaled and re-written at every tile step (kappa_o)
O_ROUNDTRIP = ("fa1_tc", "fa1_fast", "fa1_fwd")

#: the register-tiled fp32 CUDA-core kernels (their shared-memory term, `_fast_smem_bytes`)
FAST_SMEM = ("fa2_fast", "fa1_fast", "std_fast_S", "std_fast_PV")


#: independent MMA accumulator fragments an SM sub-partition needs in flight to keep its
#: tensor pipe busy (each behind its ldmatrix from shared memory): the d = 64 backward
#: build (2 warps a sub-partition x B_r / 8 = 8 fragments each = 16) runs at the
#: non-causal d = 128 build's rate (2 CTAs a SM) while the causal d = 128 build (8) does not.
#: Chosen by 5-fold CV among 10, 12, 14 (not by the least-squares fit)
MMA_INFLIGHT = 12.0


def _bwd_tc_lockstep(B_r: int, warps: int) -> float:
    """The tensor-core backward's work multiplier where an SM holds one CTA: its warps
    pass the tile's phases in lockstep (barriers around dS^T and dQ_i), so in the S^T and
    dP^T products (2 of the 5 products) each warp has only B_r / 8 independent
    accumulator fragments (16 keys x B_r queries), warps / 4 warps a sub-partition: below
    MMA_INFLIGHT in flight the tensor pipe idles in proportion. Two CTAs a SM (the
    non-causal d = 128 build, 32 x 64, 4 warps) interleave their phases, and the dV / dK /
    dQ products (d / 8 fragments) have enough: no penalty there. 32 x 128 at d = 128
    (8 warps, 1 CTA a SM): 8 in flight, 1.2 x; 64 x 128 at d = 64: 16, none."""
    inflight = (warps / 4.0) * (B_r / 8.0)
    return 0.6 + 0.4 * max(1.0, MMA_INFLIGHT / inflight)


def _bwd_wavefronts(B_r: int, B_c: int, d: int, s: int) -> float:
    """Shared-memory wavefronts (128 bytes a clock per SM) of one tile of the plain fa2
    backward (gpu.backward.flash.bwd_block: a thread per entry, no register tiling).
    Phase A (S = Q K^T and dP = dO V^T per entry): a warp's 32 consecutive entries span
    min(B_c, 32) keys and ceil(32 / B_c) query rows; rows of Q, dO, K, V lie d s / 4 words
    apart in shared memory, so for d a multiple of 32 / s the distinct rows a warp reads
    fall in one bank: a load of K_c (V_c) takes min(B_c, 32) wavefronts, of Q_r (dO_r)
    ceil(32 / B_c), per head column x. Phases B (dV, dK: 4 loads per query row, lanes on
    consecutive columns) and C (dQ: 2 per key) are conflict-free."""
    words = d * s / 4
    banks = 32 // math.gcd(int(words), 32) if words == int(words) else 32
    deg = lambda k: -(-k // banks)                # wavefronts of k distinct rows
    a = -(-B_r * B_c // 32) * d * 2 * (deg(min(B_c, 32)) + deg(-(-32 // B_c)))
    b = -(-B_c * d // 32) * B_r * 4
    c = -(-B_r * d // 32) * B_c * 2
    return float(a + b + c)


def _l2_global(lv: dict) -> float:
    """A pass's L2 bytes less its local memory (`analysis.levels.local_l2_bytes`, which
    the spill term t_local prices on its own)."""
    return (lv["l2_read_bytes"] + lv["l2_write_bytes"]
            - lv.get("l2_local_read_bytes", 0.0) - lv.get("l2_local_write_bytes", 0.0))


def _makespan(work, machines, uniform=None):
    """Makespan of the list schedule of work (an array or `UniformWork`; CTAs in grid
    order, each to the earliest free of `machines`): max(start + work), `_list_makespan`;
    equal CTAs fill the machines in whole waves. uniform: as `_equal_work`'s."""
    value = _equal_work(work, uniform)
    if value is not None:
        return -(-work.size // machines) * value
    return float(_list_makespan(np.asarray(work, dtype=np.float64), int(machines)))


@njit(cache=True)
def _list_makespan(dur, slots):
    """(iosim.hierarchy._schedule(dur, slots) + dur).max() without the start times: the
    same heap of (free time, slot) (`iosim.hierarchy._schedule_slots`), each CTA ending
    at its slot's free time + its work, the latest end kept as it goes (NaN, as np.max,
    if any end is NaN); no arrays of millions of CTAs."""
    n = dur.shape[0]
    k = min(slots, n)
    hf = np.zeros(k)                        # heap: free time ...
    hs = np.arange(k)                       # ... and slot, in slot order
    latest = -np.inf
    nan = False
    for c in range(n):
        end = hf[0] + dur[c]
        if end > latest:
            latest = end
        elif np.isnan(end):
            nan = True
        _heap_sift_down(hf, hs, k, 0, end, hs[0])      # the root's new free time
    return np.nan if nan else latest


#: grids past this many CTAs of unequal work keep the sequential list schedule (speed)
SHARED_MAX_CTAS = 20000


def _shared_makespan(work, sms: int, slots: int) -> float:
    """Makespan of CTAs (work in units at one SM's full rate) on `sms` SMs of `slots`
    resident CTAs each, an SM's throughput shared equally among its resident CTAs, the
    CTAs dispatched in grid order to the first slot that frees: a long CTA that starts
    late shares its SM until the end (list scheduling with an SM as one sequential machine
    would let it run alone). Compiled (`_shared_makespan_nb`); `_shared_makespan_py` is
    the same schedule in Python, the reference it reproduces bit for bit."""
    w = np.ascontiguousarray(work, dtype=np.float64)
    if w.size == 0:
        return 0.0
    return float(_shared_makespan_nb(w, int(sms), int(slots)))


@njit(cache=True)
def _row_min(res, sm, k):
    """The least remaining work among SM sm's k resident CTAs."""
    mn = res[sm, 0]
    for i in range(1, k):
        if res[sm, i] < mn:
            mn = res[sm, i]
    return mn


@njit(cache=True)
def _shared_makespan_nb(w, sms, slots):
    """`_shared_makespan_py` compiled: the same float operations in the same order. Each
    SM's resident CTAs are a row of `res` (order within a row does not matter: min and the
    filter are order-free), the event heap (iosim.hierarchy's, shared with its slot
    schedule) is ordered by (time, SM) as heapq orders the Python version's (time, sm)
    tuples, so events pop in the same order."""
    n = w.shape[0]
    res = np.empty((sms, max(slots, 1)))
    cnt = np.zeros(sms, np.int64)
    m0 = min(n, sms * slots)
    for c in range(m0):                       # breadth first: CTA c on SM c mod sms
        sm = c % sms
        res[sm, cnt[sm]] = w[c]
        cnt[sm] += 1
    nxt = m0
    last = np.zeros(sms)
    ht = np.empty(sms)                        # event heap: time, SM
    hs = np.empty(sms, np.int64)
    size = 0
    for sm in range(sms):
        if cnt[sm] > 0:
            size = _heap_push(ht, hs, size, _row_min(res, sm, cnt[sm]) * cnt[sm], sm)
    t_end = 0.0
    while size > 0:
        t = ht[0]
        sm = hs[0]
        size -= 1                             # pop: the last entry to the root, sifted down
        if size > 0:
            _heap_sift_down(ht, hs, size, 0, ht[size], hs[size])
        k = cnt[sm]
        step = (t - last[sm]) / k             # each resident CTA's progress
        tol = 1e-9 * max(1.0, step)
        j = 0
        for i in range(k):
            x = res[sm, i] - step
            if x > tol:
                res[sm, j] = x
                j += 1
        last[sm] = t
        t_end = t
        while j < slots and nxt < n:          # freed slots take the next CTAs
            res[sm, j] = w[nxt]
            j += 1
            nxt += 1
        cnt[sm] = j
        if j > 0:
            size = _heap_push(ht, hs, size, t + _row_min(res, sm, j) * j, sm)
    return t_end


def _shared_makespan_py(work, sms: int, slots: int) -> float:
    """Makespan of CTAs (work in units at one SM's full rate) on `sms` SMs of `slots`
    resident CTAs each, an SM's throughput shared equally among its resident CTAs, the
    CTAs dispatched in grid order to the first slot that frees: a long CTA that starts
    late shares its SM until the end (list scheduling with an SM as one sequential machine
    would let it run alone)."""
    import heapq
    w = [float(x) for x in work]
    n = len(w)
    res = [[] for _ in range(sms)]                # remaining work of each SM's CTAs
    for c in range(min(n, sms * slots)):          # breadth first: CTA c on SM c mod sms
        res[c % sms].append(w[c])
    nxt = min(n, sms * slots)
    last = [0.0] * sms
    heap = [(min(r) * len(r), sm) for sm, r in enumerate(res) if r]
    heapq.heapify(heap)
    t_end = 0.0
    while heap:
        t, sm = heapq.heappop(heap)
        r = res[sm]
        step = (t - last[sm]) / len(r)            # each resident CTA's progress
        tol = 1e-9 * max(1.0, step)
        r[:] = [x - step for x in r if x - step > tol]
        last[sm] = t_end = t
        while len(r) < slots and nxt < n:         # freed slots take the next CTAs
            r.append(w[nxt])
            nxt += 1
        if r:
            heapq.heappush(heap, (t + min(r) * len(r), sm))
    return t_end


def makespans(work, hw, ctas_per_sm: int) -> dict:
    """The two schedules of a launch's CTAs, in units of work at one SM's full rate:
    mk_sm, SMs as machines sharing their throughput among resident CTAs; mk_slots, each
    of the SMs x CTAs-per-SM slots a machine running one CTA at a time at full rate (the
    latency-bound view: divided by the share of an SM one CTA can use, see `imbalance`).
    work: an array, or `UniformWork` (equal CTAs: waves of the machines, no array)."""
    total = work.sum() if work.size else 0     # (summed and compared once)
    if work.size == 0 or total == 0:
        return {"mk_sm": 0.0, "mk_slots": 0.0, "balanced": 1.0}
    uniform = _equal_work(work) is not None
    slots = hw.sm_count * ctas_per_sm
    if uniform or work.size > SHARED_MAX_CTAS:
        mk_sm = _makespan(work, hw.sm_count, uniform)
        # one CTA per SM: the slot schedule is the same list schedule (computed once)
        mk_slots = mk_sm if slots == hw.sm_count else _makespan(work, slots, uniform)
    else:
        mk_sm = _shared_makespan(work, hw.sm_count, max(1, ctas_per_sm))
        mk_slots = _makespan(work, slots, uniform)
    return {"mk_sm": mk_sm, "mk_slots": mk_slots, "balanced": float(total / hw.sm_count)}


def imbalance(f: dict, w_sat: float) -> float:
    """Makespan over the balanced time. One CTA of w warps can use at most
    min(1, w / w_sat) of its SM's throughput (latency hiding needs w_sat warps), so the
    makespan is the larger of the SM-throughput schedule and the slot schedule at that
    per-CTA rate."""
    share = min(1.0, f["warps"] / w_sat)
    return max(f["mk_sm"], f["mk_slots"] / share) / f["balanced"]


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------
def terms(f: dict, m: RuntimeModel, hw) -> dict:
    """Each resource's time (ms) for one launch, before imbalance and launch cost."""
    e = m.e.get(f["family"], m.e.get(FALLBACK.get(f["family"], "")))
    if e is None:
        raise ValueError(f"no fitted constant for kernel family {f['family']!r}")
    kap = m.kappa_b if f.get("backward") else m.kappa + (m.kappa_c if f.get("causal") else 0.0) \
        + (m.kappa_c1 if f.get("causal_fa1") else 0.0)
    ops = (kap * f.get("entries", 0.0)
           + m.rho * f.get("rows", 0.0)
           + m.sigma * f.get("row_steps", 0.0) + m.sigma_r * f.get("row_rows", 0.0)
           + m.sigma_w * f.get("row_wsteps", 0.0)
           + m.kappa_o * f.get("o_elems", 0.0))
    out = {"work": (f["W"] / f["R"] + ops / hw.fp32_flops) / e * 1e3,
           "l2": f["B_l2"] / (hw.l2_bandwidth * m.e_l2) * 1e3,
           # DRAM reads at the HBM's rate; DRAM writes (dirty lines evicted from L2) at
           # the L2's write-back rate, a fraction of the L2 bandwidth: the same on the H100
           # and the H200 (same L2 slices and clocks), whatever their HBM
           "dram": ((f["B_dram"] - f.get("B_dram_write", 0.0)) / (m.e_dram * hw.hbm_bandwidth)
                    + f.get("B_dram_write", 0.0) / (m.e_dram_w * hw.l2_bandwidth)) * 1e3}
    if f.get("B_smem"):                 # 128 bytes per clock per SM: fp32_flops / 2 bytes/s
        out["smem"] = f["B_smem"] / (hw.fp32_flops / 2 * m.e_smem) * 1e3
    if f.get("B_local"):
        out["local"] = f["B_local"] / (hw.l2_bandwidth * m.e_local) * 1e3
    return out


def predict_launch(f: dict, m: RuntimeModel, hw) -> dict:
    tt = terms(f, m, hw)
    imb = imbalance(f, m.w_sat)
    imb_m = max(1.0, imb / m.g_mem)
    blend = sum((v * (imb_m if k in ("l2", "dram") else imb)) ** P_NORM
                for k, v in tt.items()) ** (1 / P_NORM)
    lat = (m.t_round_us + m.t_miss_us * f.get("lat_miss", 0.0)) * 1e-3 * f.get("lat_rounds", 0.0) \
        + m.t_cta_us * 1e-3 * f.get("cta_waves", 0.0)
    ms = m.t_launch_ms + blend + lat
    share = {k: v ** P_NORM / max(1e-300, sum(x ** P_NORM for x in tt.values()))
             * blend / max(1e-300, blend + lat) for k, v in tt.items()}
    if lat:
        tt["latency"] = lat
        share["latency"] = lat / (blend + lat)
    return {"name": f["name"], "family": f["family"], "predicted_ms": ms, "terms_ms": tt,
            "share": share, "binds": max(tt, key=tt.get), "imbalance": imb}


def _levels_without_background(algorithm, problem, hw, pass_, kernel, tiling, c=None):
    """`analysis.levels.levels` (or `predict_row` of config c) with the L2 model's
    background DRAM writes left out, and that model's background_write_rate: the caller
    adds the background bytes from its own time prediction (`_with_background`), so a
    pass is predicted once (levels' `_add_background_writes` would run a nested time
    prediction of its own)."""
    from dataclasses import replace
    from analysis.levels import FITTED, levels, predict_row
    quiet = replace(FITTED, background_write_rate=0.0)
    lv = predict_row(c, hw, model=quiet) if c is not None else \
        levels(algorithm, problem, hw, pass_=pass_, kernel=kernel, tiling=tiling, model=quiet)
    return lv, FITTED.background_write_rate


def _with_background(feats: list[dict], m: "RuntimeModel", hw, rate: float) -> list[dict]:
    """The launch features with `analysis.levels`' background DRAM writes added: rate
    (bytes/s) x each launch's time as model m predicts it without them (what
    `levels._add_background_writes` adds to each kernel's dram_write_bytes; only B_dram
    and B_dram_write read them). rate 0: the features as they are."""
    if rate <= 0:
        return feats
    out = []
    for f in feats:
        extra = rate * predict_launch(f, m, hw)["predicted_ms"] / 1e3
        out.append(dict(f, B_dram=f["B_dram"] + extra,
                        B_dram_write=f.get("B_dram_write", 0.0) + extra))
    return out


def predict(algorithm: str, problem: Problem, gpu="H100-SXM", *, pass_: str = "fwd",
            kernel: str = "auto", tiling: Tiling | None = None, model: RuntimeModel | None = None,
            levels_result: dict | None = None) -> dict:
    """Predicted kernel time (ms) of one pass with the per-launch breakdown.
    Without levels_result, the levels are computed here without the L2 model's background
    DRAM writes, and those are added from this prediction's own launch times (the same
    bytes `analysis.levels.levels` adds, from one time prediction instead of two)."""
    hw = get_hardware(gpu) if isinstance(gpu, str) else gpu
    m = model or RuntimeModel.load()
    rate = 0.0
    try:
        if levels_result is not None:
            lv = levels_result
        else:
            lv, rate = _levels_without_background(algorithm, problem, hw, pass_, kernel, tiling)
    except ValueError as e:
        raise ValueError(f"the time model cannot predict this pass: {e}") from e
    feats = _with_background(launch_features(problem, lv, hw), m, hw, rate)
    launches = [predict_launch(f, m, hw) for f in feats]
    return {"predicted_ms": sum(x["predicted_ms"] for x in launches), "launches": launches,
            "constants": {"e": m.e, "e_l2": m.e_l2, "e_dram": m.e_dram,
                          "t_launch_ms": m.t_launch_ms, "w_sat": m.w_sat, "e_local": m.e_local,
                          "e_smem": m.e_smem, "kappa": m.kappa, "kappa_c": m.kappa_c,
                          "kappa_b": m.kappa_b, "rho": m.rho, "sigma": m.sigma,
                          "sigma_r": m.sigma_r, "g_mem": m.g_mem, "kappa_c1": m.kappa_c1,
                          "t_round_us": m.t_round_us, "t_miss_us": m.t_miss_us, "kappa_o": m.kappa_o,
                          "t_cta_us": m.t_cta_us, "sigma_w": m.sigma_w, "p": P_NORM, "source": m.source}}


# ---------------------------------------------------------------------------------------
# Fitting and validation on measured rows
# ---------------------------------------------------------------------------------------
def row_features(row: dict, gpu: str) -> tuple[list[dict], list[float]]:
    """(launch features, measured ms per launch in the same order) of a runtime row."""
    from analysis.levels import problem_of
    c = row["config"]
    hw = get_hardware(gpu)
    lv, rate = _levels_without_background(None, None, hw, None, None, None, c=c)
    # levels' background DRAM writes, from the constants on file
    feats = _with_background(launch_features(problem_of(c), lv, hw),
                             RuntimeModel.load() if rate > 0 else None, hw, rate)
    meas = row["measured"]["kernels"]
    ms = []
    for f in feats:
        hit = [k["ms"] for k in meas if family_key(k["name"]) == f["kernel"]]
        if len(hit) != 1:
            raise ValueError(f"{c['id']}: measured kernels {[k['name'][:30] for k in meas]} do not "
                             f"match the model's launch {f['name']}")
        ms.append(hit[0])
    return feats, ms


def fit(rows: list[dict], gpu: str = "H100-SXM", source: str = "") -> RuntimeModel:
    """Least squares on log(predicted / measured) per launch, over `rows`."""
    from scipy.optimize import least_squares
    hw = get_hardware(gpu)
    data = []
    for r in rows:
        feats, ms = row_features(r, gpu)
        data += list(zip(feats, ms))
    return fit_data(data, hw, source)


#: g_mem, no longer fitted (form 9): an SM may draw the whole L2 / DRAM bandwidth (the H100's
#: SM count, 132: the memory terms take no imbalance short of a one-CTA grid), where the
#: fit on every H100 row had put it (131.7 at its upper bound, form 8 on 447 rows)
G_MEM = 132.0

#: the shared constants the fit adjusts: (start, lower bound, upper bound)
SHARED_PARAMS = {"e_l2": (0.5, 0.05, 1.0), "e_dram": (0.7, 0.05, 1.0),
                 "t_launch_ms": (0.004, 1e-4, 0.05), "w_sat": (8.0, 1.0, 64.0),
                 "e_local": (0.2, 0.005, 1.0), "kappa": (20.0, 0.1, 1000.0),
                 "kappa_c": (2.0, 1e-3, 200.0), "rho": (10.0, 1e-3, 2000.0),
                 "e_smem": (0.5, 0.01, 1.0),
                 "kappa_b": (20.0, 0.1, 1000.0), "e_dram_w": (0.1, 0.005, 1.0),
                 "sigma": (2000.0, 1.0, 1e6), "sigma_r": (20.0, 0.01, 1e4),
                 "kappa_c1": (2.0, 1e-3, 200.0),
                 "t_round_us": (0.3, 1e-3, 10.0), "t_miss_us": (0.2, 1e-3, 10.0),
                 "kappa_o": (2.0, 1e-3, 500.0), "t_cta_us": (1.0, 1e-3, 50.0),
                 "sigma_w": (2000.0, 1.0, 1e6)}


def fit_data(data: list, hw, source: str = "", fixed: dict | None = None,
             start_scale: float = 1.0, return_cost: bool = False) -> RuntimeModel:
    """The fit on (launch features, measured ms) pairs (robust least squares on the log
    ratio per launch, every constant bounded). fixed: constants held at a value;
    start_scale: multiplies every start value (to check that different starts agree)."""
    from scipy.optimize import least_squares
    fams = sorted({f["family"] for f, _ in data})
    names = [k for k in SHARED_PARAMS if k not in (fixed or {})]

    def unpack(x):
        e = {k: math.exp(v) for k, v in zip(fams, x[:len(fams)])}
        kw = {"g_mem": G_MEM, **(fixed or {})}
        kw.update({k: math.exp(v) for k, v in zip(names, x[len(fams):])})
        return RuntimeModel(e, source=source, **kw)

    def resid(x):
        m = unpack(x)
        return [math.log(predict_launch(f, m, hw)["predicted_ms"] / ms) for f, ms in data]
    x0 = [math.log(0.3 * start_scale)] * len(fams) + \
        [min(math.log(SHARED_PARAMS[k][2]), math.log(SHARED_PARAMS[k][0] * start_scale))
         for k in names]
    lo = [math.log(1e-5)] * len(fams) + [math.log(SHARED_PARAMS[k][1]) for k in names]
    hi = [math.log(1.0)] * len(fams) + [math.log(SHARED_PARAMS[k][2]) for k in names]
    sol = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05)
    m = unpack(sol.x)
    return (m, float(sol.cost)) if return_cost else m


def fit_best(data: list, hw, source: str = "", starts=(1.0, 0.5, 2.0), **kw) -> RuntimeModel:
    """fit_data from several starts; the fit of the lowest cost (the starts' costs go in
    `fit_starts` of the printed report by `fit_report`)."""
    fits = [fit_data(data, hw, source, start_scale=s, return_cost=True, **kw) for s in starts]
    best = min(fits, key=lambda mc: mc[1])[0]
    fit_best.last = [(s, c) for s, (_, c) in zip(starts, fits)]
    return best


def validate(rows: list[dict], model: RuntimeModel, gpu: str, features=None) -> list[dict]:
    """One runtime_validation row per measured row: measured and predicted pass time.
    features: (launch features, measured ms) of a single row, computed already."""
    out = []
    for r in rows:
        feats, ms = features or row_features(r, gpu)
        hw = get_hardware(gpu)
        launches = [predict_launch(f, model, hw) for f in feats]
        pred = sum(x["predicted_ms"] for x in launches)
        c = r["config"]
        out.append({"kind": "runtime_validation", "run_id": r["run_id"], "device": r["device"],
                    "date": r["date"], "commit": r["commit"], "versions": r["versions"],
                    "algorithm": c["algorithm"], "kernel": c.get("family"), "split": c.get("split"),
                    "config": c, "tiling": r.get("tiling"),
                    "measured_ms": r["measured"]["measured_ms"], "predicted_ms": pred,
                    "rel_error": pred / r["measured"]["measured_ms"] - 1,
                    "launches": [{"name": x["family"], "measured_ms": m, "predicted_ms": x["predicted_ms"],
                                  "binds": x["binds"], "share": x["share"]}
                                 for x, m in zip(launches, ms)],
                    "constants_source": model.source})
    return out


__all__ = ["RuntimeModel", "predict", "fit", "validate", "launch_features", "imbalance",
           "family_key", "P_NORM", "UniformWork"]
