"""Launch plans: what each kernel of `gpu` needs to launch (tiling rule, threads, shared
memory, registers), as data the model reads without importing `gpu`. `gpu` imports these
same functions and tables when it launches, so a plan lives in one place.

    plan.py      kernel_plan: which kernel and tiling a pass runs on a Hardware preset,
                 its launches (threads, shared bytes, registers, CTAs per SM: occupancy)
    tables.py    the tile tables: default tilings per head dim and their fallbacks, tuned
                 options, the plain kernels' square default tiles (gpu.api re-exports them)
    forward/     per forward kernel family (fa2_tc, fa2_fast, fa1_tc, fa1_fast,
                 standard_tc, standard_fast, standard): thread layout, shared-memory
                 layout, plan_error (why a tiling cannot run), default tiling
    backward/    the same for the backward kernels (fa2_tc, fa2_fast, standard_tc,
                 standard, flash: the plain kernels and their default tiling)
    decode.py    the split-KV decoding kernel's layout

B_r: query rows per block, B_c: key rows per K/V tile, d: head dim (elements); shared
memory in bytes. Whether a configuration fits a device (its shared memory per block) is
asked with an explicit limit here; gpu fills in the device's.
"""
from .plan import (LOCAL, REGISTERS, SPILLS, Launch, Plan, kernel_plan, local_of,  # noqa: F401
                   occupancy)
