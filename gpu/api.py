"""`gpu.attention`: run one of the forward kernels on (batch, heads, N, d) arrays.

Default tiling (no block_rows/block_cols/sram_bytes given): the largest square tile
B_r = B_c = B in (64, 32, 16) whose shared-memory footprint
(`iosim.sram_footprint_bytes`) fits the 48 KB every CUDA device allows without opt-in.
For example fa2/fa1: fp32 d=64 -> 32, fp16 d=64 -> 32, fp32 d=128 -> 16, d=16 -> 64;
standard: fp32 d=64 -> 64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

import iosim
from iosim.tiling import ALGORITHMS, Tiling, resolve_tiling, sram_footprint_bytes

from . import fa1, fa2, standard
from ._launch import (DEFAULT_SMEM_BYTES, NP_DTYPE, check_fits, counters_to_ledger,
                      default_threads, filled, new_counters)

HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128)
DEFAULT_TILES = (64, 32, 16)


@dataclass
class AttentionResult:
    """Everything one call produced. O: (batch, heads, N, d) in the input dtype.
    L: (batch, heads, N) float32 logsumexp m + log l (fa2 writes it; for fa1 it is
    computed on the host from the l, m the kernel leaves in HBM; None for standard).
    ledger: the kernels' own traffic counts (count_traffic=True), else None."""
    O: object
    L: object = None
    ledger: iosim.Ledger | None = None


def default_tiling(algorithm: str, d: int, dtype: str) -> Tiling:
    """Largest square tile in DEFAULT_TILES whose footprint fits 48 KB (see module doc)."""
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
    return cuda.as_cuda_array(x)


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


def attention(q, k, v, *, algorithm="fa2", causal=False, scale=None, block_rows=None,
              block_cols=None, sram_bytes=None, block_mask=None, count_traffic=False,
              return_stats=False, threads=None):
    """Exact attention O = softmax(scale Q K^T [+ causal/block mask]) V on the GPU.

    q: (batch, heads, N, d); k, v: (batch, kv_heads, N, d) with kv_heads dividing heads
    (query head h uses K/V head h // (heads // kv_heads)). float32 or float16, all the
    same dtype, C-contiguous; d in HEAD_DIMS. NumPy in -> NumPy out (copied); a device
    array in (numba, or any __cuda_array_interface__ object such as a torch tensor; not
    in the simulator) -> the same kind out, without copying the inputs.

    algorithm: 'standard' | 'fa1' | 'fa2'. scale: default 1/sqrt(d).
    Tiling: block_rows=B_r and block_cols=B_c, or sram_bytes=M (bytes; the paper's
    rule B_c = ceil(M/4d), B_r = min(B_c, d) in elements of the dtype), or neither
    (`default_tiling`). A tiling whose shared-memory footprint exceeds the device's
    per-block maximum raises ValueError.
    block_mask: bool (T_r, T_c) over (query block, key block); False tiles are skipped.
    count_traffic: compile the instrumented kernels and return the ledger of elements
    they loaded/stored (problem totals, comparable with iosim.closed_form).
    return_stats: also return L (fa2, fa1).
    threads: threads per block (default `_launch.default_threads()`: 128 on a GPU,
    16 in the simulator); the kernels stride over their work, so any 1..1024 works.
    Returns O; (O, ledger) with count_traffic; (O, L) with return_stats; (O, L, ledger)
    with both.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALGORITHMS)}")
    (B, H, N, d), dt, kind = _check("q", q)
    (Bk, Hk, Nk, dk), dtk, kindk = _check("k", k)
    shape_v, dtv, kindv = _check("v", v)
    if (Bk, Nk, dk) != (B, N, d) or shape_v != (Bk, Hk, Nk, dk):
        raise ValueError(f"k has shape {(Bk, Hk, Nk, dk)} and v has shape {shape_v}; both "
                         f"must be (batch={B}, kv_heads, N={N}, d={d}) to match q {(B, H, N, d)}")
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
    if not np.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be a finite number")
    if block_rows is None and block_cols is None and sram_bytes is None:
        tiling = default_tiling(algorithm, d, dname)
    else:
        tiling = resolve_tiling(algorithm, d, dname, block_rows=block_rows,
                                block_cols=block_cols, sram_bytes=sram_bytes)
    B_r, B_c = tiling.B_r, tiling.B_c
    foot = sram_footprint_bytes(algorithm, B_r, B_c, d, dname)
    check_fits(foot, f"algorithm={algorithm!r} with B_r={B_r}, B_c={B_c}, d={d}, {dname}")
    if algorithm == "standard":
        check_fits(4 * N, f"the standard softmax row of N={N} float32")
    threads = default_threads() if threads is None else int(threads)
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")
    problem = iosim.Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, block_mask=block_mask)
    active = iosim.active_tiles(problem, tiling)   # validates block_mask's shape
    mask_dev = None
    if block_mask is not None:
        mask_dev = cuda.to_device(np.ascontiguousarray(problem.block_mask, dtype=np.uint8))

    qd, kd, vd = (_to_device(x, kind) for x in (q, k, v))
    q3 = qd.reshape(B * H, N, d)
    k3 = kd.reshape(B * Hk, N, d)
    v3 = vd.reshape(B * Hk, N, d)
    G = H // Hk
    npdt = NP_DTYPE[dname]
    o3 = filled((B * H, N, d), npdt, np.nan)      # poison: unwritten elements show as NaN
    counters = new_counters(count_traffic)
    common = dict(B_r=B_r, B_c=B_c, dt=dname, causal=bool(causal), count=bool(count_traffic),
                  threads=threads)
    L = None
    if algorithm == "fa2":
        L2 = filled((B * H, N), np.float32, np.nan)
        fa2.run(q3, k3, v3, o3, L2, scale, N, H, G, mask_dev, counters, **common)
        L = L2
    elif algorithm == "fa1":
        l2 = filled((B * H, N), np.float32, np.nan)
        m2 = filled((B * H, N), np.float32, np.nan)
        fa1.run(q3, k3, v3, o3, l2, m2, scale, N, H, G, mask_dev, counters, **common)
        if return_stats:
            lh, mh = l2.copy_to_host(), m2.copy_to_host()
            with np.errstate(divide="ignore"):
                Lh = np.where(lh > 0, mh + np.log(np.where(lh > 0, lh, 1)), -np.inf)
            L = cuda.to_device(Lh.astype(np.float32))
    else:
        s3 = filled((B * H, N, N), npdt, np.nan)
        p3 = filled((B * H, N, N), npdt, np.nan)
        standard.run(q3, k3, v3, o3, s3, p3, scale, N, H, G, mask_dev, active, counters,
                     **common)
    O = _return_like(o3.reshape(B, H, N, d), kind, q)
    out = [O]
    if return_stats:
        out.append(_return_like(L.reshape(B, H, N), kind, q))
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
