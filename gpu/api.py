"""`gpu.attention`: run one of the forward kernels on (batch, heads, N, d) arrays.

Three fa2 kernels run the same schedule (hence the same traffic and the same ledger):
`gpu.forward.fa2` (the plain one: one thread per tile element, S and O tiles in shared memory,
easy to hold next to the paper), `gpu.forward.fa2_fast` (register-tiled S = Q K^T and P V
micro-products on the CUDA cores, fp32 math) and `gpu.forward.fa2_tc` (fp16, bf16: the tile
products on the tensor cores through linked CUDA C++). One parameter picks among them,
`kernel=`: "auto" (default: the tensor-core kernel for fp16 where it runs, else the fast
kernel where it supports the tiling and thread count, else the plain one), "plain",
"fast" or "tc" (ValueError naming kernel, dtype, tiling and the reason where the choice
cannot run). The older `fast=` and `tensor_cores=` still work for one release, with a
DeprecationWarning, mapped onto `kernel=`.

Default tiling (no block_rows/block_cols/sram_bytes given):
* fa2 with fp16 on a GPU: `FA2_TC_TILES[d]` (`FA2_TC_TILES_CAUSAL[d]` when causal)
  (B_r, B_c) of the tensor-core kernel `gpu.forward.fa2_tc` (one warp per 16 MT query rows, MT
  from `FA2_TC_MT`), when it runs there (any d in 1..256, padded to 16 on chip): d=64
  128 x 64 (causal 64 x 64), d=128 64 x 64, other d the first of FA2_TC_FALLBACK that
  fits (d=256: 128 x 64);
* fa2 otherwise on a GPU: `FA2_FAST_TILES[d]` (B_r, B_c, threads), the fastest fp32 variant of
  the fast kernel measured on the H100 at N=4096 (tuning notes: docs/measurements.md):
  256 x 32 tiles, 512 threads,
  8 threads per query row, registers capped at 128, the next K/V tile's loads issued
  into registers before this tile's arithmetic (`fa2_fast_options`), for d = 64 and 128;
* standard and fa1 with fp32 (or kernel='fast') on a GPU: `STANDARD_FAST_TILES[d]`,
  `FA1_FAST_TILES[d]` (B_r, B_c, threads) of the register-tiled kernels
  `gpu.forward.standard_fast`, `gpu.forward.fa1_fast`, else the first of
  STANDARD_FAST_FALLBACK / FA1_FAST_FALLBACK they run;
* otherwise (fa1, standard, the simulator): the largest square tile B_r = B_c = B in
  (64, 32, 16, 8) whose shared-memory footprint (`iosim.sram_footprint_bytes`) fits the
  48 KB every CUDA device allows without opt-in. For example fa2/fa1: fp32 d=64 -> 32,
  fp16 d=64 -> 32, fp32 d=128 -> 16, d=16 -> 64, fp32 d=192 and 256 -> 8; standard:
  fp32 d=64 -> 64.

bfloat16: inputs of ml_dtypes.bfloat16 (NumPy, Numba), torch.bfloat16 or a '<V2'
__cuda_array_interface__ run on the plain kernels as uint16 bits (`_launch.loader` /
`storer`), or on a tensor-core kernel whose module lists "bf16" in DTYPES (`tc_dtypes`);
the fast kernels take fp32 and fp16 only (`FAST_DTYPES`). Outputs: bf16 of the caller's
kind.

Head dims: any d in 1..256 (`HEAD_DIMS`). The plain kernels run every d and load exactly
d elements per row (no padding: the ledger is iosim's unchanged). The fast fp32 kernel
needs d a multiple of 4 TC with d / TC <= 16 (`fa2_fast.plan`: e.g. 24, 64, 192, 256, not
40, 80, 160), the fa2 tensor-core kernel any d in 1..256 (padded to 16 in shared memory, d
elements per row loaded: README, "Head dims") and the other tensor-core kernels d a
multiple of 16 in 16..128 (their plan_error); kernel='auto' runs the plain kernel where
they cannot, and kernel='fast' / 'tc' raise ValueError saying why.

Call path. The full path checks the inputs (type, ndim, dtype, layout, shapes, head dim,
options), chooses kernel and tiling (device limits, alignment), builds the iosim
Problem, allocates and launches. It runs on the first call of each kind, records its
launches (`_launch.recording`) and keeps them as a plan (`_Plan`: per launch the
kernel, its launch configuration and its flattened parameters with the data pointers
left as slots) under a plan key (`_plan_key`: each input's type, shape, dtype, strides,
torch device and requires_grad; whether the data pointers are 16-byte aligned; every
option, a block mask by its bytes). A repeat call with a key that has a plan, on device
arrays (torch, Numba, other __cuda_array_interface__ objects; not NumPy), without
count_traffic or the deprecated fast= / tensor_cores=, and for fa2, standard or fa1
without return_stats, takes the thin path: read the three data pointers, allocate the
outputs, write the pointers into the recorded parameters, launch through cuda.core
(what `_launch.launch`'s fast path calls). Every check depends only on what the key
holds, so a repeat call of a planned kind passes them all again, and any other call
(bad input included) takes the full path and its errors. Outputs are new on every
call. Changing a tuning dict (FA2_TC_MT, FA2_TC_TILES, ...) drops the plans.
FLASHSIM_THIN=0 or `thin_path(False)` turns the thin path off.

Streams: with torch tensors the kernels run on torch's current stream of q's device
(`torch.cuda.current_stream()`; the legacy default stream when that is the default) and
the outputs come from torch's caching allocator on it, as for a torch operator: no host
synchronisation, ordered after the inputs' producers on that stream and before their
consumers. Other device arrays: the legacy default stream (after a synchronisation
with a producer's stream that __cuda_array_interface__ names), outputs from Numba.

Poison (validation mode): `poison=True` (default `POISON`: FLASHSIM_POISON=1,
`set_poison`, `poison_outputs`) NaN-fills every output before the kernels run, so an
element no kernel writes shows as NaN. Off by default: the fill is one more launch and
write of every output per call. `flashsim check`, the kernel sweeps and the test suite
run with it on.
"""
from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass

import numpy as np
from numba import cuda

import iosim
from iosim.tiling import ALGORITHMS, Tiling, resolve_tiling, sram_footprint_bytes

from . import _launch
from .forward import (fa1, fa1_fast, fa1_tc, fa2, fa2_fast, fa2_tc, standard, standard_fast,
                      standard_tc)
from ._launch import (DEFAULT_SMEM_BYTES, HOST_DTYPE, NP_DTYPE, SIM, check_fits,
                      counters_to_ledger, default_threads, device_smem_limit, dtype_name,
                      filled, new_counters)

BF16 = HOST_DTYPE["bf16"]


from iosim.launch.tables import (DEFAULT_TILES, FA1_FAST_FALLBACK, FA1_FAST_THREADS,  # noqa: F401
                                 FA1_FAST_TILES, FA1_FAST_TUNED, FA2_FAST_FALLBACK,
                                 FA2_FAST_THREADS, FA2_FAST_TILES, FA2_FAST_TUNED,
                                 FA2_TC_FALLBACK, FA2_TC_MT, FA2_TC_TILES, FA2_TC_TILES_CAUSAL,
                                 FAST_ALGORITHMS, FAST_DTYPES, HEAD_DIMS, KERNELS,
                                 STANDARD_FAST_FALLBACK, STANDARD_FAST_THREADS,
                                 STANDARD_FAST_TILES, STANDARD_FAST_TUNED, Tunable, fa2_tc_mt,
                                 on_change, other_fast_tables, plain_default_tiling, tc_dtypes)

_Tunable = Tunable


@on_change
def clear_plans() -> None:
    """Forget every cached launch plan of the thin call path (the next call of each kind
    takes the full path again and rebuilds its plan). Runs on every change of a tile table
    (`iosim.launch.tables.Tunable`)."""
    _PLANS.clear()


@dataclass
class AttentionResult:
    """Everything one call produced. O: (batch, heads, N, d) in the input dtype.
    L: (batch, heads, N) float32 logsumexp m + log l (fa2 writes it; for fa1 it is
    computed on the host from the l, m the kernel leaves in HBM; None for standard).
    ledger: the kernels' own traffic counts (count_traffic=True), else None."""
    O: object
    L: object = None
    ledger: iosim.Ledger | None = None


def fa2_fast_default(d: int) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of the fast fa2 kernel's default tiling for head dim d, or None
    where it has none (the simulator: its warps are OS threads, so tiny blocks rule)."""
    if SIM:
        return None
    limit = device_smem_limit()
    for B_r, B_c, threads in ((FA2_FAST_TILES[d],) if d in FA2_FAST_TILES else ()) + \
            FA2_FAST_FALLBACK:
        if _fast_fits(B_r, B_c, d, threads, limit):
            return B_r, B_c, threads
    return None


def fa2_tc_default(d: int, causal: bool = False, dtype: str = "fp16") -> tuple[int, int] | None:
    """(B_r, B_c) of the tensor-core fa2 kernel's default tiling for fp16 (or bf16, where
    gpu.forward.fa2_tc runs it) at head dim d, or None where it cannot run (the simulator;
    a dtype it does not take). Head dims without a tuned entry take the first of
    FA2_TC_FALLBACK that fits (not timed: d=40..256 all get 128 x 64; d=256 uses 203 KB
    of shared memory and 249 registers, no spills)."""
    if SIM or dtype not in tc_dtypes(fa2_tc):
        return None
    limit = device_smem_limit()
    tuned = (FA2_TC_TILES_CAUSAL if causal else FA2_TC_TILES).get(d)
    for B_r, B_c in ((tuned,) if tuned else ()) + FA2_TC_FALLBACK:
        if fa2_tc.supports(B_r, B_c, d, dtype, smem_limit=limit, MT=fa2_tc_mt(B_r, B_c, d)):
            return B_r, B_c
    return None


def _aligned16(x, kind) -> bool:
    """Whether a device input's data is 16-byte aligned (fa2_tc copies 16 bytes at a time);
    NumPy inputs are copied into fresh, aligned device arrays."""
    if kind == "numpy":
        return True
    if _torch_like(x) is not None:      # bfloat16 tensors have no __cuda_array_interface__
        return x.data_ptr() % 16 == 0
    return x.__cuda_array_interface__["data"][0] % 16 == 0


def _fast_fits(B_r: int, B_c: int, d: int, threads: int, limit: int) -> bool:
    """Whether the fast kernel runs this tiling as `attention` would launch it: with its
    tuned TC (fa2_fast_options) and, on hardware, warp-shuffle reductions (no RED
    region in shared memory)."""
    if fa2_fast.plan(B_r, B_c, d, threads) is None:
        return False
    opts = fa2_fast_options(B_r, B_c, d, threads)
    return fa2_fast.supports(B_r, B_c, d, threads, TC=opts.get("TC"), shfl=not SIM,
                             stage=opts.get("stage", 0), smem_limit=limit)


def fa2_fast_options(B_r: int, B_c: int, d: int, threads: int) -> dict:
    """Tuning keywords (TC, maxreg, stage) for gpu.forward.fa2_fast.run: the measured ones of
    FA2_FAST_TUNED where the kernel can use them at this d; otherwise TC from
    `fa2_fast.plan` and a register cap only above 256 threads, the one that lets a block
    be resident (65,536 registers per SM: 128 at 512 threads). The simulator takes no
    register cap."""
    opts = dict(FA2_FAST_TUNED.get((B_r, B_c, threads), {}))
    if "TC" in opts and fa2_fast.plan(B_r, B_c, d, threads, opts["TC"]) is None:
        del opts["TC"]
    if SIM:
        opts.pop("maxreg", None)
    elif "maxreg" not in opts and threads > 256:
        opts["maxreg"] = 65536 // threads
    return opts


def fa2_fast_threads(B_r: int, B_c: int, d: int, threads: int | None) -> int | None:
    """Thread count at which the fast fa2 kernel runs (B_r, B_c, d), or None if none
    of `threads` (given) or FA2_FAST_THREADS (not given) works on this device."""
    limit = device_smem_limit()
    if threads is not None:
        candidates = (threads,)
    elif SIM:   # the simulator runs one OS thread per CUDA thread: keep its default
        candidates = (default_threads(),)
    else:       # the measured thread count of this tiling first (FA2_FAST_TILES), then the rest
        tuned = [t for (br, bc, t) in list(FA2_FAST_TILES.values()) + list(FA2_FAST_FALLBACK)
                 if (br, bc) == (B_r, B_c)]
        candidates = tuple(dict.fromkeys(tuned + list(FA2_FAST_THREADS)))
    for t in candidates:
        if _fast_fits(B_r, B_c, d, t, limit):
            return t
    return None


def _other_fast(algorithm: str):
    """(module, tiles, fallback, tuned, threads) of standard's / fa1's fast kernels."""
    return ((standard_fast if algorithm == "standard" else fa1_fast),) + \
        other_fast_tables(algorithm)


def _other_fast_fits(algorithm, B_r, B_c, d, threads, dtype, N_k, limit) -> bool:
    if algorithm == "standard":
        return standard_fast.supports(B_r, B_c, d, threads, dtype, N_k=N_k, smem_limit=limit)
    return fa1_fast.supports(B_r, B_c, d, threads, dtype, shfl=not SIM, smem_limit=limit)


def _other_fast_candidates(algorithm: str, B_r: int, B_c: int, threads: int | None) -> tuple:
    """Thread counts to try for standard's / fa1's fast kernels at (B_r, B_c)."""
    if threads is not None:
        return (threads,)
    if SIM:     # the simulator runs one OS thread per CUDA thread: keep its default
        return (default_threads(),)
    _, tiles, fallback, _, tlist = _other_fast(algorithm)
    tuned = [t for (br, bc, t) in list(tiles.values()) + list(fallback) if (br, bc) == (B_r, B_c)]
    return tuple(dict.fromkeys(tuned + list(tlist)))


def other_fast_threads(algorithm: str, B_r: int, B_c: int, d: int, dtype: str,
                       threads: int | None, N_k: int | None = None) -> int | None:
    """Thread count at which gpu.forward.standard_fast / fa1_fast runs (B_r, B_c, d,
    dtype) on this device (shared memory included; standard: also the softmax row of
    N_k float32), or None."""
    limit = device_smem_limit()
    for t in _other_fast_candidates(algorithm, B_r, B_c, threads):
        if _other_fast_fits(algorithm, B_r, B_c, d, t, dtype, N_k, limit):
            return t
    return None


def other_fast_default(algorithm: str, d: int) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of standard's / fa1's fast kernels' default tiling for head dim
    d (fp32 on a GPU: STANDARD_FAST_TILES / FA1_FAST_TILES, then their FALLBACK), or None
    (the simulator, or no tiling fits)."""
    if SIM:
        return None
    limit = device_smem_limit()
    _, tiles, fallback, _, _ = _other_fast(algorithm)
    for B_r, B_c, t in ((tiles[d],) if d in tiles else ()) + fallback:
        if _other_fast_fits(algorithm, B_r, B_c, d, t, "fp32", None, limit):
            return B_r, B_c, t
    return None


def other_fast_options(algorithm: str, B_r: int, B_c: int, threads: int) -> dict:
    """Tuning keywords of gpu.forward.standard_fast.run (stage, maxreg) / fa1_fast.run
    (maxreg): STANDARD_FAST_TUNED / FA1_FAST_TUNED's entry; else a register cap only above
    256 threads, the one that lets a block be resident (65,536 registers per SM). The
    simulator takes no register cap."""
    opts = dict(_other_fast(algorithm)[3].get((B_r, B_c, threads), {}))
    if SIM:
        opts.pop("maxreg", None)
    elif "maxreg" not in opts and threads > 256:
        opts["maxreg"] = 65536 // threads
    return opts


def other_tc_module(algorithm: str):
    """The tensor-core kernel module of fa1 / standard (fp16): gpu.forward.fa1_tc or
    gpu.forward.standard_tc."""
    return {"fa1": fa1_tc, "standard": standard_tc}[algorithm]


def other_tc_default(algorithm: str, d: int, causal: bool = False,
                     dtype: str = "fp16") -> dict | None:
    """dict(B_r, B_c[, MT, stages]) the fa1 / standard tensor-core kernels run by default
    (fp16, or bf16 where the module lists it in DTYPES; on a GPU where the tiling fits),
    else None (the simulator; no fit; a dtype it does not take)."""
    if SIM or algorithm not in ("fa1", "standard"):
        return None
    mod = other_tc_module(algorithm)
    if dtype not in tc_dtypes(mod):
        return None
    t = mod.default_tiling(d, causal)
    if algorithm == "fa1":
        ok = mod.supports(t["B_r"], t["B_c"], d, dtype, MT=t["MT"], stages=t["stages"])
    else:
        ok = mod.supports(t["B_r"], t["B_c"], d, dtype)
    return t if ok else None


def default_tiling(algorithm: str, d: int, dtype: str, causal: bool = False,
                   kernel: str = "auto") -> Tiling:
    """The tiling `attention` uses when none is given (see the module docstring): for fp16
    on a GPU the tensor-core kernels' defaults (fa2, fa1, standard; they may depend on
    `causal`), unless kernel='plain' (or 'fast'); for fp32 (or kernel='fast') fa2's and
    standard's fast kernels' defaults (FA2_FAST_TILES, STANDARD_FAST_TILES). bf16: the
    tensor-core defaults where the module takes bf16 (`tc_dtypes`), else the plain
    kernels' square tiles (the fast kernels take fp32 and fp16 only)."""
    dtype = iosim.check_dtype(dtype)
    if algorithm in ("fa1", "standard") and dtype != "fp32" and kernel in ("auto", "tc"):
        t = other_tc_default(algorithm, d, causal, dtype)
        if t is not None:
            return Tiling(t["B_r"], t["B_c"])
    if algorithm == "fa2" and dtype != "fp32" and kernel in ("auto", "tc"):
        tc = fa2_tc_default(d, causal, dtype)
        if tc is not None:
            return Tiling(*tc)
    if dtype not in FAST_DTYPES:
        kernel = "plain"
    if algorithm == "fa2" and kernel != "plain":
        fast = fa2_fast_default(d)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    if algorithm in ("standard", "fa1") and (
            kernel == "fast" or (kernel == "auto" and dtype == "fp32")):
        fast = other_fast_default(algorithm, d)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    return plain_default_tiling(algorithm, d, dtype)


def _check(name, x, dims=("batch", "heads", "N", "d"), layout=""):
    """(shape, numpy dtype, kind) of one input, with validation of ndim/dtype/layout.
    dims: the names of its axes (their number is the ndim required); layout: words
    added to the ndim error (e.g. whose layout it is)."""
    if isinstance(x, np.ndarray):
        kind = "numpy"
        shape, dt, contig = x.shape, x.dtype, x.flags.c_contiguous
    elif _torch_bf16(x):    # torch refuses __cuda_array_interface__ for bfloat16
        if not x.is_cuda:
            raise ValueError(f"{name} is a torch.bfloat16 tensor on {x.device}; allowed: "
                             f"CUDA tensors (or NumPy arrays)")
        kind = "cai"
        shape, dt, contig = tuple(x.shape), BF16, x.is_contiguous()
    elif hasattr(x, "copy_to_host") and hasattr(x, "is_c_contiguous"):  # numba device array
        kind = "numba"
        shape, dt, contig = x.shape, np.dtype(x.dtype), x.is_c_contiguous()
    elif hasattr(x, "__cuda_array_interface__"):                        # torch, CuPy, ...
        kind = "cai"
        cai = x.__cuda_array_interface__
        shape = tuple(cai["shape"])
        # ml_dtypes' bfloat16 describes itself as the 2-byte void '<V2': taken as bf16
        dt = BF16 if cai["typestr"] == BF16.str else np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contig = strides is None or tuple(strides) == tuple(
            int(np.prod(shape[i + 1:])) * dt.itemsize for i in range(len(shape)))
    else:
        raise ValueError(f"{name} must be a NumPy array or a CUDA device array "
                         f"(__cuda_array_interface__); got {type(x).__name__}")
    if len(shape) != len(dims):
        raise ValueError(f"{name} has shape {tuple(shape)} (ndim={len(shape)}); "
                         f"expected {len(dims)} dimensions ({', '.join(dims)}){layout}")
    if dt not in HOST_DTYPE.values():
        raise ValueError(f"{name} has dtype {dt}; allowed: float32, float16, bfloat16")
    if not contig:
        raise ValueError(f"{name} must be C-contiguous (row-major); make a contiguous copy")
    return tuple(int(s) for s in shape), dt, kind


def _torch_bf16(x) -> bool:
    """Whether x is a torch.bfloat16 tensor."""
    return _torch_like(x) is not None and str(getattr(x, "dtype", "")) == "torch.bfloat16"


def _bf16_bits(dev):
    """A Numba device array of bf16 (ml_dtypes.bfloat16 or '<V2') as the uint16 bits the
    kernels take (a view, no copy); other arrays unchanged."""
    if np.dtype(dev.dtype) == BF16 or np.dtype(dev.dtype) == np.dtype("V2"):
        return dev.view(NP_DTYPE["bf16"])
    return dev


def _to_device(x, kind):
    """The input as a Numba device array in its storage dtype (bf16: uint16 bits, a view
    of the caller's memory for device inputs)."""
    if kind == "numpy":
        h = x.view(NP_DTYPE["bf16"]) if x.dtype == BF16 else x
        # A C-contiguous array may carry any stride on a length-1 axis (x[None] has 0):
        # Numba copies the strides as they are, and its device reshape (the kernels take
        # (instances, N, d) views) then refuses with "operation requires copying". Copy
        # it flat and give it its shape on the device, with canonical strides.
        return cuda.to_device(np.ascontiguousarray(h).reshape(-1)).reshape(h.shape)
    if kind == "numba":
        return _bf16_bits(x)
    if _torch_bf16(x):
        # the int16 view has a __cuda_array_interface__ (bfloat16 has none); same stream
        # rule as below
        import torch
        return cuda.as_cuda_array(x.detach().view(torch.int16), sync=False).view(
            NP_DTYPE["bf16"])
    if _torch_like(x) is not None:
        # our kernels run on torch's current stream (`_torch_stream`), the stream torch
        # reports as the producer's: ordered after it without a host-blocking sync
        return cuda.as_cuda_array(x, sync=False)
    # Numba synchronises on the producer's stream before using a foreign array. Our
    # kernels run on the legacy default stream, which is already ordered after work on
    # that same stream (stream 1, or None = unspecified/legacy): skip the host-blocking
    # sync there, keep it for any other stream.
    stream = x.__cuda_array_interface__.get("stream")
    return _bf16_bits(cuda.as_cuda_array(x, sync=stream not in (None, 1)))


def _torch_like(like):
    """The torch module if `like` is a torch tensor, else None."""
    if type(like).__module__.split(".")[0] != "torch":
        return None
    import torch
    return torch


def _torch_stream(torch, device):
    """Raw handle of torch's current stream on `device` (0: the legacy default stream)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return int(get(device.index if device.index is not None else torch.cuda.current_device()))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _output(shape, npdt, kind, like, poison=True):
    """(caller-kind object or None, numba device view) of a new output; filled with NaN
    when `poison` (so elements no kernel writes show), else left uninitialised.

    torch callers get a torch tensor from torch's caching allocator on the current stream
    (the one the kernels run on; no cuMemAlloc / cuMemFree per call: Numba's deferred
    frees synchronise the device, which put a host round trip inside every timed call);
    others a Numba device array."""
    torch = _torch_like(like) if kind == "cai" else None
    if torch is None:
        if poison:       # bf16 (uint16 storage): the bits of a bf16 NaN
            return None, filled(shape, npdt, np.nan)
        return None, cuda.device_array(shape, dtype=npdt)
    tdt = _torch_dtype(torch, npdt)
    t = (torch.full(shape, float("nan"), device=like.device, dtype=tdt) if poison
         else torch.empty(shape, device=like.device, dtype=tdt))
    if tdt == torch.bfloat16:
        return t, cuda.as_cuda_array(t.view(torch.int16), sync=False).view(npdt)
    return t, cuda.as_cuda_array(t, sync=False)


def _torch_dtype(torch, npdt):
    """The torch dtype of an output whose device storage dtype is npdt (uint16: bf16)."""
    return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
            NP_DTYPE["bf16"]: torch.bfloat16}[np.dtype(npdt)]


def _no_band(common: dict) -> dict:
    """The launch keywords without N_k and window (kernels that take neither)."""
    return {k: v for k, v in common.items() if k not in ("N_k", "window")}


def _return_like(dev, kind, like):
    """Convert a numba device array back to the caller's kind (uint16 storage is bf16:
    NumPy / Numba callers get ml_dtypes.bfloat16, torch callers torch.bfloat16)."""
    bf16 = np.dtype(dev.dtype) == NP_DTYPE["bf16"]
    if kind == "numpy":
        host = dev.copy_to_host()
        return host.view(BF16) if bf16 else host
    if kind == "numba" or (bf16 and _torch_like(like) is None):
        return dev.view(BF16) if bf16 else dev     # CuPy has no bfloat16: a Numba array
    mod = type(like).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if bf16:
            return torch.as_tensor(dev.view(np.int16), device=like.device).view(torch.bfloat16)
        return torch.as_tensor(dev, device=like.device)
    if mod == "cupy":
        import cupy
        return cupy.asarray(dev)
    return dev




def _pick_kernel(kernel, fast, tensor_cores, algorithm, dname):
    """(kernel, allow_tc) from `attention`'s kernel= and the deprecated fast= and
    tensor_cores=; ValueError for a choice that cannot run whatever the tiling."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not allowed; allowed: "
                         f"{', '.join(repr(x) for x in KERNELS)}")
    if fast not in (None, True, False):
        raise ValueError(f"fast={fast!r} is not allowed; allowed: None, True, False "
                         f"(deprecated: use kernel='fast' or kernel='plain')")
    if tensor_cores not in (None, True, False):
        raise ValueError(f"tensor_cores={tensor_cores!r} is not allowed; allowed: None, True, "
                         f"False (deprecated: use kernel='tc')")
    allow_tc = True
    if fast is not None or tensor_cores is not None:
        given = ", ".join(f"{n}={x!r}" for n, x in (("fast", fast), ("tensor_cores", tensor_cores))
                          if x is not None)
        if kernel != "auto":
            raise ValueError(f"kernel={kernel!r} and the deprecated {given} were both given; "
                             f"give kernel= only")
        if fast is not None and tensor_cores:
            raise ValueError(f"{given}: contradictory (deprecated) choices; give kernel= only: "
                             f"'plain', 'fast' or 'tc'")
        if tensor_cores:
            kernel = "tc"
        elif fast is not None:
            kernel = "fast" if fast else "plain"
        allow_tc = tensor_cores is not False
        warnings.warn(f"gpu.attention: {given} is deprecated and will be removed in the next "
                      f"release; use kernel={kernel!r}"
                      + (" (tensor_cores=False: kernel='fast' or 'plain')"
                         if kernel == "auto" else ""), DeprecationWarning, stacklevel=4)
    if kernel == "fast" and algorithm not in FAST_ALGORITHMS:
        raise ValueError(f"kernel='fast' is not allowed for algorithm={algorithm!r}; allowed "
                         f"for: {', '.join(FAST_ALGORITHMS)}; {algorithm!r} has "
                         f"kernel='auto', 'plain' or (fp16) 'tc'")
    if kernel == "fast" and dname not in FAST_DTYPES:
        raise ValueError(f"kernel='fast' is not allowed for {dname}: the fast kernels take "
                         f"{', '.join(FAST_DTYPES)}; use kernel='auto' or 'plain'")
    dts = tc_dtypes(fa2_tc if algorithm == "fa2" else other_tc_module(algorithm))
    if kernel == "tc" and dname not in dts:
        names = " or ".join({"fp16": "float16", "bf16": "bfloat16"}.get(x, x) for x in dts)
        raise ValueError(f"kernel='tc' needs {names} inputs: the tensor-core {algorithm} "
                         f"kernels multiply {' or '.join(dts)} tiles (got {dname}); use "
                         f"kernel='auto'"
                         + (" or 'fast'" if algorithm == "fa2" and dname in FAST_DTYPES
                            else " or 'plain'"))
    return kernel, allow_tc


#: The kernel= choices that apply dropout, per algorithm: fa2's plain, fast (fp32 math,
#: CUDA cores) and tensor-core kernels, forward and backward; fa1's plain, fast and
#: tensor-core forward kernels and its (one, plain) backward; standard's plain, fast and
#: tensor-core forward kernels (the unfused graph's dropout: the softmax kernel stores the
#: keep mask Z in HBM, uint8, the PV kernel reads it) and its plain and tensor-core
#: backward (lines 1 and 2 read Z; standard has no fast backward: kernel='fast' there is
#: refused for every p). 'auto' picks among them as it would without dropout.
DROPOUT_KERNELS = {"fa2": ("auto", "plain", "fast", "tc"),
                   "fa1": ("auto", "plain", "fast", "tc"),
                   "standard": ("auto", "plain", "fast", "tc")}


def _check_dropout(dropout_p, dropout_seed, dropout_offset, algorithm, kernel):
    """(p, seed, offset) for dropout_p > 0, None for 0; ValueError (iosim ConfigError)
    for a bad p, seed or offset, or for a kernel without dropout (`DROPOUT_KERNELS`
    lists those with it), naming dropout_p, the algorithm and kernel, and what is
    allowed."""
    from iosim.dropout import check_dropout_p, check_seed
    p = check_dropout_p(dropout_p)
    seed, offset = check_seed(dropout_seed, dropout_offset)
    if not p:
        return None
    allowed = DROPOUT_KERNELS.get(algorithm)
    if allowed is None:
        raise ValueError(f"dropout_p={p} is not supported by algorithm={algorithm!r}; "
                         f"allowed: algorithm=" + " or ".join(map(repr, DROPOUT_KERNELS)))
    if kernel not in allowed:
        raise ValueError(f"dropout_p={p} is not supported by the {algorithm} "
                         f"kernel={kernel!r}: it has no dropout; allowed with dropout: "
                         f"kernel=" + ", ".join(map(repr, allowed)))
    return p, seed, offset


def attention(q, k, v, *, algorithm="fa2", causal=False, scale=None, block_rows=None,
              block_cols=None, sram_bytes=None, block_mask=None, count_traffic=False,
              return_stats=False, threads=None, kernel="auto", fast=None, tensor_cores=None,
              poison=None, window=(-1, -1), dropout_p=0.0, dropout_seed=0, dropout_offset=0):
    """Exact attention O = softmax(scale Q K^T [+ causal/block mask]) V on the GPU.

    q: (batch, heads, N_q, d); k, v: (batch, kv_heads, N_k, d) with kv_heads dividing heads
    (query head h uses K/V head h // (heads // kv_heads)). float32, float16 or bfloat16
    (NumPy / Numba: ml_dtypes.bfloat16; torch.bfloat16; a '<V2' __cuda_array_interface__),
    all the same dtype, C-contiguous; d any integer in 1..256 (module docstring: Head
    dims). bf16 runs on the plain kernels (or a tensor-core kernel whose module lists
    "bf16" in DTYPES), never the fast ones, and comes back bf16 in the caller's kind.
    NumPy in -> NumPy out (copied); a device array in (numba, or any __cuda_array_interface__ object such as a torch tensor; not
    in the simulator) -> the same kind out, without copying the inputs.

    algorithm: 'standard' | 'fa1' | 'fa2'. scale: default 1/sqrt(d); must be finite in
    float32. NaN or Inf in q, k, v gives NaN wherever iosim.reference_attention has NaN
    (README: Non-finite inputs); only a row that sees no key gets O = 0, L = -inf.
    Tiling: block_rows=B_r and block_cols=B_c, or sram_bytes=M (bytes; the paper's
    rule B_c = ceil(M/4d), B_r = min(B_c, d) in elements of the dtype), or neither
    (`default_tiling`). A tiling whose shared-memory footprint exceeds the device's
    per-block maximum raises ValueError.
    causal: row r sees key c iff c <= r + N_k - N_q (bottom-right aligned, as flash-attn
    >= 2.1; iosim.Problem). window=(left, right): flash-attn's window_size, row r sees
    keys r + N_k - N_q - left .. r + N_k - N_q + right, -1 unbounded; with causal, right
    must be -1 or 0 (ValueError naming both otherwise). A row that sees no key gets
    O = 0, L = -inf; tiles with no visible pair are skipped (no traffic). Every kernel
    (standard, fa1, the three fa2) runs every variant.
    block_mask: bool (T_r, T_c) over (query block, key block), T_r = ceil(N_q / B_r),
    T_c = ceil(N_k / B_c); False tiles are skipped.
    count_traffic: compile the instrumented kernels and return the ledger of elements
    they loaded/stored (problem totals, comparable with iosim.closed_form).
    return_stats: also return L (fa2, fa1).
    threads: threads per block (default `_launch.default_threads()`: 128 on a GPU,
    16 in the simulator; the fast kernels: their tiling's own, see FA2_FAST_TILES,
    STANDARD_FAST_TILES, FA1_FAST_TILES); the plain kernels stride over their work, so any
    1..1024 works; a fast kernel takes the thread counts its plan_error accepts.
    kernel: which kernel runs the schedule (module docstring). fa2: "auto": `gpu.forward.fa2_tc`
    (tensor cores) for fp16 where it runs the tiling (a GPU, d a multiple of 16, B_r = 16
    x warps, 16-byte aligned inputs), else `gpu.forward.fa2_fast` where it supports the tiling,
    else the plain `gpu.forward.fa2`; "plain" / "fast" / "tc": that kernel or a ValueError
    saying why it cannot run. standard: "auto" runs `gpu.forward.standard_tc` for fp16 where
    it runs, `gpu.forward.standard_fast` (register-tiled, fp32 math) for fp32 where it
    supports the tiling and thread count, else the plain `gpu.forward.standard`; "fast"
    runs standard_fast for fp32 or fp16 inputs. fa1 likewise: `gpu.forward.fa1_tc`,
    `gpu.forward.fa1_fast`, the plain `gpu.forward.fa1`.
    All of them run the same schedule: same ledger, outputs equal to rounding (fa2_tc
    rounds P to fp16 before P V, as FlashAttention-2 does).
    fast, tensor_cores: deprecated (DeprecationWarning; removed in the next release);
    fast=True -> kernel="fast", fast=False -> "plain", tensor_cores=True -> "tc",
    tensor_cores=False -> "auto" without the tensor-core kernel.
    poison: fill every output with NaN before the kernels run, so an element no kernel
    writes shows as NaN (validation; costs one fill launch per output). None (default):
    `POISON` (off unless FLASHSIM_POISON=1; `flashsim check` and the test suite turn it
    on; `poison_outputs(True)` for a block of code).
    Returns O; (O, ledger) with count_traffic; (O, L) with return_stats; (O, L, ledger)
    with both. Outputs are new arrays on every call.
    dropout_p: drop probability p of each entry of P (0 <= p < 1; default 0, no dropout):
    O = (P o Z / (1 - p)) V, L the logsumexp before dropout (Algorithm 2). The keep mask
    Z is Philox's, keyed by (dropout_seed, dropout_offset, batch, head, row, col)
    (iosim.dropout; 0 <= seed < 2^64, 0 <= offset < 2^32), regenerated by
    gpu.attention_backward from the same seed and offset. p > 0 runs on fa2's and fa1's
    tensor-core (fp16, bf16), fast and plain kernels (Z applied on chip to the P~
    entering the PV product; no extra traffic), and on all three of standard's (plain,
    fast, tensor-core: the unfused graph's dropout, whose softmax kernel stores Z in HBM,
    uint8, and whose PV kernel reads it; the same Philox bits as the fused kernels, so
    the three give the same O to rounding for the same seed and offset): kernel 'auto'
    picks the kernel it would pick without dropout, for every algorithm
    (`DROPOUT_KERNELS`). It takes the full call path (no plan).

    Call path: the first call of a kind checks everything and records its launches into
    a plan; a repeat with the same plan key (see `_plan_key`: shapes, dtype, strides,
    device, alignment and every option) on device arrays, without count_traffic, takes
    the thin path: read the data pointers, allocate the outputs, launch the recorded
    kernels. torch tensors in: the kernels run on torch's current stream and the outputs
    come from torch's caching allocator on it (module docstring: Call path).
    """
    # every option by name, in signature order (first statement: only the parameters are
    # local yet): a parameter added to `attention` joins the plan key by itself
    opts = dict(locals())
    del opts["q"], opts["k"], opts["v"]
    global thin_calls
    opts["poison"] = POISON if poison is None else bool(poison)
    key = ptrs = None
    if (THIN and not count_traffic and fast is None and tensor_cores is None
            and (SIM or _launch.FAST_LAUNCH) and not dropout_p
            and (algorithm in ("fa2", "standard") or (algorithm == "fa1" and not return_stats))):
        try:
            key, ptrs = _plan_key(q, k, v, opts)
            plan = None if key is None else _PLANS.get(key)
        except Exception:       # odd input or an unhashable option: the full path (its
            key = plan = None   # checks raise the error that input deserves), no plan
        if plan is not None:
            if plan is not _NO_PLAN:
                try:
                    out = plan(q, k, v, ptrs)
                except Exception as exc:
                    if plan.calls:
                        raise
                    _PLANS[key] = _NO_PLAN   # never worked: the full path from now on
                    warnings.warn(f"gpu.attention: the thin call path failed on its first "
                                  f"use ({type(exc).__name__}: {exc}); this kind of call "
                                  f"takes the full path from now on", RuntimeWarning,
                                  stacklevel=2)
                else:
                    plan.calls += 1
                    thin_calls += 1
                    return out
            key = None
    return _attention_full(q, k, v, plan_key=key, **opts)


def _attention_full(q, k, v, *, algorithm, causal, scale, block_rows, block_cols, sram_bytes,
                    block_mask, count_traffic, return_stats, threads, kernel, fast,
                    tensor_cores, poison, window, plan_key, dropout_p=0.0, dropout_seed=0,
                    dropout_offset=0):
    """`attention` with every check, recording its launches into a plan for `plan_key`
    (None: no plan)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    (B, H, N, d), dt, kind = _check("q", q)
    (Bk, Hk, Nk, dk), dtk, kindk = _check("k", k)
    shape_v, dtv, kindv = _check("v", v)
    if (Bk, dk) != (B, d) or shape_v != (Bk, Hk, Nk, dk):
        raise ValueError(f"k has shape {(Bk, Hk, Nk, dk)} and v has shape {shape_v}; both "
                         f"must be (batch={B}, kv_heads, N_k, d={d}), the same, to match q "
                         f"{(B, H, N, d)}")
    if H % Hk:
        raise ValueError(f"k/v have kv_heads={Hk}, which must divide q's heads={H}")
    if dtk != dt or dtv != dt:
        raise ValueError(f"q, k, v dtypes are {dt}, {dtk}, {dtv}; they must be the same")
    if len({kind == "numpy", kindk == "numpy", kindv == "numpy"}) != 1:
        raise ValueError("q, k, v must all be NumPy arrays or all be device arrays")
    iosim.check_head_dim(d)     # ValueError naming d and 1..256
    if return_stats and algorithm == "standard":
        raise ValueError("return_stats=True is supported for algorithm='fa1' or 'fa2', "
                         "not 'standard'")
    dname = dtype_name(dt)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32 "
                         f"(|scale| <= {float(np.finfo(np.float32).max):.8g}), the kernels' "
                         f"compute dtype")
    kernel, allow_tc = _pick_kernel(kernel, fast, tensor_cores, algorithm, dname)
    dropout = _check_dropout(dropout_p, dropout_seed, dropout_offset, algorithm, kernel)
    # the kernels that apply dropout (DROPOUT_KERNELS): all three of fa2's, fa1's and
    # standard's; 'auto' picks among them as it does without dropout
    if threads is not None and not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")

    def plan(kernel):
        """(tiling, B_r, B_c, and the two descriptions the errors below use)."""
        if block_rows is None and block_cols is None and sram_bytes is None:
            t = default_tiling(algorithm, d, dname, bool(causal), kernel)
        else:
            t = resolve_tiling(algorithm, d, dname, block_rows=block_rows,
                               block_cols=block_cols, sram_bytes=sram_bytes)
        return (t, t.B_r, t.B_c,
                f"algorithm={algorithm!r} with B_r={t.B_r}, B_c={t.B_c}, d={d}, {dname}",
                f"B_r={t.B_r}, B_c={t.B_c}, d={d}")

    tiling, B_r, B_c, what, tiles = plan(kernel)
    use_tc = False
    if algorithm == "fa2" and kernel in ("auto", "tc") and allow_tc:
        mt = fa2_tc_mt(B_r, B_c, d)
        why = fa2_tc.plan_error(B_r, B_c, d, dname, mt)
        if why is None and SIM:
            why = "the CUDA simulator cannot run its linked C++ tile functions"
        tc_threads = fa2_tc.threads_per_block(B_r, mt)
        if why is None and threads is not None and int(threads) != tc_threads:
            why = (f"it runs 2 B_r / MT = {tc_threads} threads (one warp per {16 * mt} "
                   f"rows), not {threads}")
        if why is None and not all(_aligned16(x, kd) for x, kd in
                                   ((q, kind), (k, kindk), (v, kindv))):
            why = "q, k and v must be 16-byte aligned"
        if why is None:
            fp = fa2_tc.layout(B_r, B_c, d)["bytes"]
            if fp > device_smem_limit():
                why = f"it needs {fp} bytes of shared memory, more than this device allows"
        if why is not None and kernel == "tc":
            raise ValueError(f"kernel='tc': the tensor-core fa2 kernel cannot run {dname} "
                             f"with {tiles}: {why}")
        use_tc = why is None
    use_fast = False
    if algorithm == "fa2" and kernel in ("auto", "fast") and not use_tc and \
            dname in FAST_DTYPES:
        t_fast = fa2_fast_threads(B_r, B_c, d, None if threads is None else int(threads))
        if t_fast is None and kernel == "fast":
            raise ValueError(f"kernel='fast': the fast fa2 kernel cannot run {dname} with "
                             f"{tiles}, threads={threads} on this device (see "
                             f"gpu.forward.fa2_fast.plan and smem_bytes); use kernel='auto' or other "
                             f"tiles")
        if t_fast is not None:
            use_fast, threads = True, t_fast
    # fa1 and standard on the tensor cores (fp16): gpu.forward.fa1_tc, gpu.forward.standard_tc
    use_other_tc = False
    other_opts = {}
    if algorithm in ("fa1", "standard") and kernel in ("auto", "tc"):
        if algorithm == "fa1":
            dflt = fa1_tc.default_tiling(d, bool(causal))
            if (dflt["B_r"], dflt["B_c"]) == (B_r, B_c):
                other_opts = dict(MT=dflt["MT"], stages=dflt["stages"])
            else:
                other_opts = dict(MT=1, stages=2)
            why = fa1_tc.plan_error(B_r, B_c, d, dname, **other_opts)
        else:
            why = standard_tc.plan_error(B_r, B_c, d, dname)
        if why is None and SIM:
            why = "the CUDA simulator cannot run its linked C++ tile functions"
        if why is None and (Nk != N or tuple(window) != (-1, -1)):
            why = "it takes N_k = N and no window only"
        if why is None and algorithm == "fa1" and threads is not None and \
                int(threads) != fa1_tc.threads_per_block(B_r, other_opts["MT"]):
            why = (f"it runs {fa1_tc.threads_per_block(B_r, other_opts['MT'])} threads "
                   f"(one warp per {16 * other_opts['MT']} rows), not {threads}")
        if why is None and not all(_aligned16(x, kd) for x, kd in
                                   ((q, kind), (k, kindk), (v, kindv))):
            why = "q, k and v must be 16-byte aligned"
        if why is None:
            ok = (fa1_tc.supports(B_r, B_c, d, dname, **other_opts) if algorithm == "fa1"
                  else standard_tc.supports(B_r, B_c, d, dname, N=N))
            if not ok:
                why = "its shared memory does not fit this device"
        if why is not None and kernel == "tc":
            raise ValueError(f"kernel='tc': the tensor-core {algorithm} kernels cannot run "
                             f"{dname} with {tiles}: {why}")
        use_other_tc = why is None
    # standard's and fa1's register-tiled kernels (gpu.forward.standard_fast, fa1_fast):
    # kernel='auto' for fp32, 'fast' for fp32 or fp16
    use_other_fast = False
    if algorithm in ("standard", "fa1") and not use_other_tc and (
            kernel == "fast" or (kernel == "auto" and dname == "fp32")):
        given = None if threads is None else int(threads)
        t_fast = other_fast_threads(algorithm, B_r, B_c, d, dname, given, Nk)
        if t_fast is not None:
            use_other_fast, threads = True, t_fast
        elif kernel == "fast":
            mod = _other_fast(algorithm)[0]
            cands = _other_fast_candidates(algorithm, B_r, B_c, given)
            why = (mod.plan_error(B_r, B_c, d, cands[0], dname) if len(cands) == 1
                   else None) or (
                f"no thread count in {', '.join(map(str, cands))} fits its plan and this "
                f"device's shared memory (gpu.forward.{mod.__name__.split('.')[-1]}"
                f".plan_error and its shared-memory size"
                + (f"; the softmax row needs 4 N_k = {4 * Nk} bytes)" if algorithm ==
                   "standard" else ")"))
            raise ValueError(f"kernel='fast': the fast {algorithm} kernels cannot run {dname} "
                             f"with {tiles}, threads={threads}: {why}; use kernel='auto' "
                             f"or other tiles")
    fast_opts = {}
    if use_other_tc:
        if algorithm == "fa1":
            threads = fa1_tc.threads_per_block(B_r, other_opts["MT"])
    elif use_tc:
        check_fits(fa2_tc.layout(B_r, B_c, d)["bytes"], what + " (tensor-core kernel)")
        threads = tc_threads
    elif use_fast:   # O and S live in registers: its own shared-memory layout
        # warp-shuffle row reductions on hardware (the simulator has no shuffles)
        fast_opts = dict(shfl=not SIM, **fa2_fast_options(B_r, B_c, d, threads))
        check_fits(fa2_fast.smem_bytes(B_r, B_c, d, threads, fast_opts.get("TC"),
                                       shfl=fast_opts["shfl"], stage=fast_opts.get("stage", 0)),
                   what + " (fast kernel)")
    elif use_other_fast:
        fast_opts = other_fast_options(algorithm, B_r, B_c, threads)
        check_fits(standard_fast.shared_bytes(B_r, B_c, d, threads) if algorithm == "standard"
                   else fa1_fast.smem_bytes(B_r, B_c, d, threads, shfl=not SIM),
                   what + " (fast kernels)")
    else:
        check_fits(sram_footprint_bytes(algorithm, B_r, B_c, d, dname), what)
    if algorithm == "standard" and not use_other_tc:
        check_fits(4 * Nk, f"the standard softmax row of N_k={Nk} float32")
    threads = default_threads() if threads is None else int(threads)
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, block_mask=block_mask, N_k=Nk, window=window,
                            dropout_p=0.0 if dropout is None else dropout[0])
    active = iosim.active_tiles(problem, tiling)   # validates block_mask's shape
    mask_dev = None
    if block_mask is not None:
        mask_dev = cuda.to_device(np.ascontiguousarray(problem.block_mask, dtype=np.uint8))

    qd, kd, vd = (_to_device(x, kind) for x in (q, k, v))
    q3 = qd.reshape(B * H, N, d)
    k3 = kd.reshape(B * Hk, Nk, d)
    v3 = vd.reshape(B * Hk, Nk, d)
    G = H // Hk
    npdt = NP_DTYPE[dname]
    torch = _torch_like(q) if kind == "cai" else None
    # torch: run on its current stream (0 when that is the default stream)
    handle = _torch_stream(torch, q.device) if torch is not None else 0
    o_obj, o3 = _output((B * H, N, d), npdt, kind, q, poison)
    counters = new_counters(count_traffic)
    common = dict(B_r=B_r, B_c=B_c, dt=dname, causal=bool(causal), count=bool(count_traffic),
                  threads=threads, N_k=Nk, window=problem.window)
    L = None
    views = {"q": q3, "k": k3, "v": v3, "o": o3}
    record = _launch.recording() if plan_key is not None else contextlib.nullcontext()
    with _launch.on_stream(handle), record as launches:
        if algorithm == "fa2":
            L_obj, L2 = _output((B * H, N), np.dtype(np.float32), kind, q, poison)
            views["L"] = L2
            if use_tc:
                fa2_tc.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, MT=mt,
                           **common, dropout=dropout)
            elif use_fast:
                fa2_fast.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, **common,
                             **fast_opts, dropout=dropout)
            else:
                fa2.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, **common,
                        dropout=dropout)
            L = L2 if L_obj is None else L_obj
        elif algorithm == "fa1":
            _l, l2 = _output((B * H, N), np.dtype(np.float32), kind, q, poison)
            _m, m2 = _output((B * H, N), np.dtype(np.float32), kind, q, poison)
            views.update(l=l2, m=m2)
            if use_other_tc:
                fa1_tc.run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask_dev, counters,
                           **_no_band(common), **other_opts, dropout=dropout)
            elif use_other_fast:
                fa1_fast.run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask_dev, counters,
                             **common, **fast_opts, dropout=dropout)
            else:
                fa1.run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask_dev, counters, **common,
                        dropout=dropout)
            if return_stats:
                if handle:
                    torch.cuda.current_stream(q.device).synchronize()
                lh, mh = l2.copy_to_host(), m2.copy_to_host()
                with np.errstate(divide="ignore", invalid="ignore"):
                    Lh = mh + np.log(lh)   # no key: -inf + log 0 = -inf; NaN l or m: NaN
                L = cuda.to_device(Lh.astype(np.float32))
        else:
            _s, s3 = _output((B * H, N, Nk), npdt, kind, q, poison)  # S, P: HBM scratch
            _p, p3 = _output((B * H, N, Nk), npdt, kind, q, poison)  # (kept alive by _s, _p)
            views.update(s=s3, p=p3)
            drop = {}
            if dropout is not None:      # the keep mask Z: uint8 HBM scratch
                drop = dict(z3=cuda.device_array((B * H, N, Nk), dtype=np.uint8),
                            dropout=dropout)
            if use_other_fast:
                standard_fast.run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask_dev, active,
                                  counters, **common, **fast_opts, **drop)
            else:
                (standard_tc if use_other_tc else standard).run(
                    q3, k3, v3, o3, s3, p3, scale, N, H, G, mask_dev, active, counters,
                    **(_no_band(common) if use_other_tc else common), **drop)
    O = (o_obj.reshape(B, H, N, d) if o_obj is not None
         else _return_like(o3.reshape(B, H, N, d), kind, q))
    out = [O]
    if return_stats:
        out.append(L.reshape(B, H, N) if _torch_like(L) is not None
                   else _return_like(L.reshape(B, H, N), kind, q))
    if count_traffic:
        if handle:
            torch.cuda.current_stream(q.device).synchronize()
        out.append(counters_to_ledger(counters, algorithm, problem, tiling))
    if plan_key is not None:
        try:
            plan = _Plan.build(launches, views, kind, torch, poison, return_stats,
                               (B, H, N, d))
        except Exception:       # a plan is an optimisation: never fail a call over it
            plan = None
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[plan_key] = _NO_PLAN if plan is None else plan
    return out[0] if len(out) == 1 else tuple(out)


# ---------------------------------------------------------------------------------------
# The thin call path: plan keys and plans
# ---------------------------------------------------------------------------------------
_PLANS: dict = {}
_NO_PLAN = object()     # a key whose calls always take the full path
#: plans kept at most (all are dropped when full: rebuilt on the next call of each kind)
MAX_PLANS = 256
#: calls that took the thin path in this process (tests check it is taken)
thin_calls = 0


def _poison_default() -> bool:
    return os.environ.get("FLASHSIM_POISON", "0").strip().lower() not in ("", "0", "false",
                                                                           "no", "off")


#: Outputs NaN-filled before the kernels run (validation), unless `poison=` says
#: otherwise. Off by default; FLASHSIM_POISON=1 (read at import), `set_poison`,
#: `poison_outputs` turn it on; `flashsim check` and the tests run with it on.
POISON = _poison_default()
#: The thin path on repeat calls (FLASHSIM_THIN=0 turns it off: every call takes the
#: full path; `thin_path(False)` for a block). On a GPU it also needs _launch.FAST_LAUNCH.
THIN = os.environ.get("FLASHSIM_THIN", "1") != "0"


def set_poison(enabled: bool) -> bool:
    """Set `POISON` (the default of attention's poison=); returns the previous value."""
    global POISON
    prev, POISON = POISON, bool(enabled)
    return prev


@contextlib.contextmanager
def poison_outputs(enabled: bool = True):
    """`with poison_outputs():` calls without poison= NaN-fill their outputs; restored
    after (also when the block raises)."""
    prev = set_poison(enabled)
    try:
        yield
    finally:
        set_poison(prev)


@contextlib.contextmanager
def thin_path(enabled: bool):
    """`with thin_path(False):` every call takes the full path (True: repeat calls take
    the thin one); THIN is restored after."""
    global THIN
    saved, THIN = THIN, bool(enabled)
    try:
        yield
    finally:
        THIN = saved


def _describe_torch(x):
    return (x.shape, x.dtype, x.stride(), x.device, x.requires_grad), x.data_ptr()


def _describe_numba(x):
    return ((x.shape, x.dtype, x.strides),
            0 if SIM else (x.device_ctypes_pointer.value or 0))


def _describe_cai(x):
    c = x.__cuda_array_interface__
    if c.get("stream") not in (None, 1):
        # the full path synchronises with that producer stream on every call: no plan
        raise LookupError("producer stream")
    st = c.get("strides")
    return ((tuple(c["shape"]), c["typestr"], None if st is None else tuple(st)),
            c["data"][0])


_DESCRIBERS: dict = {}


def _describer(t):
    """How to describe an input of type t for the plan key: (hashable description,
    data pointer); None for types that always take the full path (NumPy arrays...)."""
    f = _DESCRIBERS.get(t, _NO_PLAN)
    if f is _NO_PLAN:
        if t.__module__.split(".")[0] == "torch" and hasattr(t, "data_ptr"):
            f = _describe_torch
        elif hasattr(t, "copy_to_host") and hasattr(t, "is_c_contiguous"):
            f = _describe_numba
        elif hasattr(t, "__cuda_array_interface__") and not SIM:
            f = _describe_cai
        else:
            f = None
        _DESCRIBERS[t] = f
    return f


def _call_options(**kwargs) -> dict:
    """`attention`'s options as it builds them for `_plan_key` (every parameter but q, k,
    v, by name, defaults filled in, poison resolved); TypeError for an unknown one."""
    import inspect
    bound = inspect.signature(attention).bind(None, None, None, **kwargs)
    bound.apply_defaults()
    opts = dict(bound.arguments)
    del opts["q"], opts["k"], opts["v"]
    opts["poison"] = POISON if opts["poison"] is None else bool(opts["poison"])
    return opts


def _plan_key(q, k, v, opts: dict):
    """(key, {'q': ptr, 'k': ptr, 'v': ptr}) of a call, or (None, None) where it always
    takes the full path. The key holds what every check and choice of the full path
    depends on: each input's type, shape, dtype, strides (hence contiguity), device
    (torch) and requires_grad (torch); whether all three data pointers are 16-byte
    aligned (the tensor-core kernel needs it); every option of `attention` by name (a
    block mask by its shape, dtype and bytes). A call whose key has no plan takes the
    full path, so bad input always meets the full checks and their errors."""
    fq, fk, fv = _describer(type(q)), _describer(type(k)), _describer(type(v))
    if fq is None or fk is None or fv is None:
        return None, None
    (dq, pq), (dk, pk), (dv, pv) = fq(q), fk(k), fv(v)
    items = tuple(opts.items())
    if opts.get("block_mask") is not None:
        m = np.asarray(opts["block_mask"])
        items = tuple((n, (m.shape, m.dtype.str, m.tobytes()) if n == "block_mask" else x)
                      for n, x in items)
    key = (type(q), dq, type(k), dk, type(v), dv, (pq | pk | pv) & 15 == 0, items)
    return key, {"q": pq, "k": pk, "v": pv}


def _span(a):
    """[start, end) of a device array's bytes; None for anything else (scalars)."""
    if SIM:
        ary = getattr(a, "_ary", None)       # the simulator's arrays wrap a NumPy array
        if not isinstance(ary, np.ndarray):
            return None
        start = ary.__array_interface__["data"][0]
        return start, start + ary.nbytes
    ptr = getattr(a, "device_ctypes_pointer", None)
    if ptr is None:
        return None
    start = ptr.value or 0
    return start, start + a.size * a.dtype.itemsize


class _Plan:
    """What a repeat call needs: the recorded launches (`_launch.ThinLaunch`) and the
    outputs to allocate: (slot, shape the caller gets, 3-D shape the kernels see,
    NumPy dtype)."""
    __slots__ = ("launches", "outs", "kind", "torch", "poison", "stats", "shape", "calls",
                 "tdt")

    @classmethod
    def build(cls, launches, views, kind, torch, poison, stats, shape):
        """A plan from a full call's recorded launches, or None where one cannot be made.
        Each array argument that is one of the call's own arrays (`views`: q, k, v
        views, outputs, scratch) becomes a slot, by identity; every other argument is a
        constant of the plan (scalars, dummy or block-mask arrays)."""
        slot_of = {id(a): name for name, a in views.items()}
        spans = [_span(a) for a in views.values()]
        thin = []
        for kern, grid, block, shmem, args in launches:
            slots = [slot_of.get(id(a)) for a in args]
            for a, slot in zip(args, slots):
                # a constant must not alias the call's own memory: a view of q or o made
                # inside a `run` (not the object itself) would be replayed with the first
                # call's pointer. No plan then: such calls always take the full path.
                sp = None if slot is not None else _span(a)
                if sp is not None and any(v is not None and sp[0] < v[1] and v[0] < sp[1]
                                          for v in spans):
                    return None
            t = _launch.thin_launch(kern, grid, block, shmem, args, slots)
            if t is None:
                return None
            thin.append(t)
        if not thin:
            return None
        B, H, N, d = shape
        p = cls()
        p.launches, p.kind, p.torch, p.poison, p.stats = tuple(thin), kind, torch, poison, stats
        p.shape, p.calls = shape, 0
        user = {"o": (B, H, N, d), "L": (B, H, N)}
        p.outs = tuple((name, user.get(name, tuple(a.shape)), tuple(a.shape), np.dtype(a.dtype))
                       for name, a in views.items() if name not in ("q", "k", "v"))
        if torch is not None:
            p.tdt = {npdt: _torch_dtype(torch, npdt) for _n, _s, _s3, npdt in p.outs}
        return p

    def __call__(self, q, k, v, ptrs):
        if self.torch is not None:
            torch, dev = self.torch, q.device
            arrays = {}
            for name, shape, _shape3, npdt in self.outs:
                t = (torch.full(shape, math.nan, dtype=self.tdt[npdt], device=dev)
                     if self.poison else torch.empty(shape, dtype=self.tdt[npdt], device=dev))
                arrays[name] = t
                ptrs[name] = t.data_ptr()
            stream = _launch.core_stream(_torch_stream(torch, dev))
            for t in self.launches:
                t.go(stream, arrays, ptrs)
            return (arrays["o"], arrays["L"]) if self.stats else arrays["o"]
        B, H, N, d = self.shape
        arrays = {}
        if SIM:     # the simulator launches through Numba: it needs the input views
            arrays["q"] = _bf16_bits(q).reshape(B * H, N, d)
            arrays["k"] = _bf16_bits(k).reshape(k.shape[0] * k.shape[1], N, d)
            arrays["v"] = _bf16_bits(v).reshape(v.shape[0] * v.shape[1], N, d)
        for name, _shape, shape3, npdt in self.outs:
            a = filled(shape3, npdt, np.nan) if self.poison else cuda.device_array(shape3, npdt)
            arrays[name] = a
            if not SIM:
                ptrs[name] = a.device_ctypes_pointer.value or 0
        stream = None if SIM else _launch.core_stream(0)
        for t in self.launches:
            t.go(stream, arrays, ptrs)
        O = _return_like(arrays["o"].reshape(B, H, N, d), self.kind, q)
        if not self.stats:
            return O
        return O, _return_like(arrays["L"].reshape(B, H, N), self.kind, q)


def kernel_launcher(q, k, v, **kwargs):
    """The kernels of `attention(q, k, v, **kwargs)` alone, for timing them without the
    call: returns `launch(q, k, v)`, which enqueues the same compiled kernels with the same
    launch configuration on inputs like these (same plan key: shape, dtype, strides,
    device, alignment) and writes outputs allocated once, here (O is returned; the same
    array on every launch). No checks, no allocation, no plan look-up: what `flashsim
    bench` times as `fa2_kernel`. Device inputs only; ValueError where `attention` has no
    thin path for these arguments (NumPy inputs, count_traffic, fa1 with return_stats)."""
    opts = _call_options(**kwargs)
    with thin_path(True):
        attention(q, k, v, **opts)           # builds the plan (the full path) if none yet
    key, _ptrs = _plan_key(q, k, v, opts)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None or plan is _NO_PLAN:
        raise ValueError("kernel_launcher: these arguments take attention's full path on "
                         "every call (device inputs only; no count_traffic; fa1 without "
                         "return_stats; no dropout)")
    arrays, fixed = {}, {}
    B, H, N, d = plan.shape
    for name, shape, shape3, npdt in plan.outs:
        if plan.torch is not None:
            t = plan.torch.empty(shape, dtype=plan.tdt[npdt], device=q.device)
            arrays[name], fixed[name] = t, t.data_ptr()
        else:
            a = cuda.device_array(shape3, npdt)
            arrays[name] = a
            fixed[name] = 0 if SIM else (a.device_ctypes_pointer.value or 0)
    o_ret = (arrays["o"] if plan.torch is not None
             else _return_like(arrays["o"].reshape(B, H, N, d), "numba", q))
    launches = plan.launches
    describe = (_describer(type(q)), _describer(type(k)), _describer(type(v)))
    torch = plan.torch

    def launch(q, k, v):
        ptrs = dict(fixed, q=describe[0](q)[1], k=describe[1](k)[1], v=describe[2](v)[1])
        if SIM:
            arrays.update(q=_bf16_bits(q).reshape(B * H, N, d),
                          k=_bf16_bits(k).reshape(-1, N, d), v=_bf16_bits(v).reshape(-1, N, d))
        stream = (None if SIM else _launch.core_stream(
            _torch_stream(torch, q.device) if torch is not None else 0))
        for t in launches:
            t.go(stream, arrays, ptrs)
        return o_ret
    return launch


def attention_result(q, k, v, **kwargs) -> AttentionResult:
    """Like `attention`, returning an AttentionResult (O, L where available, ledger)."""
    algorithm = kwargs.get("algorithm", "fa2")
    stats = algorithm != "standard"
    res = attention(q, k, v, return_stats=stats, **kwargs)
    res = res if isinstance(res, tuple) else (res,)
    O = res[0]
    L = res[1] if stats else None
    ledger = res[-1] if kwargs.get("count_traffic") else None
    return AttentionResult(O, L, ledger)
