"""flash-attn 2's interface on flashsim's kernels: code written against flash-attn runs here
by changing one import,

    from flash_attn import flash_attn_func          # before
    from gpu.flash_attn import flash_attn_func      # after

`flash_attn_func`, `flash_attn_varlen_func` and `flash_attn_with_kvcache` keep flash-attn's
names, argument names, defaults, layouts and return values (flash_attn/flash_attn_interface.py
of Dao-AILab/flash-attention, version 2):

    flash_attn_func         q (batch, seqlen_q, nheads, headdim), k, v (batch, seqlen_k,
                            nheads_k, headdim) -> out (batch, seqlen_q, nheads, headdim)
    flash_attn_varlen_func  packed q (total_q, nheads, headdim), k, v (total_k, nheads_k,
                            headdim) with cu_seqlens_q / cu_seqlens_k (batch + 1,) int32
                            -> out (total_q, nheads, headdim)
    flash_attn_with_kvcache q (batch, seqlen_q, nheads, headdim) against a cache
                            (batch, seqlen_cache, nheads_k, headdim), or paged
                            (num_blocks, page_block_size, nheads_k, headdim) with
                            block_table -> out, and (out, softmax_lse) with
                            return_softmax_lse=True; softmax_lse (batch, nheads, seqlen_q)

The packed variants flash_attn_qkvpacked_func, flash_attn_kvpacked_func,
flash_attn_varlen_qkvpacked_func and flash_attn_varlen_kvpacked_func (q, k, v stacked in
one tensor) run the two above on the slices.

What runs: flash_attn_func -> gpu.attention (fa2; kernel 'auto': the tensor-core kernel for
fp16 where it runs, else the fast or plain one, as gpu.attention picks), or
gpu.autograd.flash_attention when a torch input requires grad (fa2 forward and backward);
flash_attn_varlen_func -> gpu.attention_varlen (its one plain kernel), or
gpu.autograd.flash_attention_varlen under autograd; flash_attn_with_kvcache -> gpu.decode
(split-KV decoding, num_splits=0: iosim.choose_num_splits for this GPU). flashsim's kernels
take (batch, heads, N, d): flash_attn_func copies q, k, v into that layout (one transposed
copy each, and one of out back; under autograd the gradients flow back through the same
transposes). The packed varlen layout is flashsim's own: no copy.

Semantics, as flash-attn's: softmax_scale defaults to 1/sqrt(headdim); causal is aligned
to the bottom right of the (seqlen_q, seqlen_k) matrix (row i sees key j iff
j <= i + seqlen_k - seqlen_q); window_size=(left, right) keeps keys i + seqlen_k - seqlen_q
- left .. i + seqlen_k - seqlen_q + right, a negative side unbounded, a side >= seqlen_k
unbounded (flash-attn resets it to -1), and causal sets right = 0; GQA / MQA: nheads_k
divides nheads and query head h reads K/V head h // (nheads // nheads_k); a row that sees
no key gets out = 0 (softmax_lse = -inf).

Inputs: NumPy arrays (run on the GPU, or in Numba's simulator without one; NumPy out) or
torch tensors, all on one device (torch out, on that device): CUDA tensors run in place;
CPU tensors run as the NumPy arrays sharing their memory (gpu._torch_cpu: in the
simulator without a GPU, copied to the device and back with one), and are differentiable
too. float16 and bfloat16 as flash-attn, and float32 as well (flash-attn refuses it;
flashsim's kernels run it). torch is imported only when a tensor is given: `import
gpu.flash_attn` needs neither torch nor a GPU.

Refused with a one-line ValueError naming the argument and what is allowed (flashsim's
kernels have no such feature; never silently ignored): softcap != 0, alibi_slopes,
return_attn_probs=True (flash-attn's testing-only S_dmask), dropout in
flash_attn_varlen_func (its kernel has none), deterministic=True where a backward may run
(the fa2 backward accumulates dQ with float32 atomic adds), block_table in
flash_attn_varlen_func, and in flash_attn_with_kvcache: rotary_cos / rotary_sin,
cache_leftpad, a local window, alibi_slopes, softcap, seqlen_q above 16 (gpu.decode's
limit).
"""
from __future__ import annotations

import numpy as np

from ._torch_cpu import torch_of as _torch_of

#: largest head dimension (flash-attn's and flashsim's)
MAX_HEADDIM = 256
#: most new query rows a flash_attn_with_kvcache call takes (gpu.decode's N_q limit)
MAX_DECODE_ROWS = 16


# ---------------------------------------------------------------------------------------
# checks shared by the three entry points
# ---------------------------------------------------------------------------------------
def _kind(names_values):
    """'numpy' or 'torch' for the named inputs (all of one kind; torch tensors all on one
    device, CUDA or CPU); ValueError naming the first input that is neither, or the kinds /
    devices where they differ."""
    kinds, devices = [], []
    for name, x in names_values:
        if isinstance(x, np.ndarray):
            kinds.append("numpy")
            continue
        if _torch_of(x) is None:
            raise ValueError(f"{name} must be a NumPy array or a torch tensor (CUDA or CPU); "
                             f"got {type(x).__name__}")
        kinds.append("torch")
        devices.append((name, str(x.device)))
    if len(set(kinds)) > 1:
        names = ", ".join(f"{n}: {k}" for (n, _), k in zip(names_values, kinds))
        raise ValueError(f"inputs of mixed kinds ({names}); give all NumPy arrays or all "
                         f"torch tensors")
    if len({dev for _, dev in devices}) > 1:
        raise ValueError("torch inputs on different devices (" + ", ".join(
            f"{n}: {dev}" for n, dev in devices) + "); allowed: all on one device")
    return kinds[0]


def _shape(name, x, dims: tuple[str, ...]):
    shape = tuple(int(s) for s in x.shape)
    if len(shape) != len(dims):
        raise ValueError(f"{name} has shape {shape} (ndim={len(shape)}); expected "
                         f"({', '.join(dims)})")
    return shape


def _same_dtype(**xs):
    dts = {n: str(x.dtype) for n, x in xs.items()}
    if len(set(dts.values())) > 1:
        raise ValueError("inputs must have the same dtype; got " +
                         ", ".join(f"{n}: {t}" for n, t in dts.items()))


def _headdim(d, nheads, nheads_k, who="k"):
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"headdim={d} is not supported; allowed: 1..{MAX_HEADDIM}")
    if nheads_k < 1 or nheads % nheads_k:
        raise ValueError(f"{who} has nheads_k={nheads_k}, which must divide q's nheads="
                         f"{nheads} (number of heads in key/value must divide number of "
                         f"heads in query)")


def _refuse_unsupported(*, softcap=0.0, alibi_slopes=None, return_attn_probs=False):
    if softcap != 0.0:
        raise ValueError(f"softcap={softcap!r} is not supported by flashsim's kernels; "
                         f"allowed: 0.0 (no soft-capping)")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes is not supported by flashsim's kernels (no ALiBi "
                         "bias); allowed: None")
    if return_attn_probs:
        raise ValueError("return_attn_probs=True is not supported (flash-attn's testing-only "
                         "S_dmask is not computed); allowed: False (gpu.attention(..., "
                         "return_stats=True) returns the logsumexp)")


def _window(window_size, causal, seqlen_q, seqlen_k):
    """(causal, (left, right)) as flash-attn normalises them: a negative side -> -1, a side
    >= seqlen_k -> -1, seqlen_q = 1 -> not causal (the same mask), causal -> right = 0."""
    try:
        left, right = (int(w) for w in window_size)
        ok = all(float(w) == int(w) for w in window_size)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"window_size={window_size!r} is not allowed; allowed: (left, "
                         f"right), two ints, -1 for an unbounded side")
    left, right = (-1 if w < 0 or w >= seqlen_k else w for w in (left, right))
    causal = bool(causal) and seqlen_q != 1
    if causal:
        right = 0
    if causal and left == -1:
        return True, (-1, -1)
    return causal, (left, right)


def _scale(softmax_scale, d):
    if softmax_scale is None:
        return 1.0 / float(np.sqrt(d))
    try:
        return float(softmax_scale)
    except (TypeError, ValueError):
        raise ValueError(f"softmax_scale={softmax_scale!r} is not allowed; allowed: None "
                         f"(1/sqrt(headdim)) or a number") from None


def _dropout_p(dropout_p):
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        p = -1.0
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r} is not allowed; allowed: 0 <= dropout_p "
                         f"< 1")
    return p


def _seed(kind):
    """A fresh Philox seed for one dropout call: torch's default CPU generator for torch
    inputs (torch.manual_seed reproduces it), NumPy's global one for NumPy inputs."""
    if kind == "torch":
        import torch
        return int(torch.randint(0, 2 ** 62, (1,)).item())
    return int(np.random.randint(0, 2 ** 62, dtype=np.int64))


def _needs_grad(kind, *xs):
    if kind != "torch":
        return False
    import torch
    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


def _bhnd(x, kind):
    """(batch, N, heads, d) -> flashsim's (batch, heads, N, d), a C-contiguous copy (torch:
    a differentiable view-then-copy)."""
    if kind == "numpy":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    return x.transpose(1, 2).contiguous()


def _bnhd(o, kind):
    """flashsim's (batch, heads, N, d) -> flash-attn's (batch, N, heads, d), contiguous."""
    if kind == "numpy":
        return np.ascontiguousarray(o.transpose(0, 2, 1, 3))
    return o.transpose(1, 2).contiguous()


def _host_ints(name, x):
    """An integer array on the host (a torch tensor: copied from the device)."""
    if _torch_of(x) is not None:
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} has dtype {a.dtype}; allowed: int32 (an integer array)")
    return a


# ---------------------------------------------------------------------------------------
# flash_attn_func
# ---------------------------------------------------------------------------------------
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """flash-attn's flash_attn_func on flashsim's fa2 kernels.

    q: (batch_size, seqlen_q, nheads, headdim); k, v: (batch_size, seqlen_k, nheads_k,
    headdim), nheads_k dividing nheads (MQA / GQA). NumPy arrays or torch tensors (CUDA
    or CPU), one dtype (float16, bfloat16, float32). dropout_p: probability of dropping
    each entry of P (0 evaluation; > 0 runs gpu.attention's Philox dropout with a fresh
    seed per call, and its backward regenerates the same mask). softmax_scale: default
    1/sqrt(headdim).
    causal (bottom-right), window_size=(left, right): module docstring. softcap,
    alibi_slopes, return_attn_probs=True: refused (ValueError). deterministic: accepted
    (the forward is deterministic); True is refused when a torch input requires grad (the
    backward's dQ uses atomic adds).
    Returns out (batch_size, seqlen_q, nheads, headdim) in q's dtype and kind; torch
    inputs that require grad get an out that backpropagates through flashsim's fa2
    backward (gpu.autograd.flash_attention).
    Cost of the layout: q, k, v are copied into (batch, heads, N, d) and out back (one
    read and one write of each; not counted in flashsim's ledgers, which count the
    kernels).
    """
    _refuse_unsupported(softcap=softcap, alibi_slopes=alibi_slopes,
                        return_attn_probs=return_attn_probs)
    kind = _kind((("q", q), ("k", k), ("v", v)))
    B, Nq, H, d = _shape("q", q, ("batch_size", "seqlen_q", "nheads", "headdim"))
    ks = _shape("k", k, ("batch_size", "seqlen_k", "nheads_k", "headdim"))
    vs = _shape("v", v, ("batch_size", "seqlen_k", "nheads_k", "headdim"))
    if ks[0] != B or ks[3] != d or vs != ks:
        raise ValueError(f"k has shape {ks} and v has shape {vs}; both must be (batch_size="
                         f"{B}, seqlen_k, nheads_k, headdim={d}), the same, to match q "
                         f"{(B, Nq, H, d)}")
    _same_dtype(q=q, k=k, v=v)
    _headdim(d, H, ks[2])
    p = _dropout_p(dropout_p)
    causal, window = _window(window_size, causal, Nq, ks[1])
    scale = _scale(softmax_scale, d)
    grad = _needs_grad(kind, q, k, v)
    if grad and deterministic:
        raise ValueError("deterministic=True is not supported with gradients (flashsim's "
                         "fa2 backward accumulates dQ with float32 atomic adds); allowed: "
                         "False")
    drop = dict(dropout_p=p, dropout_seed=_seed(kind)) if p else {}
    if grad:
        from .autograd import flash_attention
        o = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            causal=causal, scale=scale, window=window, **drop)
    else:
        from .api import attention
        if kind == "torch":     # torch gives no __cuda_array_interface__ to grad tensors
            q, k, v = (x.detach() for x in (q, k, v))
        o = attention(_bhnd(q, kind), _bhnd(k, kind), _bhnd(v, kind), causal=causal,
                      scale=scale, window=window, **drop)
    return _bnhd(o, kind)


# ---------------------------------------------------------------------------------------
# flash_attn_varlen_func
# ---------------------------------------------------------------------------------------
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn's flash_attn_varlen_func on gpu.attention_varlen (fa2, plain kernel).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_q,
    cu_seqlens_k: (batch_size + 1,) int32, sequence b is q rows cu_seqlens_q[b] ..
    cu_seqlens_q[b+1] - 1 against k, v rows cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1.
    max_seqlen_q, max_seqlen_k: the longest sequences; flash-attn sizes its grid by them, so
    a value below the actual longest is a ValueError here (never rows left unwritten).
    causal, window_size: per sequence, bottom-right aligned (module docstring; a window
    side >= max_seqlen_k is unbounded). dropout_p > 0, softcap, alibi_slopes,
    return_attn_probs=True, block_table (paged K/V): refused (ValueError).
    deterministic=True: refused when a torch input requires grad.
    Returns out (total_q, nheads, headdim); torch inputs that require grad backpropagate
    through gpu.attention_varlen_backward (gpu.autograd.flash_attention_varlen).
    cu_seqlens are read on the host (a device tensor is copied there: one small
    device-to-host copy per call, which waits for its producer).
    """
    _refuse_unsupported(softcap=softcap, alibi_slopes=alibi_slopes,
                        return_attn_probs=return_attn_probs)
    if block_table is not None:
        raise ValueError("block_table (paged K/V) is not supported by flash_attn_varlen_func "
                         "here (gpu.attention_varlen takes packed K/V); allowed: None (or "
                         "flash_attn_with_kvcache, which takes a paged cache)")
    if _dropout_p(dropout_p):
        raise ValueError(f"dropout_p={dropout_p!r} is not supported by flash_attn_varlen_func "
                         f"(gpu.attention_varlen's kernel has no dropout); allowed: 0.0 "
                         f"(flash_attn_func runs dropout)")
    kind = _kind((("q", q), ("k", k), ("v", v)))
    Tq, H, d = _shape("q", q, ("total_q", "nheads", "headdim"))
    ks = _shape("k", k, ("total_k", "nheads_k", "headdim"))
    vs = _shape("v", v, ("total_k", "nheads_k", "headdim"))
    if ks[2] != d or vs != ks:
        raise ValueError(f"k has shape {ks} and v has shape {vs}; both must be (total_k, "
                         f"nheads_k, headdim={d}), the same, to match q {(Tq, H, d)}")
    _same_dtype(q=q, k=k, v=v)
    _headdim(d, H, ks[1])
    cq, ck = _host_ints("cu_seqlens_q", cu_seqlens_q), _host_ints("cu_seqlens_k", cu_seqlens_k)
    for name, cu, mx in (("max_seqlen_q", cq, max_seqlen_q), ("max_seqlen_k", ck, max_seqlen_k)):
        longest = int(np.max(np.diff(cu))) if cu.ndim == 1 and cu.size > 1 else 0
        if not isinstance(mx, (int, np.integer)) or isinstance(mx, bool) or mx < longest:
            raise ValueError(f"{name}={mx!r} is not allowed; allowed: an int >= the longest "
                             f"sequence in cu_seqlens_{name[-1]} ({longest})")
    causal, window = _window(window_size, causal, int(max_seqlen_q), int(max_seqlen_k))
    scale = _scale(softmax_scale, d)
    if _needs_grad(kind, q, k, v):
        if deterministic:
            raise ValueError("deterministic=True is not supported with gradients (flashsim's "
                             "fa2 backward accumulates dQ with float32 atomic adds); allowed: "
                             "False")
        from .autograd import flash_attention_varlen
        return flash_attention_varlen(q, k, v, cq, ck, causal=causal, scale=scale,
                                      window=window)
    from .varlen import attention_varlen
    if kind == "torch":
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
    else:                   # flash-attn makes its inputs contiguous too (maybe_contiguous)
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    return attention_varlen(q, k, v, cq, ck, causal=causal, scale=scale, window=window)


# ---------------------------------------------------------------------------------------
# the packed variants: q, k, v stacked in one tensor (flash-attn's *_qkvpacked_func and
# *_kvpacked_func); slices of it run the functions above (differentiable slices for torch)
# ---------------------------------------------------------------------------------------
def _unstack(name, x, axis, n, dims):
    shape = _shape(name, x, dims)
    if shape[axis] != n:
        raise ValueError(f"{name} has shape {shape}; its axis {axis} must be {n} "
                         f"({', '.join(dims)})")
    if isinstance(x, np.ndarray):
        return [np.take(x, i, axis=axis) for i in range(n)]
    if _torch_of(x) is None:
        raise ValueError(f"{name} must be a NumPy array or a torch tensor (CUDA or CPU); "
                         f"got {type(x).__name__}")
    return list(x.unbind(axis))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_qkvpacked_func: qkv (batch_size, seqlen, 3, nheads, headdim)
    -> out (batch_size, seqlen, nheads, headdim); `flash_attn_func` on its three slices."""
    q, k, v = _unstack("qkv", qkv, 2, 3, ("batch_size", "seqlen", "3", "nheads", "headdim"))
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_kvpacked_func: q (batch_size, seqlen_q, nheads, headdim), kv
    (batch_size, seqlen_k, 2, nheads_k, headdim); `flash_attn_func` on q and kv's slices."""
    k, v = _unstack("kv", kv, 2, 2, ("batch_size", "seqlen_k", "2", "nheads_k", "headdim"))
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash-attn's flash_attn_varlen_qkvpacked_func: qkv (total, 3, nheads, headdim), one
    cu_seqlens for queries and keys; `flash_attn_varlen_func` on its slices."""
    q, k, v = _unstack("qkv", qkv, 1, 3, ("total", "3", "nheads", "headdim"))
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """flash-attn's flash_attn_varlen_kvpacked_func: q (total_q, nheads, headdim), kv
    (total_k, 2, nheads_k, headdim); `flash_attn_varlen_func` on q and kv's slices."""
    k, v = _unstack("kv", kv, 1, 2, ("total_k", "2", "nheads_k", "headdim"))
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


# ---------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------
def _cache_seqlens(cache_seqlens, B, kind):
    """cache_seqlens as gpu.decode takes it: None, an int (one length), or an int32 NumPy
    array (batch,) of per-sequence lengths (a torch tensor is copied to the host)."""
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        return int(cache_seqlens)
    a = _host_ints("cache_seqlens", cache_seqlens)
    if a.ndim == 0:
        return int(a)
    if a.shape != (B,):
        raise ValueError(f"cache_seqlens has shape {a.shape}; allowed: an int or (batch_size="
                         f"{B},) int32")
    if a.size and a[0] >= 1 and np.all(a == a[0]):
        return int(a[0])        # one length: what gpu.decode has always taken
    return np.ascontiguousarray(a, dtype=np.int32)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash-attn's flash_attn_with_kvcache on gpu.decode (split-KV decoding).

    q: (batch_size, seqlen_q, nheads, headdim), seqlen_q in 1..16 (gpu.decode's limit).
    k_cache, v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim), or with
    block_table (batch_size, max_num_blocks_per_seq) int32 a paged cache (num_blocks,
    page_block_size, nheads_k, headdim) (any page_block_size; flash-attn asks for a
    multiple of 256). cache_seqlens: None (the whole cache), an int, or (batch_size,) int32
    per-sequence lengths. k, v: optional (batch_size, seqlen_new, nheads_k, headdim) new
    rows, written into the cache *in place* at rows cache_seqlens[b] .., then attended to
    with the cache (cache_seqlens is required with them; seqlen_new must equal seqlen_q,
    where flash-attn allows any). cache_batch_idx: (batch_size,)
    int32, the cache entry of each sequence (contiguous caches only).
    causal: bottom-right (row i sees cache rows j <= i + seqlen_k - seqlen_q, seqlen_k the
    sequence's cache length after the append); False: every row sees the whole cache.
    num_splits: 0 (auto: iosim.choose_num_splits for this GPU's SM count) or the number of
    KV splits S (every split non-empty). return_softmax_lse: also return softmax_lse
    (batch_size, nheads, seqlen_q) float32.
    Refused (ValueError): rotary_cos / rotary_sin, cache_leftpad, alibi_slopes, softcap,
    a window other than unbounded (gpu.decode has no local window), seqlen_q > 16.
    Not differentiable (as flash-attn's).

    Layout and its cost. gpu.decode takes q as (batch, heads, N_q, d): q and k, v (the new
    rows) are copied into that layout, out back (seqlen_q and seqlen_new rows: small). The
    cache is NOT copied: a contiguous flash-attn cache (batch_size_cache, seqlen_cache,
    nheads_k, d) is exactly gpu.decode's paged layout with one page of seqlen_cache rows
    per sequence, so it runs as a paged cache with block_table[b] = [b] (or
    [cache_batch_idx[b]]): no transposed copy of the cache (which would read and write
    all of it every step), at the price of one int32 block-table read per page per thread
    block (counted in gpu.decode's ledger, iosim.decode's paged schedule). A torch
    cache_seqlens tensor is copied to the host (one small device-to-host copy, which waits
    for its producer). Per-sequence cache_seqlens and k=/v= run on gpu.decode's
    cache_seqlens=(batch,) and k=/v= (the new rows in (batch, kv_heads, N_q, d)).
    """
    if rotary_cos is not None or rotary_sin is not None:
        raise ValueError("rotary_cos / rotary_sin are not supported (flashsim's kernels apply "
                         "no rotary embedding); allowed: None (rotate q and k before the call)")
    if cache_leftpad is not None:
        raise ValueError("cache_leftpad is not supported by gpu.decode (every cache starts "
                         "at row 0); allowed: None")
    _refuse_unsupported(softcap=softcap, alibi_slopes=alibi_slopes)
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (new rows to append) or both be "
                         "None")
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if k is not None:
        named += [("k", k), ("v", v)]
    kind = _kind(named)
    if kind == "torch":     # not differentiable; detach() shares storage: appends land
        q, k_cache, v_cache, k, v = (None if x is None else x.detach()
                                     for x in (q, k_cache, v_cache, k, v))
    B, Nq, H, d = _shape("q", q, ("batch_size", "seqlen_q", "nheads", "headdim"))
    paged = block_table is not None
    dims = (("num_blocks", "page_block_size", "nheads_k", "headdim") if paged else
            ("batch_size_cache", "seqlen_cache", "nheads_k", "headdim"))
    cs = _shape("k_cache", k_cache, dims)
    vcs = _shape("v_cache", v_cache, dims)
    if vcs != cs or cs[3] != d:
        raise ValueError(f"k_cache has shape {cs} and v_cache has shape {vcs}; both must be "
                         f"({', '.join(dims[:3])}, headdim={d}), the same")
    Hk = cs[2]
    _same_dtype(q=q, k_cache=k_cache, v_cache=v_cache, **({} if k is None else dict(k=k, v=v)))
    _headdim(d, H, Hk, "k_cache")
    if not 1 <= Nq <= MAX_DECODE_ROWS:
        raise ValueError(f"q has seqlen_q={Nq}; allowed: 1..{MAX_DECODE_ROWS} new rows "
                         f"(gpu.decode's limit; for a longer prompt use flash_attn_func or "
                         f"flash_attn_varlen_func)")
    if paged and cache_batch_idx is not None:
        raise ValueError("cache_batch_idx is not supported with block_table (the block table "
                         "already maps each sequence to its pages); allowed: None")
    if not paged and cache_batch_idx is None and cs[0] != B:
        raise ValueError(f"k_cache has batch_size_cache={cs[0]}; it must equal q's batch_size="
                         f"{B} (or give cache_batch_idx)")
    seqlen_k = cs[1] if not paged else int(block_table.shape[1]) * cs[1]
    causal, window = _window(window_size, causal, Nq, seqlen_k)
    if window != (-1, -1) and not (window == (-1, 0) and not causal):
        raise ValueError(f"window_size={tuple(window_size)!r} is not supported by "
                         f"flash_attn_with_kvcache (gpu.decode has no local window); "
                         f"allowed: (-1, -1), or a left side >= the cache's {seqlen_k} rows")
    if window == (-1, 0):
        causal = True
    if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) \
            or num_splits < 0:
        raise ValueError(f"num_splits={num_splits!r} is not allowed; allowed: 0 (auto) or a "
                         f"positive int")
    seqlens = _cache_seqlens(cache_seqlens, B, kind)
    extra = {}
    if k is not None:
        if seqlens is None:
            raise ValueError("cache_seqlens is required with k, v (the row where each "
                             "sequence's new rows go); allowed: an int or (batch_size,) int32")
        ns = _shape("k", k, ("batch_size", "seqlen_new", "nheads_k", "headdim"))
        if ns[0] != B or ns[2:] != (Hk, d) or _shape("v", v, ("batch_size", "seqlen_new",
                                                             "nheads_k", "headdim")) != ns:
            raise ValueError(f"k has shape {ns} and v has shape {tuple(v.shape)}; both must "
                             f"be (batch_size={B}, seqlen_new, nheads_k={Hk}, headdim={d})")
        if ns[1] != Nq:
            raise ValueError(f"k, v have seqlen_new={ns[1]} rows; allowed: seqlen_q={Nq} "
                             f"(gpu.decode appends the rows of the new queries)")
        extra = dict(k=_bhnd(k, kind), v=_bhnd(v, kind))
    if paged:
        table = block_table
        if kind == "numpy":
            table = np.ascontiguousarray(_host_ints("block_table", block_table), dtype=np.int32)
    else:
        # the contiguous cache as pages of seqlen_cache rows: one page per sequence
        idx = (np.arange(B, dtype=np.int32) if cache_batch_idx is None else
               _host_ints("cache_batch_idx", cache_batch_idx).astype(np.int32))
        if idx.shape != (B,) or (idx.size and (idx.min() < 0 or idx.max() >= cs[0])):
            raise ValueError(f"cache_batch_idx={cache_batch_idx!r} is not allowed; allowed: "
                             f"(batch_size={B},) ints in 0..{cs[0] - 1}")
        table = np.ascontiguousarray(idx.reshape(B, 1))
        if kind == "torch":
            import torch
            table = torch.as_tensor(table, device=q.device)
    from .decode import decode
    res = decode(_bhnd(q, kind), k_cache, v_cache, cache_seqlens=seqlens,
                 block_table=table, num_splits="auto" if num_splits == 0 else int(num_splits),
                 scale=_scale(softmax_scale, d), causal=causal,
                 return_stats=bool(return_softmax_lse), **extra)
    if return_softmax_lse:
        out, lse = res
        return _bnhd(out, kind), lse
    return _bnhd(res, kind)


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]
