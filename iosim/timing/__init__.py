"""What a kernel pass costs in time: a model from work, traffic, parallelism and a few
fitted constants (`predict_time` for the forward and backward passes, `predict_decode` for
gpu.decode's split-KV decoding step).

For each kernel launch of a pass (the launches of `iosim.memory`'s levels):

    T = t_launch + ( (imbalance t_work)^p + (imb_m B_L2 / (R_L2 e_L2))^p + (imb_m t_DRAM)^p
                     [+ (imbalance t_smem)^p + (imbalance t_local)^p] )^(1/p)
                 [+ t_lat]
    t_lat  = n_rounds (t_round + miss t_miss) + waves t_cta
    imb_m  = max(1, imbalance / g_mem)
    t_DRAM = B_DRAM,read / (e_DRAM R_DRAM) + B_DRAM,write / (e_DRAM_w R_L2)
    t_work = ( W / R + ops / R_fp32 ) / e_k

* W: the launch's work on its unit (FLOPs on the tensor or CUDA cores; bytes for kernels
  that only move data); R that unit's peak (`Hardware`), e_k the kernel family's fitted
  fraction of it (`family_key`; siblings share one, `SHARED`, `FALLBACK`).
* ops (FLOP-equivalents at the fp32 rate): the CUDA-core work beside the products, counted
  from the tiling: kappa per score entry (online softmax), kappa_c / kappa_c1 more in causal
  builds (the band test), kappa_b per entry and product of the fast fa2 backward, rho per
  query row and key tile (the running max / sum and O's rescaling), sigma / sigma_r /
  sigma_w for the standard row passes (their per-tile loop and reductions), kappa_o per
  element of O_i that fa1 re-reads and re-writes every step.
* B_L2, B_DRAM (bytes): the pass's L2 sectors and DRAM bytes (`iosim.memory`) over the L2
  and HBM bandwidths times the fitted e_L2, e_DRAM; DRAM writes drain at the L2's
  write-back rate (e_DRAM_w x the L2 bandwidth), the same on the H100 and H200.
* t_smem: shared-memory bytes (the register-tiled fp32 kernels' loads, the plain fa2
  backward's bank-conflicted wavefronts) over 128 bytes a clock per SM times e_smem.
* t_local: the local-memory bytes of builds whose spills overflow the L1, over R_L2 e_local.
* p = 4: a smooth maximum (the binding resource dominates).
* imbalance: the makespan of the launch's CTAs (each SM's throughput shared by its
  resident CTAs, CTAs dispatched in grid order; `makespans`) over the balanced time; a CTA
  of w warps runs at no more than min(1, w / w_sat) of its SM (an fa2 tensor-core forward
  CTA alone on its SM: w / w_sat_tc, form 11); the memory terms take
  imb_m (an SM may draw g_mem times its even share of the bandwidth).
* t_launch (ms): a fixed cost per launch. t_round, t_miss (us): a latency round of the
  kernels that load their tiles element by element behind a barrier (`LATENCY_KERNELS`;
  form 12: the tensor-core kernels' copies where d % 8 != 0, `ELEMENTWISE_TC`), and its
  extra when it misses L2; t_cta (us): a prologue / epilogue latency per wave of
  CTAs (`CTA_LATENCY_KERNELS`).

The constants are data (runtime_constants.json, `RuntimeModel.load`); every prediction
reports each term's time and share, so the model says which resource binds. Times are
milliseconds, the kernels' own, warm clocks. The derivation of each term, what measured it
and the history of the model's forms and fits: docs/models-history.md.

Every prediction carries `trust` (`trust_for`, iosim/timing/trust.json): the model's blind
errors on the nearest validated kernel family, or why the problem lies outside the
validated range (docs/validity.md).
"""
from .decode import predict_decode
from .features import launch_features
from .makespan import UniformWork, imbalance, makespans
from .model import FORM, P_NORM, RuntimeModel, family_key
from .predict import predict_launch, predict_time, terms
from .trust import Trust, trust_for

__all__ = ["RuntimeModel", "predict_time", "predict_decode", "predict_launch", "terms",
           "launch_features", "imbalance", "makespans", "family_key", "P_NORM", "FORM",
           "UniformWork", "Trust", "trust_for"]
