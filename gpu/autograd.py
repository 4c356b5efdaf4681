"""PyTorch autograd glue (needs torch; imported by nobody else): a differentiable fa2
attention whose forward is `gpu.attention(..., algorithm='fa2', return_stats=True)` and
whose backward is `gpu.backward.attention_backward` (the fa2 backward kernels).

    from gpu.autograd import flash_attention
    o = flash_attention(q, k, v, causal=True)   # q: (batch, heads, N, d) CUDA tensors
    o.backward(do)                              # fills q.grad, k.grad, v.grad

Tensors must be CUDA, C-contiguous, float32 or float16 (the simulator takes no torch
tensors). block_mask and tiling keywords pass through to both kernels.
"""
from __future__ import annotations

import torch

from .api import attention
from .backward import attention_backward


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None, block_mask=None):
        q, k, v = (x.contiguous() for x in (q, k, v))
        o, L = attention(q, k, v, algorithm="fa2", causal=causal, scale=scale,
                         block_mask=block_mask, return_stats=True)
        ctx.save_for_backward(q, k, v, o, L)
        ctx.opts = dict(causal=causal, scale=scale, block_mask=block_mask)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, L = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, do.contiguous(), L, algorithm="fa2",
                                        **ctx.opts)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, *, causal=False, scale=None, block_mask=None):
    """softmax(scale Q K^T [+ mask]) V with fa2 forward and backward kernels (autograd)."""
    return FlashAttentionFunction.apply(q, k, v, causal, scale, block_mask)


__all__ = ["FlashAttentionFunction", "flash_attention"]
