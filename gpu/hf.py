"""A transformers attention backend running flashsim's kernels.

    import gpu.hf
    name = gpu.hf.register()                 # "iosim" by default
    model.set_attn_implementation(name)      # every attention layer now runs here

`register(name)` adds `attention_forward` to transformers' `AttentionInterface` and
transformers' flash-attn mask builder (`masking_utils.flash_attention_mask`: None without
padding, else the 2D padding mask) to its `AttentionMaskInterface` under `name`, so a model
switched to it hands this module (batch, heads, N, d) query / key / value tensors (the
layout of flashsim's kernels: no copy) and at most a 2D padding mask. transformers reads a
name containing "flash" as a request for flash-attn itself: such names are refused.
transformers is an optional dependency (`pip install flashsim[hf]`; it needs torch, which
the extra leaves to you: a CUDA build on a GPU machine, a CPU build for the simulator, see
docs/flash-attn.md); importing this module needs neither it nor torch.

A model on the GPU hands the backend CUDA tensors, which the kernels run in place. A model
on the CPU runs too: its CPU tensors run as NumPy arrays sharing their memory
(gpu._torch_cpu), in Numba's CUDA simulator without a GPU (slow: tiny models only), or
copied to the GPU and back with one; outputs and gradients come back as CPU tensors.

What a call runs (`attention_forward`; every call records it, below):
* a padding mask (some key of some sequence masked): the padded rows are dropped and the
  sequences packed, `gpu.attention_varlen` (or its autograd twin) runs them with the
  causal mask / window per sequence (bottom-right aligned: the queries are the last N_q
  positions of their keys), and the output is scattered back (padded query rows get 0);
  with a sliding window the kept positions of each sequence must be contiguous (left or
  right padding), else ValueError; dropout with padding is refused (the varlen kernel has
  none);
* decoding (N_q <= 16 new rows against N_k > N_q keys, no padding, no gradient, no
  dropout, no window narrower than the keys, contiguous key / value as transformers'
  DynamicCache keeps them: gpu.decode's (batch, kv_heads, N_kv, d) layout):
  `gpu.decode` with bottom-right causal masking;
* otherwise `gpu.attention` (fa2; N_k != N_q bottom-right aligned) or, when a gradient is
  needed, `gpu.autograd.flash_attention` (fa2 forward and backward).
Causal: `is_causal` (keyword) or `module.is_causal` (default True). Sliding window:
`sliding_window=w` keeps keys q - w + 1 .. q (flash-attn's window (w - 1, 0) with
causal; (w - 1, w - 1) without). GQA / MQA: key / value with fewer heads than query.
scaling: the softmax scale (default 1/sqrt(d)). dropout: the attention dropout p
(gpu.attention's Philox dropout with a fresh seed per call; its backward regenerates it).
Refused (one-line ValueError naming what and what is allowed): a 4D or otherwise shaped
attention_mask (register's mask builder gives 2D), packed sequences in one row (position_ids
that restart: transformers' flash path reads them; flashsim's would attend across them),
head_mask, softcap, attention sinks (s_aux), a value head dim other than the query's.
Returns (output (batch, N_q, heads, d), None), as transformers' sdpa backend.

Recording: each call reports what it ran to `iosim.workload.record(AttentionCall(layer=
module.layer_idx, step="prefill" | "decode" | "train", problem=iosim.Problem /
iosim.VarlenProblem / iosim.decode.DecodeProblem, algorithm="fa2" or "fa2_decode" /
"split_kv", tiling=(B_r, B_c) or None, num_splits=S, kv_reads=...))` (a no-op unless an
`iosim.workload.recording()` block is active; skipped where iosim.workload is absent or the
module has no layer_idx). A call that needs gradients (step "train") records its forward
at once and its backward (backward=True, the backward kernels' default tiling) when
autograd runs it, so a training step lists the forwards in layer order, then the
backwards in reverse. The tilings are the ones gpu takes by default (`gpu.api.
default_tiling`, `gpu.backward.default_backward_tiling`), which are those that ran.
"""
from __future__ import annotations

import math

import numpy as np


#: the implementation name `register()` uses by default (no "flash" in it: transformers
#: would take that as a request for flash-attn)
DEFAULT_NAME = "iosim"
#: most new query rows that run on gpu.decode
MAX_DECODE_ROWS = 16
_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def register(name: str = DEFAULT_NAME) -> str:
    """Register flashsim's attention with transformers under `name` (attention function and
    mask builder); returns the name, for `model.set_attn_implementation(name)`."""
    if not isinstance(name, str) or not name or "flash" in name.lower():
        raise ValueError(f"name={name!r} is not allowed; allowed: a non-empty str without "
                         f"'flash' (transformers reads such a name as a request for "
                         f"flash-attn)")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:
        raise ImportError(f"gpu.hf needs transformers (pip install 'flashsim[hf]'): {e}") \
            from None
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _record(**fields):
    """iosim.workload.record(AttentionCall(**fields)), where iosim.workload exists and the
    module has a layer index (transformers' attention modules have layer_idx)."""
    if fields["layer"] is None:
        return
    try:
        from iosim import workload
    except ImportError as e:
        if "workload" in str(e):
            return
        raise
    workload.record(workload.AttentionCall(**fields))


def _record_backward(out, **fields):
    """Record the backward call when it runs: a hook on the output's gradient, which
    autograd calls just before the backward kernels (layers in reverse order, as they
    run)."""
    def hook(grad):
        _record(backward=True, **fields)
    out.register_hook(hook)


def _refuse_kwargs(kwargs):
    if kwargs.get("head_mask") is not None:
        raise ValueError("head_mask is not supported by flashsim's kernels; allowed: None")
    softcap = kwargs.get("softcap")
    if softcap not in (None, 0, 0.0):
        raise ValueError(f"softcap={softcap!r} is not supported by flashsim's kernels; "
                         f"allowed: None or 0")
    if kwargs.get("s_aux") is not None:
        raise ValueError("s_aux (attention sinks) is not supported by flashsim's kernels; "
                         "allowed: None")
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if kwargs.get(name) is not None:
            raise ValueError(f"{name} (packed sequences from a data collator) is not "
                             f"supported by flashsim's backend; allowed: None (one sequence "
                             f"per row, with a 2D padding mask)")


def _packed(position_ids, Nq) -> bool:
    """Whether position_ids (batch, N_q) restart inside a row (several sequences packed)."""
    if position_ids is None or Nq < 2 or getattr(position_ids, "ndim", 0) != 2:
        return False
    import torch
    return bool((torch.diff(position_ids, dim=-1) != 1).any())


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      is_causal=None, sliding_window=None, **kwargs):
    """transformers' attention function signature: query (batch, heads, N_q, d), key /
    value (batch, kv_heads, N_k, d) torch tensors, CUDA or CPU (CPU: module docstring);
    returns ((batch, N_q, heads, d), None), on their device.
    Module docstring: what runs, what is refused, what is recorded."""
    import torch
    _refuse_kwargs(kwargs)
    B, H, Nq, d = (int(s) for s in query.shape)
    Hk, Nk = int(key.shape[1]), int(key.shape[2])
    if tuple(value.shape) != tuple(key.shape) or int(key.shape[3]) != d:
        raise ValueError(f"key has shape {tuple(key.shape)} and value {tuple(value.shape)}; "
                         f"allowed: both (batch, kv_heads, N_k, d={d}), query's head dim")
    dname = _DTYPES.get(str(query.dtype))
    if dname is None:
        raise ValueError(f"query has dtype {query.dtype}; allowed: float16, bfloat16, float32")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = (-1, -1)
    if sliding_window is not None and int(sliding_window) > 0:
        w = int(sliding_window) - 1
        window = (w, 0 if causal else w)
    # flash-attn's normalisation: a side reaching past every key is unbounded
    window = tuple(-1 if s >= Nk else s for s in window)
    if causal and window[0] == -1:
        window = (-1, -1)
    scale = 1.0 / math.sqrt(d) if scaling is None else float(scaling)
    p = float(dropout or 0.0)
    layer = getattr(module, "layer_idx", None)
    layer = None if layer is None else int(layer)
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                        or value.requires_grad)
    step = "train" if grad else ("decode" if Nq < Nk else "prefill")
    mask = None
    if attention_mask is not None:
        if attention_mask.ndim != 2 or tuple(attention_mask.shape) != (B, Nk):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; "
                             f"allowed: None or a 2D padding mask (batch={B}, N_k={Nk}) "
                             f"(gpu.hf.register's mask builder; a 4D mask cannot run on "
                             f"flashsim's kernels)")
        host = attention_mask.detach().to("cpu", torch.bool).numpy()
        if not host.all():
            mask = host
    if mask is None and _packed(kwargs.get("position_ids"), Nq):
        raise ValueError("position_ids restart inside a row (packed sequences): not "
                         "supported by flashsim's backend; allowed: one sequence per row, "
                         "with a 2D padding mask")
    if mask is not None:
        out = _padded(query, key, value, mask, causal, window, scale, p, grad, dname,
                      layer, step)
        return out, None
    if (not grad and p == 0.0 and window == (-1, -1) and 1 <= Nq <= MAX_DECODE_ROWS
            and Nq < Nk and key.is_contiguous() and value.is_contiguous()):
        out = _decode(query, key, value, causal, scale, dname, layer, step)
        if out is not None:
            return out, None
    import iosim
    from .api import default_tiling
    t = default_tiling("fa2", d, dname, causal)
    problem = iosim.Problem(N=Nq, N_k=Nk, d=d, batch=B, heads=H, kv_heads=Hk, dtype=dname,
                            causal=causal, window=window, dropout_p=p)
    drop = dict(dropout_p=p, dropout_seed=int(torch.randint(0, 2 ** 62, (1,)).item())) \
        if p else {}
    if grad:
        from .autograd import flash_attention
        from .backward import default_backward_tiling
        o = flash_attention(query, key, value, causal=causal, scale=scale, window=window,
                            **drop)
        # the tiling gpu.backward.attention_backward takes by default: off the
        # tensor-core tilings where N_k != N_q or a window (its 'auto' rule)
        general = Nk != Nq or window != (-1, -1)
        tb = default_backward_tiling(d, dname, "fa2", "fast" if general else "auto", causal)
        _record_backward(o, layer=layer, step=step, problem=problem, algorithm="fa2",
                         tiling=(tb.B_r, tb.B_c))
    else:
        from .api import attention
        q, k, v = (x.detach().contiguous() for x in (query, key, value))
        o = attention(q, k, v, causal=causal, scale=scale, window=window, **drop)
    _record(layer=layer, step=step, problem=problem, algorithm="fa2",
            tiling=(t.B_r, t.B_c), num_splits=1, kv_reads="per_query_head")
    return o.transpose(1, 2).contiguous(), None


def _decode(query, key, value, causal, scale, dname, layer, step):
    """gpu.decode on the cache as transformers keeps it, or None where gpu.decode's
    kernels do not take this layout (its ValueError; gpu.attention runs it instead)."""
    from iosim.decode import DecodeProblem
    from .decode import decode
    from .decode.api import auto_num_splits, choose_kv_reads, main_kernel
    B, H, Nq, d = (int(s) for s in query.shape)
    Hk, Nk = int(key.shape[1]), int(key.shape[2])
    problem = DecodeProblem(N_kv=Nk, d=d, batch=B, heads=H, kv_heads=Hk, N_q=Nq, dtype=dname)
    kv_reads = choose_kv_reads(problem)
    S = auto_num_splits(problem, kv_reads, main_kernel(problem, kv_reads)).num_splits
    try:
        o = decode(query.detach().contiguous(), key.detach(), value.detach(),
                   num_splits=S, kv_reads=kv_reads, scale=scale, causal=causal)
    except ValueError:
        return None
    _record(layer=layer, step=step, problem=problem,
            algorithm="fa2_decode" if S == 1 else "split_kv", tiling=None, num_splits=S,
            kv_reads=kv_reads)
    return o.transpose(1, 2).contiguous()


def _padded(query, key, value, mask, causal, window, scale, p, grad, dname, layer, step):
    """The padding-mask path: unpad, gpu.attention_varlen per sequence, pad back."""
    import torch
    import iosim
    from .api import default_tiling
    B, H, Nq, d = (int(s) for s in query.shape)
    Hk, Nk = int(key.shape[1]), int(key.shape[2])
    if p:
        raise ValueError(f"dropout={p} with a padding mask is not supported (gpu."
                         f"attention_varlen has no dropout); allowed: dropout 0 (eval), or "
                         f"batches without padding")
    qmask = mask[:, Nk - Nq:]
    if window != (-1, -1):
        for b in range(B):
            kept = np.flatnonzero(mask[b])
            if kept.size and kept[-1] - kept[0] + 1 != kept.size:
                raise ValueError(f"attention_mask row {b} keeps non-contiguous positions; "
                                 f"with sliding_window allowed: left or right padding only "
                                 f"(the window counts positions)")
    cu_k = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    cu_q = np.concatenate([[0], np.cumsum(qmask.sum(1))]).astype(np.int32)
    kidx = torch.as_tensor(np.flatnonzero(mask.reshape(-1)), device=query.device)
    qidx = torch.as_tensor(np.flatnonzero(qmask.reshape(-1)), device=query.device)
    qp = query.transpose(1, 2).reshape(B * Nq, H, d).index_select(0, qidx)
    kp = key.transpose(1, 2).reshape(B * Nk, Hk, d).index_select(0, kidx)
    vp = value.transpose(1, 2).reshape(B * Nk, Hk, d).index_select(0, kidx)
    problem = iosim.VarlenProblem.from_cu_seqlens(cu_q, cu_k, d, heads=H, kv_heads=Hk,
                                                  dtype=dname, causal=causal, window=window)
    if grad:
        from .autograd import flash_attention_varlen
        from .backward import default_backward_tiling
        op = flash_attention_varlen(qp, kp, vp, cu_q, cu_k, causal=causal, scale=scale,
                                    window=window)
        tb = default_backward_tiling(d, dname, "fa2", "plain", causal)  # the varlen one's
        _record_backward(op, layer=layer, step=step, problem=problem, algorithm="fa2",
                         tiling=(tb.B_r, tb.B_c))
    else:
        from .varlen import attention_varlen
        op = attention_varlen(*(x.detach().contiguous() for x in (qp, kp, vp)), cu_q,
                              cu_k, causal=causal, scale=scale, window=window)
    out = query.new_zeros((B * Nq, H, d)).index_copy(0, qidx, op.to(query.dtype))
    t = default_tiling("fa2", d, dname, causal, "plain")
    _record(layer=layer, step=step, problem=problem, algorithm="fa2",
            tiling=(t.B_r, t.B_c), num_splits=1, kv_reads="per_query_head")
    return out.reshape(B, Nq, H, d)


__all__ = ["register", "attention_forward", "DEFAULT_NAME"]
