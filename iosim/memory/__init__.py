"""Below the ledger: what of a pass's requested traffic reaches L2 and DRAM.

The ledger (`iosim.closed_form`) counts what a kernel *requests* from global memory; on a
GPU those requests go to the L2 cache, and only its misses (and the dirty lines it evicts)
reach DRAM. This package predicts, for each kernel launch of a pass, the bytes at L2 and
at DRAM:

* `access`: the launches of a pass (from its launch plan, `iosim.launch.plan`) and the
  access stream of each at tile granularity: which CTA touches which tile in what order.
  CTAs start in launch order as earlier ones finish, SMs x CTAs per SM at a time;
* `stream`, `schedule`: the stream (`Stream`) and its builders, the CTAs' list schedule;
* `l2model`: the L2 model's constants (`L2Model`): a hashed set-associative LRU of
  effective capacity C whose hit probability at LRU stack distance D is
  P[Poisson(A D / C) <= A - 1] (A = associativity), with the footprints, dirty cap,
  end-of-kernel drain, wave lag and private round-trip edge described there;
* `hits`, `order`, `fused`, `dram`: stack distances (exact, a Fenwick tree over the
  access sequence), hit probabilities and the DRAM sums, compiled (`fused`) with the
  numpy reference (`dram._dram_at`) that they reproduce to the bit;
* `levels`: one pass's requested, L2 and DRAM bytes with the chip-to-chip range
  (`pass_levels`; `iosim.levels` adds the background writes priced by the time model).

Units: bytes, whole problem (all batch x heads), one kernel launch with a cold L2 (as
Nsight Compute measures it). The model's derivation and the history of its fits:
docs/models-history.md.
"""
from .dram import dram_at_capacities, dram_from_stream
from .hits import hit_probability
from .l2model import KernelTraffic, L2Model
from .levels import (CHIP_CAPACITY_RANGE, FEW_ROWS, FITTED, FITTED_V5, FITTED_V8, FITTED_V9,
                     FITTED_V10, L1_FRAME_SHARE, TC_CPASYNC_SECTOR_FACTOR, UNBOUNDED_L2,
                     l1_left, local_l2_bytes, pass_levels, requested, within)
from .access import GRID_ORDERS
from .stream import Stream, row_kernel, sweep_kernel, tile_kernel

__all__ = ["L2Model", "Stream", "KernelTraffic", "hit_probability", "dram_from_stream",
           "dram_at_capacities", "sweep_kernel", "tile_kernel", "row_kernel", "pass_levels",
           "requested", "local_l2_bytes", "l1_left", "within", "FITTED", "FITTED_V5",
           "FITTED_V8", "FITTED_V9", "FITTED_V10", "CHIP_CAPACITY_RANGE", "UNBOUNDED_L2",
           "TC_CPASYNC_SECTOR_FACTOR", "FEW_ROWS", "L1_FRAME_SHARE", "GRID_ORDERS"]
