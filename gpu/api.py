"""`gpu.attention`: run one of the forward kernels on (batch, heads, N, d) arrays.

Three fa2 kernels run the same schedule (hence the same traffic and the same ledger):
`gpu.forward.fa2` (the plain one: one thread per tile element, S and O tiles in shared memory,
easy to hold next to the paper), `gpu.forward.fa2_fast` (register-tiled S = Q K^T and P V
micro-products on the CUDA cores, fp32 math) and `gpu.forward.fa2_tc` (fp16 only: the tile
products on the tensor cores through linked CUDA C++). One parameter picks among them,
`kernel=`: "auto" (default: the tensor-core kernel for fp16 where it runs, else the fast
kernel where it supports the tiling and thread count, else the plain one), "plain",
"fast" or "tc" (ValueError naming kernel, dtype, tiling and the reason where the choice
cannot run). The older `fast=` and `tensor_cores=` still work for one release, with a
DeprecationWarning, mapped onto `kernel=`.

Default tiling (no block_rows/block_cols/sram_bytes given):
* fa2 with fp16 on a GPU: `FA2_TC_TILES[d]` (`FA2_TC_TILES_CAUSAL[d]` when causal)
  (B_r, B_c) of the tensor-core kernel `gpu.forward.fa2_tc` (one warp per 16 MT query rows, MT
  from `FA2_TC_MT`), when it runs there (d a multiple of 16): d=64 128 x 64 (causal
  64 x 64), d=128 64 x 64;
* fa2 otherwise on a GPU: `FA2_FAST_TILES[d]` (B_r, B_c, threads), the fastest fp32 variant of
  the fast kernel measured on the H100 at N=4096 (tuning notes: docs/measurements.md):
  256 x 32 tiles, 512 threads,
  8 threads per query row, registers capped at 128, the next K/V tile's loads issued
  into registers before this tile's arithmetic (`fa2_fast_options`), for d = 64 and 128;
* otherwise (fa1, standard, the simulator): the largest square tile B_r = B_c = B in
  (64, 32, 16) whose shared-memory footprint (`iosim.sram_footprint_bytes`) fits the
  48 KB every CUDA device allows without opt-in. For example fa2/fa1: fp32 d=64 -> 32,
  fp16 d=64 -> 32, fp32 d=128 -> 16, d=16 -> 64; standard: fp32 d=64 -> 64.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numba import cuda

import iosim
from iosim.tiling import ALGORITHMS, Tiling, resolve_tiling, sram_footprint_bytes

from .forward import fa1, fa2, fa2_fast, fa2_tc, standard
from ._launch import (DEFAULT_SMEM_BYTES, NP_DTYPE, SIM, check_fits, counters_to_ledger,
                      default_threads, device_smem_limit, filled, new_counters)

HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128)
DEFAULT_TILES = (64, 32, 16)
#: fa2's default on a GPU: head dim -> (B_r, B_c, threads) of gpu.forward.fa2_fast, fastest fp32
#: variant measured on the H100 at N=4096 (see the module docstring); head dims not
#: listed take the first of FA2_FAST_FALLBACK that the fast kernel supports. d=128 runs
#: 64 x 32 with 256 threads (TC = 16): ptxas -v reports 255 registers and no spills,
#: where 256 x 32 at d=128 (512 threads, 128 registers) spilled 500 bytes a thread
#: into local memory, which multiplied its L2 traffic (Nsight Compute: 6.7x its ledger).
FA2_FAST_TILES = {64: (256, 32, 512), 128: (64, 32, 256)}
FA2_FAST_FALLBACK = ((256, 32, 512), (128, 64, 256), (128, 64, 128), (64, 64, 256),
                     (64, 64, 128), (32, 32, 128))
#: tuning measured best on the H100 for (B_r, B_c, threads): TC (threads per query row)
#: and maxreg (register cap per thread); see `fa2_fast_options` for the rest
FA2_FAST_TUNED = {(256, 32, 512): dict(TC=8, maxreg=128, stage=1),
                  (128, 64, 256): dict(TC=8, maxreg=128)}
#: thread counts tried, in order, for the fast kernel when the caller gives a tiling
FA2_FAST_THREADS = (256, 128, 64)
#: fp16 fa2's default on a GPU: head dim -> (B_r, B_c) of gpu.forward.fa2_tc (tensor cores),
#: the fastest tiling without register spills measured on the H100 at N=4096 and 8192
#: (16 heads), without causal masking (FA2_TC_TILES) and with it (FA2_TC_TILES_CAUSAL):
#: the data set's tc_tilings rows (`flashsim results show tc_tilings`; kernel ms at N=4096: d=64
#: 128 x 64 0.284-0.287, causal 64 x 64 0.272-0.279; d=128 64 x 64 0.523-0.527, causal
#: 0.382-0.387). Other head dims take the first of FA2_TC_FALLBACK that fits (not
#: tuned). At d=128, 128 x 32 with MT=2 ran 5% faster (0.499 ms; 1.951 against 2.066
#: at N=8192) but needs 255 registers and spills 72 bytes a thread (104 causal; ptxas
#: -v): not the default; block_rows=128, block_cols=32 selects it.
FA2_TC_TILES = {64: (128, 64), 128: (64, 64)}
FA2_TC_TILES_CAUSAL = {64: (64, 64), 128: (64, 64)}
FA2_TC_FALLBACK = ((128, 64), (64, 64), (64, 32))
#: m-tiles of 16 query rows per warp (MT) of gpu.forward.fa2_tc for (B_r, B_c, d); tilings not
#: listed run MT=1. Each K/V fragment then feeds MT products, registers grow with MT and
#: threads = 2 B_r / MT. Listed: large-B_r tilings whose MT=2 build was the one timed
#: (same run: 128 x 32 at d=128 above; 256 x 64 at d=64, 0.290 ms).
FA2_TC_MT: dict = {(128, 32, 128): 2, (256, 64, 64): 2}


def fa2_tc_mt(B_r: int, B_c: int, d: int) -> int:
    """MT the tensor-core kernel runs (B_r, B_c, d) with: FA2_TC_MT's entry, else 1."""
    return FA2_TC_MT.get((B_r, B_c, d), 1)


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


def fa2_tc_default(d: int, causal: bool = False) -> tuple[int, int] | None:
    """(B_r, B_c) of the tensor-core fa2 kernel's default tiling for fp16 at head dim d, or
    None where it cannot run (the simulator; d not a multiple of 16)."""
    if SIM:
        return None
    limit = device_smem_limit()
    tuned = (FA2_TC_TILES_CAUSAL if causal else FA2_TC_TILES).get(d)
    for B_r, B_c in ((tuned,) if tuned else ()) + FA2_TC_FALLBACK:
        if fa2_tc.supports(B_r, B_c, d, "fp16", smem_limit=limit, MT=fa2_tc_mt(B_r, B_c, d)):
            return B_r, B_c
    return None


def _aligned16(x, kind) -> bool:
    """Whether a device input's data is 16-byte aligned (fa2_tc copies 16 bytes at a time);
    NumPy inputs are copied into fresh, aligned device arrays."""
    if kind == "numpy":
        return True
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


def default_tiling(algorithm: str, d: int, dtype: str, causal: bool = False) -> Tiling:
    """The tiling `attention` uses when none is given (see the module docstring); only the
    fp16 fa2 default on a GPU depends on `causal`."""
    if algorithm == "fa2" and dtype == "fp16":
        tc = fa2_tc_default(d, causal)
        if tc is not None:
            return Tiling(*tc)
    if algorithm == "fa2":
        fast = fa2_fast_default(d)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    for B in DEFAULT_TILES:
        if sram_footprint_bytes(algorithm, B, B, d, dtype) <= DEFAULT_SMEM_BYTES:
            return Tiling(B, B)
    B = DEFAULT_TILES[-1]
    return Tiling(B, B)


def _check(name, x):
    """(shape, numpy dtype, kind) of one input, with validation of ndim/dtype/layout."""
    if isinstance(x, np.ndarray):
        kind = "numpy"
        shape, dt, contig = x.shape, x.dtype, x.flags.c_contiguous
    elif hasattr(x, "copy_to_host") and hasattr(x, "is_c_contiguous"):  # numba device array
        kind = "numba"
        shape, dt, contig = x.shape, np.dtype(x.dtype), x.is_c_contiguous()
    elif hasattr(x, "__cuda_array_interface__"):                        # torch, CuPy, ...
        kind = "cai"
        cai = x.__cuda_array_interface__
        shape = tuple(cai["shape"])
        dt = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contig = strides is None or tuple(strides) == tuple(
            int(np.prod(shape[i + 1:])) * dt.itemsize for i in range(len(shape)))
    else:
        raise ValueError(f"{name} must be a NumPy array or a CUDA device array "
                         f"(__cuda_array_interface__); got {type(x).__name__}")
    if len(shape) != 4:
        raise ValueError(f"{name} has shape {tuple(shape)} (ndim={len(shape)}); "
                         f"expected 4 dimensions (batch, heads, N, d)")
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"{name} has dtype {dt}; allowed: float32, float16")
    if not contig:
        raise ValueError(f"{name} must be C-contiguous (row-major); make a contiguous copy")
    return tuple(int(s) for s in shape), dt, kind


def _to_device(x, kind):
    if kind == "numpy":
        return cuda.to_device(x)
    if kind == "numba":
        return x
    # Numba synchronises on the producer's stream before using a foreign array. Our
    # kernels run on the legacy default stream, which is already ordered after work on
    # that same stream (stream 1, or None = unspecified/legacy): skip the host-blocking
    # sync there, keep it for any other stream.
    stream = x.__cuda_array_interface__.get("stream")
    return cuda.as_cuda_array(x, sync=stream not in (None, 1))


def _torch_like(like):
    """The torch module if `like` is a torch tensor, else None."""
    if type(like).__module__.split(".")[0] != "torch":
        return None
    import torch
    return torch


def _output(shape, npdt, kind, like):
    """(caller-kind object or None, numba device view) of a new output filled with NaN.

    torch callers get a torch tensor from torch's caching allocator (no cuMemAlloc /
    cuMemFree per call: Numba's deferred frees synchronise the device, which put a host
    round trip inside every timed call); others a Numba device array (`filled`)."""
    torch = _torch_like(like) if kind == "cai" else None
    if torch is None or torch.cuda.current_stream(like.device) != \
            torch.cuda.default_stream(like.device):
        # not torch, or torch on a side stream that our legacy-stream kernels would not be
        # ordered after: Numba allocates and fills on the legacy stream
        return None, filled(shape, npdt, np.nan)
    t = torch.full(shape, float("nan"), device=like.device,
                   dtype=torch.float16 if npdt == np.float16 else torch.float32)
    return t, cuda.as_cuda_array(t, sync=False)


def _return_like(dev, kind, like):
    """Convert a numba device array back to the caller's kind."""
    if kind == "numpy":
        return dev.copy_to_host()
    if kind == "numba":
        return dev
    mod = type(like).__module__.split(".")[0]
    if mod == "torch":
        import torch
        return torch.as_tensor(dev, device=like.device)
    if mod == "cupy":
        import cupy
        return cupy.asarray(dev)
    return dev


#: the values of `attention`'s kernel= parameter
KERNELS = ("auto", "plain", "fast", "tc")


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
                         if kernel == "auto" else ""), DeprecationWarning, stacklevel=3)
    if kernel in ("fast", "tc") and algorithm != "fa2":
        raise ValueError(f"kernel={kernel!r} is only for algorithm='fa2'; {algorithm!r} has one "
                         f"kernel (kernel='auto' or 'plain')")
    if kernel == "tc" and dname != "fp16":
        raise ValueError(f"kernel='tc' needs float16 inputs: the tensor-core fa2 kernel "
                         f"multiplies fp16 tiles (got {dname}); use kernel='auto' or 'fast'")
    return kernel, allow_tc


def attention(q, k, v, *, algorithm="fa2", causal=False, scale=None, block_rows=None,
              block_cols=None, sram_bytes=None, block_mask=None, count_traffic=False,
              return_stats=False, threads=None, kernel="auto", fast=None, tensor_cores=None,
              window=(-1, -1)):
    """Exact attention O = softmax(scale Q K^T [+ causal/block mask]) V on the GPU.

    q: (batch, heads, N_q, d); k, v: (batch, kv_heads, N_k, d) with kv_heads dividing heads
    (query head h uses K/V head h // (heads // kv_heads)). float32 or float16, all the
    same dtype, C-contiguous; d in HEAD_DIMS. NumPy in -> NumPy out (copied); a device
    array in (numba, or any __cuda_array_interface__ object such as a torch tensor; not
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
    16 in the simulator; the fast fa2 kernel: its tiling's own, see FA2_FAST_TILES);
    the plain kernels stride over their work, so any 1..1024 works.
    kernel: which fa2 kernel runs the schedule (module docstring). "auto": `gpu.forward.fa2_tc`
    (tensor cores) for fp16 where it runs the tiling (a GPU, d a multiple of 16, B_r = 16
    x warps, 16-byte aligned inputs), else `gpu.forward.fa2_fast` where it supports the tiling,
    else the plain `gpu.forward.fa2`; "plain" / "fast" / "tc": that kernel or a ValueError
    saying why it cannot run (fa1 and standard have one kernel each: "auto" or "plain").
    All of them run the same schedule: same ledger, outputs equal to rounding (fa2_tc
    rounds P to fp16 before P V, as FlashAttention-2 does).
    fast, tensor_cores: deprecated (DeprecationWarning; removed in the next release);
    fast=True -> kernel="fast", fast=False -> "plain", tensor_cores=True -> "tc",
    tensor_cores=False -> "auto" without the tensor-core kernel.
    Returns O; (O, ledger) with count_traffic; (O, L) with return_stats; (O, L, ledger)
    with both.
    """
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
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} is not supported; allowed: {HEAD_DIMS}")
    if return_stats and algorithm == "standard":
        raise ValueError("return_stats=True is supported for algorithm='fa1' or 'fa2', "
                         "not 'standard'")
    dname = "fp32" if dt == np.float32 else "fp16"
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32 "
                         f"(|scale| <= {float(np.finfo(np.float32).max):.8g}), the kernels' "
                         f"compute dtype")
    kernel, allow_tc = _pick_kernel(kernel, fast, tensor_cores, algorithm, dname)
    if threads is not None and not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")
    if block_rows is None and block_cols is None and sram_bytes is None:
        tiling = default_tiling(algorithm, d, dname, bool(causal))
    else:
        tiling = resolve_tiling(algorithm, d, dname, block_rows=block_rows,
                                block_cols=block_cols, sram_bytes=sram_bytes)
    B_r, B_c = tiling.B_r, tiling.B_c
    what = f"algorithm={algorithm!r} with B_r={B_r}, B_c={B_c}, d={d}, {dname}"
    tiles = f"B_r={B_r}, B_c={B_c}, d={d}"
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
    if algorithm == "fa2" and kernel in ("auto", "fast") and not use_tc:
        t_fast = fa2_fast_threads(B_r, B_c, d, None if threads is None else int(threads))
        if t_fast is None and kernel == "fast":
            raise ValueError(f"kernel='fast': the fast fa2 kernel cannot run {dname} with "
                             f"{tiles}, threads={threads} on this device (see "
                             f"gpu.forward.fa2_fast.plan and smem_bytes); use kernel='auto' or other "
                             f"tiles")
        if t_fast is not None:
            use_fast, threads = True, t_fast
    fast_opts = {}
    if use_tc:
        check_fits(fa2_tc.layout(B_r, B_c, d)["bytes"], what + " (tensor-core kernel)")
        threads = tc_threads
    elif use_fast:   # O and S live in registers: its own shared-memory layout
        # warp-shuffle row reductions on hardware (the simulator has no shuffles)
        fast_opts = dict(shfl=not SIM, **fa2_fast_options(B_r, B_c, d, threads))
        check_fits(fa2_fast.smem_bytes(B_r, B_c, d, threads, fast_opts.get("TC"),
                                       shfl=fast_opts["shfl"], stage=fast_opts.get("stage", 0)),
                   what + " (fast kernel)")
    else:
        check_fits(sram_footprint_bytes(algorithm, B_r, B_c, d, dname), what)
    if algorithm == "standard":
        check_fits(4 * Nk, f"the standard softmax row of N_k={Nk} float32")
    threads = default_threads() if threads is None else int(threads)
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, block_mask=block_mask, N_k=Nk, window=window)
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
    # poison: unwritten elements show as NaN
    o_obj, o3 = _output((B * H, N, d), npdt, kind, q)
    counters = new_counters(count_traffic)
    common = dict(B_r=B_r, B_c=B_c, dt=dname, causal=bool(causal), count=bool(count_traffic),
                  threads=threads, N_k=Nk, window=problem.window)
    L = None
    if algorithm == "fa2":
        L_obj, L2 = _output((B * H, N), np.dtype(np.float32), kind, q)
        if use_tc:
            fa2_tc.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, MT=mt, **common)
        elif use_fast:
            fa2_fast.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, **common,
                         **fast_opts)
        else:
            fa2.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, **common)
        L = L2 if L_obj is None else L_obj
    elif algorithm == "fa1":
        _l, l2 = _output((B * H, N), np.dtype(np.float32), kind, q)
        _m, m2 = _output((B * H, N), np.dtype(np.float32), kind, q)
        fa1.run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask_dev, counters, **common)
        if return_stats:
            lh, mh = l2.copy_to_host(), m2.copy_to_host()
            with np.errstate(divide="ignore", invalid="ignore"):
                Lh = mh + np.log(lh)   # no key: -inf + log 0 = -inf; NaN l or m: NaN
            L = cuda.to_device(Lh.astype(np.float32))
    else:
        _s, s3 = _output((B * H, N, Nk), npdt, kind, q)   # S, P: HBM scratch (kept alive
        _p, p3 = _output((B * H, N, Nk), npdt, kind, q)   # by _s, _p until we return)
        standard.run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask_dev, active, counters,
                     **common)
    O = (o_obj.reshape(B, H, N, d) if o_obj is not None
         else _return_like(o3.reshape(B, H, N, d), kind, q))
    out = [O]
    if return_stats:
        out.append(L.reshape(B, H, N) if _torch_like(L) is not None
                   else _return_like(L.reshape(B, H, N), kind, q))
    if count_traffic:
        out.append(counters_to_ledger(counters, algorithm, problem, tiling))
    return out[0] if len(out) == 1 else tuple(out)


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
