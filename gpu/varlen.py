"""`gpu.attention_varlen`: fa2 forward on packed variable-length batches (flash-attn's
`flash_attn_varlen_func`), in one launch of gpu.forward.fa2_varlen.

Its own module beside gpu/api.py, not one more branch of `gpu.attention`: the inputs
have another layout (packed (total, heads, d), three dimensions, plus cu_seqlens), the
problem is an iosim.VarlenProblem rather than an iosim.Problem, and only the plain
kernel runs it; `gpu.attention`'s checks, kernel choice and launch plans stay untouched.
It reuses gpu.api's helpers for devices, outputs and poisoning (`gpu.api.POISON`,
`set_poison`, `poison_outputs`).
"""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import numpy as np
from numba import cuda

import iosim
from iosim.tiling import resolve_tiling, sram_footprint_bytes

from . import _launch, api
from ._io import _kind_of
from ._torch_cpu import takes_torch_cpu
from ._launch import (NP_DTYPE, check_fits, counters_to_dicts, default_threads, dtype_name,
                      new_counters)
from .forward import fa2_varlen

#: the values of attention_varlen's kernel= parameter
VARLEN_KERNELS = ("plain",)


def _check3(name, x):
    """(shape, numpy dtype, kind) of one packed input: gpu.api's check with flash-attn's
    3 dimensions; NumPy arrays, Numba device arrays or __cuda_array_interface__ objects
    (torch CUDA tensors, bfloat16 included: gpu._io._kind_of), as gpu.attention takes."""
    return api._check(name, x, ("total rows", "heads", "d"), ", flash-attn's packed layout")


def _host_ints(x):
    """cu_seqlens on the host (a copy; for a device array, which flash-attn's callers
    pass as an int32 CUDA tensor, a device-to-host copy that waits for its producer)."""
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if api._torch_like(x) is not None:
        return x.detach().cpu().numpy()
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x).copy_to_host()
    return x


def _stream(kind, q):
    """The raw stream the launches go on: torch's current stream of q's device for torch
    tensors (as gpu.attention), else 0 (the legacy default stream)."""
    torch = api._torch_like(q) if kind == "cai" else None
    return api._torch_stream(torch, q.device) if torch is not None else 0


@takes_torch_cpu
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, window=(-1, -1),
                     scale=None, block_rows=None, block_cols=None, count_traffic=False,
                     return_stats=False, threads=None, kernel="plain", poison=None):
    """FlashAttention-2 forward over a packed batch of sequences of different lengths.

    q: (total_q, heads, d); k, v: (total_k, kv_heads, d), kv_heads dividing heads (query
    head h uses K/V head h // (heads // kv_heads)); float32, float16 or bfloat16
    (ml_dtypes; as gpu.attention), all the same
    dtype, C-contiguous; NumPy in -> NumPy out, Numba device arrays in -> device arrays
    out, torch CUDA tensors in -> torch tensors out (run on torch's current stream, as
    gpu.attention; not differentiable here: gpu.autograd.flash_attention_varlen is).
    cu_seqlens_q, cu_seqlens_k: integer arrays (batch + 1,), host or device (copied to the
    host to build the problem): sequence b is q rows
    cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 (N_q_b of them) against k, v rows
    cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1 (N_k_b); both start at 0, are non-decreasing
    and end at total_q, total_k (ValueError naming the parameter otherwise). Lengths may
    be 0: N_q_b = 0 does nothing; N_k_b = 0 gives O = 0, L = -inf for its rows.

    causal, window=(left, right): per sequence, bottom-right aligned (iosim.Problem with
    N = N_q_b, N_k = N_k_b): row r of sequence b sees its key c iff c <= r + N_k_b - N_q_b
    (causal). scale: default 1/sqrt(d). block_rows=B_r, block_cols=B_c: the tiling, per
    sequence (T_r_b = ceil(N_q_b / B_r)); default gpu.api.default_tiling('fa2', d, dtype,
    kernel='plain'). threads: per block (default `_launch.default_threads()`).
    kernel: 'plain' (gpu.forward.fa2_varlen) only; anything else is a ValueError.
    poison: NaN-fill O and L before the launch (default gpu.api.POISON).
    count_traffic: also return the kernel's own counts as an iosim.VarlenLedger (totals
    over sequences and query heads, in elements), equal to iosim.varlen_closed_form.
    return_stats: also return L, the logsumexp m + log l, float32 (heads, total_q) --
    flash-attn's softmax_lse layout for varlen.
    Returns O (total_q, heads, d) in the input dtype; (O, L), (O, ledger) or
    (O, L, ledger) as asked.
    """
    if kernel not in VARLEN_KERNELS:
        raise ValueError(f"kernel={kernel!r} is not supported by attention_varlen; allowed: "
                         f"{', '.join(map(repr, VARLEN_KERNELS))} (the fast and tensor-core "
                         f"fa2 kernels have no varlen build yet)")
    (Tq, H, d), dt, kind = _check3("q", q)
    (Tk, Hk, dk), dtk, kindk = _check3("k", k)
    shape_v, dtv, kindv = _check3("v", v)
    if dk != d or shape_v != (Tk, Hk, dk):
        raise ValueError(f"k has shape {(Tk, Hk, dk)} and v has shape {shape_v}; both must "
                         f"be (total_k, kv_heads, d={d}), the same, to match q {(Tq, H, d)}")
    if H % Hk:
        raise ValueError(f"k/v have kv_heads={Hk}, which must divide q's heads={H}")
    if dtk != dt or dtv != dt:
        raise ValueError(f"q, k, v dtypes are {dt}, {dtk}, {dtv}; they must be the same")
    if len({kind, kindk, kindv}) != 1:
        raise ValueError(f"q, k, v are of kinds {kind}, {kindk}, {kindv}; they must all be "
                         f"NumPy arrays, all Numba device arrays or all CUDA tensors")
    dname = dtype_name(dt)
    problem = iosim.VarlenProblem.from_cu_seqlens(
        _host_ints(cu_seqlens_q), _host_ints(cu_seqlens_k), d, total_q=Tq, total_k=Tk,
        heads=H, kv_heads=Hk, dtype=dname, causal=causal, window=window)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32")
    if threads is not None and not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")
    if block_rows is None and block_cols is None:
        tiling = api.default_tiling("fa2", d, dname, bool(causal), "plain")
    else:
        tiling = resolve_tiling("fa2", d, dname, block_rows=block_rows, block_cols=block_cols)
    B_r, B_c = tiling.B_r, tiling.B_c
    check_fits(sram_footprint_bytes("fa2", B_r, B_c, d, dname),
               f"attention_varlen with B_r={B_r}, B_c={B_c}, d={d}, {dname}")
    threads = default_threads() if threads is None else int(threads)
    poison = api.POISON if poison is None else bool(poison)

    npdt = NP_DTYPE[dname]
    qd, kd, vd = (api._to_device(x, kind) for x in (q, k, v))
    cu_q = cuda.to_device(problem.cu_seqlens_q)
    cu_k = cuda.to_device(problem.cu_seqlens_k)
    o_obj, o3 = api._output((Tq, H, d), npdt, kind, q, poison)
    L_obj, L2 = api._output((H, Tq), np.dtype(np.float32), kind, q, poison)
    counters = new_counters(count_traffic)
    max_T_r = max(problem.T_r(tiling))
    handle = _stream(kind, q)
    with _launch.on_stream(handle):
        fa2_varlen.run(qd, kd, vd, o3, L2, cu_q, cu_k, scale, H, H // Hk, max_T_r,
                       problem.batch, counters, B_r=B_r, B_c=B_c, dt=dname,
                       causal=bool(causal), count=bool(count_traffic), threads=threads,
                       window=problem.window)
    out = [o_obj if o_obj is not None else api._return_like(o3, kind, q)]
    if return_stats:
        out.append(L_obj if L_obj is not None else api._return_like(L2, kind, q))
    if count_traffic:
        if handle:
            api._torch_like(q).cuda.current_stream(q.device).synchronize()
        reads, writes = counters_to_dicts(counters)
        out.append(iosim.VarlenLedger("fa2", problem, tiling, reads, writes))
    return out[0] if len(out) == 1 else tuple(out)


@takes_torch_cpu
def attention_varlen_backward(q, k, v, o, do, L, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                              window=(-1, -1), scale=None, block_rows=None, block_cols=None,
                              count_traffic=False, threads=None, kernel="plain",
                              poison=None):
    """Gradients (dq, dk, dv) of `attention_varlen` over a packed batch: the plain fa2
    backward (gpu.backward.flash's schedule and block body) per sequence, in one launch
    per pass (gpu.backward.fa2_varlen).

    q, o, do: (total_q, heads, d); k, v: (total_k, kv_heads, d); one dtype (float32,
    float16 or bfloat16), C-contiguous, all NumPy, all Numba device arrays or all CUDA
    tensors (NumPy in -> NumPy out; torch in -> torch out; L may be any of them).
    L: the forward's logsumexp, float32 (heads, total_q), as
    `attention_varlen(..., return_stats=True)` returns it. cu_seqlens_q, cu_seqlens_k,
    causal, window, scale: as `attention_varlen` (must match the forward).
    block_rows=B_r, block_cols=B_c: the tiling, per sequence (T_c_b = ceil(N_k_b / B_c));
    default gpu.backward.default_backward_tiling(d, dtype, 'fa2', 'plain').
    kernel: 'plain' only. poison: NaN-fill the gradients and intermediate buffers first
    (default gpu.api.POISON). A sequence with no keys gets dq = 0; one with no queries
    dk = dv = 0; a row that sees no key dq = 0.
    Returns (dq, dk, dv): dq (total_q, heads, d), dk, dv (total_k, kv_heads, d) in the
    input dtype; or ((dq, dk, dv), ledger) with count_traffic=True: the kernels' own
    counts as an iosim.BackwardLedger (totals over sequences and query heads, in elements)
    equal to iosim.varlen_backward_closed_form.
    """
    from .backward import flash
    if kernel not in VARLEN_KERNELS:
        raise ValueError(f"kernel={kernel!r} is not supported by attention_varlen_backward; "
                         f"allowed: {', '.join(map(repr, VARLEN_KERNELS))} (the fast and "
                         f"tensor-core fa2 backward kernels have no varlen build yet)")
    (Tq, H, d), dt, kind = _check3("q", q)
    (Tk, Hk, dk_), dtk, kindk = _check3("k", k)
    shape_v, dtv, kindv = _check3("v", v)
    shape_o, dto, kindo = _check3("o", o)
    shape_do, dtdo, kinddo = _check3("do", do)
    if dk_ != d or shape_v != (Tk, Hk, dk_):
        raise ValueError(f"k has shape {(Tk, Hk, dk_)} and v has shape {shape_v}; both must "
                         f"be (total_k, kv_heads, d={d}), the same, to match q {(Tq, H, d)}")
    for name, shp in (("o", shape_o), ("do", shape_do)):
        if shp != (Tq, H, d):
            raise ValueError(f"{name} has shape {shp}; expected q's shape {(Tq, H, d)}")
    if H % Hk:
        raise ValueError(f"k/v have kv_heads={Hk}, which must divide q's heads={H}")
    if any(x != dt for x in (dtk, dtv, dto, dtdo)):
        raise ValueError(f"q, k, v, o, do dtypes are {dt}, {dtk}, {dtv}, {dto}, {dtdo}; "
                         f"they must be the same")
    if len({kind, kindk, kindv, kindo, kinddo}) != 1:
        raise ValueError(f"q, k, v, o, do are of kinds {kind}, {kindk}, {kindv}, {kindo}, "
                         f"{kinddo}; they must all be NumPy arrays, all Numba device arrays "
                         f"or all CUDA tensors")
    dname = dtype_name(dt)
    problem = iosim.VarlenProblem.from_cu_seqlens(
        _host_ints(cu_seqlens_q), _host_ints(cu_seqlens_k), d, total_q=Tq, total_k=Tk,
        heads=H, kv_heads=Hk, dtype=dname, causal=causal, window=window)
    if isinstance(L, np.ndarray):
        if L.shape != (H, Tq):
            raise ValueError(f"L has shape {L.shape}; expected (heads, total_q) = {(H, Tq)}")
        L_dev = cuda.to_device(np.ascontiguousarray(L, dtype=np.float32))
    elif hasattr(L, "copy_to_host") or hasattr(L, "__cuda_array_interface__"):
        shape_L, dt_L, kind_L, contig_L = _kind_of("L", L)
        if tuple(shape_L) != (H, Tq) or dt_L != np.float32 or not contig_L:
            raise ValueError(f"L has shape {tuple(shape_L)} and dtype {dt_L}; expected "
                             f"a C-contiguous {(H, Tq)} float32 array")
        L_dev = api._to_device(L, kind_L)
    else:
        raise ValueError(f"L must be a float32 array of shape {(H, Tq)}; got "
                         f"{type(L).__name__}")
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32")
    if threads is not None and not 1 <= int(threads) <= 1024:
        raise ValueError(f"threads={threads} must be in 1..1024")
    if block_rows is None and block_cols is None:
        tiling = flash.default_backward_tiling(d, dname, "fa2", "plain", bool(causal))
    else:
        for name, val in (("block_rows", block_rows), ("block_cols", block_cols)):
            if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name}={val!r} must be a positive integer (give both "
                                 f"block_rows and block_cols, or neither)")
        tiling = iosim.Tiling(int(block_rows), int(block_cols))
    B_r, B_c = tiling.B_r, tiling.B_c
    check_fits(flash.bwd_shared_bytes(B_r, B_c, d, dname),
               f"attention_varlen_backward with B_r={B_r}, B_c={B_c}, d={d}, {dname}")
    threads = default_threads() if threads is None else int(threads)
    poison = api.POISON if poison is None else bool(poison)
    count = bool(count_traffic)

    npdt = NP_DTYPE[dname]
    qd, kd, vd, od, dod = (api._to_device(x, kind) for x in (q, k, v, o, do))
    cu_q = cuda.to_device(problem.cu_seqlens_q)
    cu_k = cuda.to_device(problem.cu_seqlens_k)
    G = H // Hk
    counters = flash._new_counters(count)
    # the launches go on the legacy default stream, as gpu.backward.attention_backward's
    grads = _backward_launches(qd, kd, vd, od, dod, L_dev, cu_q, cu_k, counters, scale,
                               problem, Tq, Tk, H, Hk, d, G, npdt, kind, q, poison,
                               B_r, B_c, dname, causal, count, threads, tiling)
    if count_traffic:
        return grads, flash._counters_to_ledger(counters, "fa2", problem, tiling)
    return grads


def _backward_launches(qd, kd, vd, od, dod, L_dev, cu_q, cu_k, counters, scale, problem, Tq,
                       Tk, H, Hk, d, G, npdt, kind, q, poison, B_r, B_c, dname, causal,
                       count, threads, tiling):
    """attention_varlen_backward's launches; returns (dq, dk, dv) in the caller's kind."""
    from .backward import flash
    from .backward import fa2_varlen as bwd_varlen
    dq_obj, dq3 = api._output((Tq, H, d), npdt, kind, q, poison)
    dk_hobj, dk_h = api._output((Tk, H, d), npdt, kind, q, poison)     # per query head
    dv_hobj, dv_h = api._output((Tk, H, d), npdt, kind, q, poison)
    _, D2 = api._output((H, Tq), np.dtype(np.float32), kind, q, poison)
    _, acc = api._output((Tq, H, d), np.dtype(np.float32), kind, q, poison)
    if Tq:                                  # 1. D = rowsum(dO o O), dQacc = 0
        pre = flash.fa2_pre_kernel(B_r, d, dname, count, threads, True)
        pre[(-(-Tq // B_r), H), threads](od, dod, D2, acc, np.int64(Tq), counters)
    max_T_c = max(tiling.T_c(n) for n in problem.seqlens_k)
    bwd_varlen.run_main(qd, kd, vd, od, dod, L_dev, D2, acc, dk_h, dv_h, cu_q, cu_k, scale,
                        H, G, max_T_c, problem.batch, counters, B_r=B_r, B_c=B_c, dt=dname,
                        causal=bool(causal), count=count, threads=threads,
                        window=problem.window)
    if Tq:                                  # 3. dQ = dQacc
        flash._flat_launch(flash.convert_kernel(dname, count), Tq * H * d,
                           acc.reshape(Tq * H * d), dq3.reshape(Tq * H * d), counters)
    if G == 1:
        dk_obj, dv_obj, dk3, dv3 = dk_hobj, dv_hobj, dk_h, dv_h
    else:                                   # 4. the grouped-heads sum
        dk_obj, dk3 = api._output((Tk, Hk, d), npdt, kind, q, poison)
        dv_obj, dv3 = api._output((Tk, Hk, d), npdt, kind, q, poison)
        if Tk:
            flash._flat_launch(flash.group_sum_kernel(dname, count), Tk * Hk * d,
                               dk_h.reshape(Tk * H, d), dv_h.reshape(Tk * H, d),
                               dk3.reshape(Tk * Hk, d), dv3.reshape(Tk * Hk, d),
                               np.int64(G), counters)
    return tuple(obj if obj is not None else api._return_like(x, kind, q)
                 for obj, x in ((dq_obj, dq3), (dk_obj, dk3), (dv_obj, dv3)))


__all__ = ["attention_varlen", "attention_varlen_backward", "VARLEN_KERNELS"]
