"""PyTorch autograd glue (needs torch; imported by nobody else): differentiable exact
attention whose forward and backward are this package's kernels.

    from gpu.autograd import flash_attention
    o = flash_attention(q, k, v, causal=True)   # q: (batch, heads, N, d), CUDA or CPU
    o.backward(do)                              # fills q.grad, k.grad, v.grad

algorithm (forward -> what it saves -> backward, `gpu.backward.attention_backward`):
  'fa2' (default)  gpu.attention(fa2, return_stats) -> O, L        -> fa2 backward kernels
  'fa1'            gpu.attention(fa1, return_stats) -> O, L        -> fa1 backward (Algorithm 4)
                   with (l, m) = (1, L), which gives the same P
  'standard'       gpu.backward.standard.standard_forward -> O, P  -> Algorithm 3's five
                   kernels; P is N x N per head, kept between forward and backward.
Tensors: torch tensors, all on one device, float32, float16 or bfloat16 (bf16 runs where
gpu.attention runs it: the plain kernels, or a tensor-core one that lists bf16; made
contiguous here). CUDA tensors run in place on torch's current stream; CPU tensors run as
the NumPy arrays sharing their memory (gpu._torch_cpu): in Numba's CUDA simulator without
a GPU, copied to the device and back with one, and the outputs and gradients are CPU
tensors. block_rows/block_cols pass to both forward and
backward; without them each side takes its default, except for 'standard' (both take the
backward default
`default_backward_tiling(d, dtype, 'standard')`: the backward reads P over its own
active tiles, so the two tilings must agree). A block_mask is (T_r, T_c) of one tiling,
so it needs block_rows and block_cols.
k, v may have N_k != N rows and window=(left, right) a local window (as gpu.attention:
bottom-right aligned) with every algorithm: the forwards take them, and the backward runs
fa2's fast kernel where it supports the tiling, else the plain one
(`attention_backward(kernel='auto')`, which runs the tensor-core one on these problems
only by name: gpu/backward/flash.py says why), fa1's and standard's plain kernels. A query row that sees no key gets O = 0 and dQ = 0 (fa1's backward is
given l = 0 there: P = 0).
"""
from __future__ import annotations

import torch

from .api import attention
from .backward import BACKWARD_ALGORITHMS, attention_backward, default_backward_tiling
from .backward.standard import standard_forward
from .varlen import attention_varlen, attention_varlen_backward


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, block_mask=None, algorithm="fa2",
                block_rows=None, block_cols=None, window=(-1, -1), dropout_p=0.0,
                dropout_seed=0, dropout_offset=0):
        if algorithm not in BACKWARD_ALGORITHMS:
            raise ValueError(f"algorithm={algorithm!r}; allowed: {', '.join(BACKWARD_ALGORITHMS)}")
        window = (-1, -1) if window is None else (
            tuple(window) if isinstance(window, (list, tuple)) else window)  # gpu.attention checks it
        if (block_rows is None) != (block_cols is None):
            raise ValueError("give both block_rows and block_cols, or neither")
        if block_mask is not None and block_rows is None:
            raise ValueError("block_mask is per tile of one tiling: give block_rows and "
                             "block_cols too (forward and backward defaults may differ)")
        # detached: torch refuses __cuda_array_interface__ on tensors that require grad
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        if algorithm == "standard" and block_rows is None:
            dname = {torch.float32: "fp32", torch.float16: "fp16",
                     torch.bfloat16: "bf16"}.get(q.dtype, "fp16")   # others: attention refuses
            t = default_backward_tiling(q.shape[-1], dname, "standard")
            block_rows, block_cols = t.B_r, t.B_c
        tiles = {} if block_rows is None else dict(block_rows=block_rows, block_cols=block_cols)
        opts = dict(causal=causal, scale=scale, block_mask=block_mask, **tiles)
        if window != (-1, -1):
            opts["window"] = window
        if dropout_p:       # the backward regenerates the keep mask from (seed, offset)
            opts.update(dropout_p=dropout_p, dropout_seed=dropout_seed,
                        dropout_offset=dropout_offset)
        if algorithm == "standard":
            o, P = standard_forward(q, k, v, **opts)
            stats = (P,)
        else:
            o, L = attention(q, k, v, algorithm=algorithm, return_stats=True, **opts)
            # fa1's backward takes (l, m): with m = L, l = 1 gives P = exp(S - L); a row
            # that saw no key (L = -inf) gets l = 0, which its backward reads as P = 0
            stats = (L,) if algorithm == "fa2" else (
                torch.where(torch.isneginf(L), torch.zeros_like(L), torch.ones_like(L)), L)
        ctx.save_for_backward(q, k, v, o, *stats)
        ctx.opts = dict(algorithm=algorithm, **opts)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, *stats = (t.detach() for t in ctx.saved_tensors)
        stats = tuple(stats) if ctx.opts["algorithm"] == "fa1" else stats[0]
        dq, dk, dv = attention_backward(q, k, v, o, do.detach().contiguous(), stats,
                                        **ctx.opts)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


def _check_tensors(**xs):
    """ValueError (one line, naming the input) unless every input is a torch tensor and all
    are on one device."""
    for name, x in xs.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor (CUDA or CPU); got "
                             f"{type(x).__name__} (NumPy arrays: gpu.attention, which is "
                             f"not differentiable)")
    devs = {name: str(x.device) for name, x in xs.items()}
    if len(set(devs.values())) > 1:
        raise ValueError("inputs on different devices (" + ", ".join(
            f"{n}: {d}" for n, d in devs.items()) + "); allowed: all on one device")


def flash_attention(q, k, v, *, causal=False, scale=None, block_mask=None, algorithm="fa2",
                    block_rows=None, block_cols=None, window=(-1, -1), dropout_p=0.0,
                    dropout_seed=0, dropout_offset=0):
    """softmax(scale Q K^T [+ mask]) V with `algorithm`'s forward and backward kernels
    (autograd; module docstring). k, v: (batch, kv_heads, N_k, d); window=(left, right)
    as gpu.attention (every algorithm). dropout_p, dropout_seed, dropout_offset: as
    gpu.attention (Philox keep mask keyed by seed and offset; the backward regenerates
    it, so the gradients are those of the dropped-out forward); fa2 and fa1 only
    (standard's backward needs the mask its forward stored, which this glue does not
    keep: ValueError)."""
    if dropout_p and algorithm == "standard":
        raise ValueError(f"dropout_p={dropout_p} with algorithm='standard' is not supported "
                         f"by gpu.autograd; allowed with dropout: algorithm='fa2' or 'fa1'")
    _check_tensors(q=q, k=k, v=v)
    return FlashAttentionFunction.apply(q, k, v, causal, scale, block_mask, algorithm,
                                        block_rows, block_cols, window, dropout_p,
                                        dropout_seed, dropout_offset)


class FlashAttentionVarlenFunction(torch.autograd.Function):
    """gpu.attention_varlen's forward and gpu.attention_varlen_backward, for autograd."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None,
                window=(-1, -1)):
        window = (-1, -1) if window is None else tuple(window)
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        opts = dict(causal=causal, scale=scale, window=window)
        o, L = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, return_stats=True,
                                **opts)
        ctx.save_for_backward(q, k, v, o, L)
        ctx.cu = (cu_seqlens_q, cu_seqlens_k)
        ctx.opts = opts
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, L = (t.detach() for t in ctx.saved_tensors)
        dq, dk, dv = attention_varlen_backward(q, k, v, o, do.detach().contiguous(), L,
                                               *ctx.cu, **ctx.opts)
        return dq, dk, dv, None, None, None, None, None


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None,
                           window=(-1, -1)):
    """Differentiable `gpu.attention_varlen` (packed (total, heads, d) torch tensors, CUDA
    or CPU, cu_seqlens (batch + 1,)): the plain fa2 varlen forward, and
    `gpu.attention_varlen_backward` for q.grad, k.grad, v.grad. causal, window, scale:
    as gpu.attention_varlen (per sequence, bottom-right aligned)."""
    _check_tensors(q=q, k=k, v=v)
    return FlashAttentionVarlenFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, causal,
                                              scale, window)


__all__ = ["FlashAttentionFunction", "flash_attention", "FlashAttentionVarlenFunction",
           "flash_attention_varlen"]
