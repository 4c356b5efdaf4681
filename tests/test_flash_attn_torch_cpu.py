"""gpu.flash_attn with torch CPU tensors (issue 40): flash-attn's call patterns run on the
CPU, in Numba's CUDA simulator (on a GPU machine, through host copies), torch in, torch out.

Covered: flash_attn_func (causal, window_size, GQA / MQA, seqlen_q != seqlen_k, dropout,
fp16 / bf16, and a hypothesis property), the packed variants, flash_attn_varlen_func with
cu_seqlens, flash_attn_with_kvcache (cache_seqlens as an int and per sequence, a paged
cache, appends in place, return_softmax_lse), gpu.autograd.flash_attention's three
algorithms, forward and backward; refusals. (That importing gpu / iosim imports no torch:
test_flash_attn_iface.)
References, independent of the code under test: iosim.reference_attention (float64, in
flashsim's layout, with the window flash-attn's rules give) for outputs and softmax_lse;
torch float64 dense attention differentiated by torch's autograd for gradients (a mask
written here from flash-attn's docstring), iosim.reference_attention_backward where the
dropout mask is needed. fp32 within 1e-5 relative (largest error over the largest
reference magnitude).
The one-import switch: a small function written against flash_attn's API, as source text,
runs with its one import line changed to gpu.flash_attn and nothing else.
Kept tiny (N <= 16, d <= 16): the simulator runs every thread in Python.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from _errors import one_line
from _fa_mask import fa_mask

torch = pytest.importorskip(
    "torch", reason="torch is not installed: these tests run flash-attn's interface on "
    "torch CPU tensors (pip install torch==2.13.0, a CPU build)")

from gpu import flash_attn as fa  # noqa: E402

TOL = 1e-5


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def _iosim_window(causal, window, Nk):
    """flash-attn's window_size as iosim's window: a side >= seqlen_k is unbounded (-1),
    causal sets right = 0."""
    left, right = (-1 if w >= Nk else w for w in window)
    if causal:
        return (left, 0) if left >= 0 else (-1, -1)
    return (left, right)


def _ref(q, k, v, causal=False, window=(-1, -1), scale=None, lse=False):
    """iosim.reference_attention (float64) in flash-attn's layout (B, N, H, d)."""
    T = lambda x: x.detach().double().numpy().transpose(0, 2, 1, 3)  # noqa: E731
    res = iosim.reference_attention(T(q), T(k), T(v), causal=causal, scale=scale,
                                    window=_iosim_window(causal, window, k.shape[1]),
                                    return_lse=lse)
    if lse:
        o, L = res
        return o.transpose(0, 2, 1, 3), L
    return res.transpose(0, 2, 1, 3)


def _dense64(q, k, v, causal=False, window=(-1, -1)):
    """Dense attention in torch float64, differentiable: (B, N, H, d) in and out; a row
    that sees no key gives 0."""
    H, Hk, d = q.shape[2], k.shape[2], q.shape[3]
    keep = torch.from_numpy(fa_mask(q.shape[1], k.shape[1], causal, window))
    qt, kt, vt = (x.double().transpose(1, 2) for x in (q, k, v))
    kt, vt = (x.repeat_interleave(H // Hk, dim=1) for x in (kt, vt))
    s = (qt @ kt.transpose(-1, -2)) / d ** 0.5
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)         # all -inf rows: NaN -> 0
    return (p @ vt).transpose(1, 2)


def _rel(got, want):
    got = got.detach().double().numpy() if isinstance(got, torch.Tensor) else got
    want = want.detach().double().numpy() if isinstance(want, torch.Tensor) else want
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _close_or_zero(got, want):
    """Within TOL of want, or exactly 0 where want is all 0 (every row masked)."""
    want = want.detach().double().numpy() if isinstance(want, torch.Tensor) else want
    if np.any(want):
        assert _rel(got, want) <= TOL, _rel(got, want)
    else:
        assert not got.detach().numpy().any()


# ---------------------------------------------------------------------------------------
# flash_attn_func: forward against float64, gradients against float64 autograd
# ---------------------------------------------------------------------------------------
#: (seqlen_q, seqlen_k, nheads, nheads_k, causal, window_size)
FUNC_CASES = [
    (6, 10, 4, 2, True, (-1, -1)),      # bottom-right causal, GQA
    (9, 5, 2, 1, True, (-1, -1)),       # seqlen_q > seqlen_k: first rows see no key (0)
    (8, 8, 2, 2, False, (3, 1)),        # local window
    (7, 12, 4, 1, True, (4, -1)),       # causal + window, MQA
]


@pytest.mark.parametrize("Nq,Nk,H,Hk,causal,window", FUNC_CASES)
def test_func_forward_and_gradients(Nq, Nk, H, Hk, causal, window):
    g = _gen(Nq * 100 + Nk)
    q, k, v = _randn(g, 1, Nq, H, 16), _randn(g, 1, Nk, Hk, 16), _randn(g, 1, Nk, Hk, 16)
    with torch.no_grad():                                   # gpu.attention directly
        out = fa.flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    assert out.dtype == torch.float32 and out.shape == (1, Nq, H, 16)
    assert out.is_contiguous() and not out.requires_grad
    assert _rel(out, _ref(q, k, v, causal, window)) <= TOL
    # under autograd: gpu.autograd.flash_attention, the fa2 backward kernels
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    og = fa.flash_attn_func(qg, kg, vg, causal=causal, window_size=window)
    assert og.requires_grad and og.dtype == torch.float32
    assert torch.equal(og.detach(), out)
    do = _randn(g, *og.shape)
    grads = torch.autograd.grad(og, (qg, kg, vg), do)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    want = torch.autograd.grad(_dense64(q64, k64, v64, causal, window), (q64, k64, v64),
                               do.double())
    for name, a, b in zip("qkv", grads, want):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert _rel(a, b) <= TOL, (name, _rel(a, b))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(Nq=st.integers(1, 10), Nk=st.integers(1, 10), Hk=st.sampled_from([1, 2]),
       g=st.sampled_from([1, 2]), causal=st.booleans(), left=st.integers(-1, 5),
       right=st.integers(-1, 5), grad=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_property_func_on_cpu_tensors(Nq, Nk, Hk, g, causal, left, right, grad, seed):
    """Any shape, mask and window: torch CPU out equal to the NumPy path's (the same
    kernels on the same memory) and to float64 attention; with grad, float64 gradients."""
    gen = _gen(seed)
    q, k, v = _randn(gen, 1, Nq, Hk * g, 8), _randn(gen, 1, Nk, Hk, 8), _randn(gen, 1, Nk,
                                                                             Hk, 8)
    w = (left, right)
    xs = tuple(x.clone().requires_grad_(grad) for x in (q, k, v))
    out = fa.flash_attn_func(*xs, causal=causal, window_size=w)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    np.testing.assert_array_equal(out.detach().numpy(), fa.flash_attn_func(
        q.numpy(), k.numpy(), v.numpy(), causal=causal, window_size=w))
    _close_or_zero(out, _ref(q, k, v, causal, w))
    if grad:
        do = _randn(gen, *out.shape)
        got = torch.autograd.grad(out, xs, do)
        x64 = tuple(x.double().requires_grad_() for x in (q, k, v))
        want = torch.autograd.grad(_dense64(*x64, causal, w), x64, do.double())
        for a, b in zip(got, want):
            _close_or_zero(a, b)


def test_func_dropout_on_cpu_tensors_is_the_philox_mask_of_torchs_seed():
    """dropout_p > 0: the keep mask is Philox's (iosim.dropout) for a seed drawn from
    torch's default generator (torch.manual_seed reproduces it); forward and gradients
    against float64 references with that mask (iosim.reference_attention and
    iosim.reference_attention_backward)."""
    from iosim.dropout import problem_keep_mask
    g = _gen(8)
    q, k, v, do = (_randn(g, 1, 8, 2, 8) for _ in range(4))
    xs = tuple(x.clone().requires_grad_() for x in (q, k, v))
    torch.manual_seed(1)
    out = fa.flash_attn_func(*xs, dropout_p=0.3, causal=True)
    torch.manual_seed(1)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item())     # the seed the call drew
    p = iosim.Problem(N=8, d=8, batch=1, heads=2, dtype="fp32", causal=True, dropout_p=0.3)
    Z = problem_keep_mask(p, seed, 0)
    assert 0 < Z.mean() < 1
    h = lambda x: x.detach().double().numpy().transpose(0, 2, 1, 3)  # noqa: E731
    want = iosim.reference_attention(h(q), h(k), h(v), causal=True, dropout_p=0.3,
                                     dropout_keep=Z)
    _close_or_zero(out, want.transpose(0, 2, 1, 3))
    got = torch.autograd.grad(out, xs, do)
    wg = iosim.reference_attention_backward(h(q), h(k), h(v), h(do), causal=True,
                                            dropout_p=0.3, dropout_keep=Z)
    for a, b in zip(got, wg):
        _close_or_zero(a, b.transpose(0, 2, 1, 3))


def test_func_half_precision_dtypes_follow_q():
    """fp16 / bf16 CPU tensors: out and gradients in q's dtype (as flash-attn's), within
    10 unit roundoffs of the dtype of float64 (fp16 10 x 2^-11, bf16 10 x 2^-8; measured
    in the simulator 2.5e-4 and 3e-3; on a GPU the tensor-core kernels round P to the
    dtype as well)."""
    g = _gen(1)
    for dt, tol in ((torch.float16, 10 * 2.0 ** -11), (torch.bfloat16, 10 * 2.0 ** -8)):
        q, k, v = (_randn(g, 1, 8, 2, 16, dtype=dt).requires_grad_() for _ in range(3))
        out = fa.flash_attn_func(q, k, v, causal=True)
        assert out.dtype == dt and out.shape == (1, 8, 2, 16) and out.is_contiguous()
        assert _rel(out.float(), _ref(q, k, v, True)) <= tol
        do = _randn(g, *out.shape, dtype=dt)
        grads = torch.autograd.grad(out, (q, k, v), do)
        x64 = tuple(x.detach().double().requires_grad_() for x in (q, k, v))
        want = torch.autograd.grad(_dense64(*x64, causal=True), x64, do.double())
        for a, b in zip(grads, want):
            assert a.dtype == dt and _rel(a.float(), b) <= tol, (dt, _rel(a.float(), b))


def test_packed_variants_and_their_gradients():
    g = _gen(2)
    qkv = _randn(g, 1, 8, 3, 2, 16).requires_grad_()
    out = fa.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = qkv.unbind(2)
    assert _rel(out, _ref(q, k, v, True)) <= TOL
    (got,) = torch.autograd.grad(out, (qkv,), torch.ones_like(out))
    q64 = qkv.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(_dense64(*q64.unbind(2), causal=True), (q64,),
                                  torch.ones(out.shape, dtype=torch.float64))
    assert _rel(got, want) <= TOL


@pytest.mark.parametrize("algorithm", ["fa2", "fa1", "standard"])
def test_autograd_every_algorithm_on_cpu_tensors(algorithm):
    """gpu.autograd.flash_attention itself, (batch, heads, N, d) CPU tensors, each
    algorithm's forward and backward kernels: float64 references (iosim.reference_attention
    and iosim.reference_attention_backward), GQA, N_k != N_q with rows that see no key."""
    from gpu.autograd import flash_attention
    g = _gen(7)
    q, do = _randn(g, 1, 2, 12, 8), _randn(g, 1, 2, 12, 8)
    k, v = _randn(g, 1, 1, 8, 8), _randn(g, 1, 1, 8, 8)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    out = flash_attention(qs, ks, vs, causal=True, algorithm=algorithm, block_rows=8,
                          block_cols=8)
    assert out.device.type == "cpu" and out.dtype == torch.float32
    out.backward(do)
    h = lambda x: x.detach().double().numpy()  # noqa: E731
    assert _rel(out, iosim.reference_attention(h(q), h(k), h(v), causal=True)) <= TOL
    want = iosim.reference_attention_backward(h(q), h(k), h(v), h(do), causal=True)
    for name, x, r in zip("qkv", (qs.grad, ks.grad, vs.grad), want):
        assert x.dtype == torch.float32 and _rel(x, r) <= TOL, (name, _rel(x, r))
    assert not out[:, :, :4].any() and not qs.grad[:, :, :4].any()   # rows with no key


# ---------------------------------------------------------------------------------------
# flash_attn_varlen_func: cu_seqlens as torch int32 CPU tensors
# ---------------------------------------------------------------------------------------
def test_varlen_forward_and_gradients():
    lens_q, lens_k = [5, 0, 9, 3], [5, 4, 12, 7]
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    g = _gen(3)
    q = _randn(g, sum(lens_q), 4, 16).requires_grad_()
    k = _randn(g, sum(lens_k), 2, 16).requires_grad_()
    v = _randn(g, sum(lens_k), 2, 16).requires_grad_()
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                    causal=True, window_size=(6, -1))
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    do = _randn(g, *out.shape)
    grads = torch.autograd.grad(out, (q, k, v), do)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    parts = []
    for b in range(4):
        a, e, ka, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if e > a:
            sl = (q64[None, a:e], k64[None, ka:ke], v64[None, ka:ke])
            parts.append(_dense64(*sl, causal=True, window=(6, -1))[0])
            want = _ref(*(x.detach() for x in sl), True, (6, -1))[0]
            assert _rel(out[a:e], want) <= TOL
    ref = torch.cat(parts)
    wgrads = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    for name, a, b in zip("qkv", grads, wgrads):
        assert _rel(a, b) <= TOL, (name, _rel(a, b))
    with torch.no_grad():                                   # gpu.attention_varlen directly
        again = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                          causal=True, window_size=(6, -1))
    assert torch.equal(again, out.detach())


# ---------------------------------------------------------------------------------------
# flash_attn_with_kvcache: cache_seqlens, paged caches, appends in place, softmax_lse
# ---------------------------------------------------------------------------------------
def test_kvcache_cache_seqlens_and_softmax_lse():
    g = _gen(4)
    kc, vc = _randn(g, 2, 16, 2, 16), _randn(g, 2, 16, 2, 16)
    q = _randn(g, 2, 2, 4, 16)
    out, lse = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=11, causal=True,
                                          return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 4, 16)
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 2)
    want, L = _ref(q, kc[:, :11], vc[:, :11], True, lse=True)
    assert _rel(out, want) <= TOL
    np.testing.assert_allclose(lse.numpy(), L, rtol=1e-5, atol=1e-5)
    # per-sequence lengths as a torch int32 tensor
    lens = torch.tensor([16, 6], dtype=torch.int32)
    out = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    for b, n in enumerate((16, 6)):
        assert _rel(out[b:b + 1], _ref(q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n],
                                       True)) <= TOL


def test_kvcache_paged_and_appends_in_place():
    g = _gen(5)
    kc, vc = _randn(g, 2, 16, 2, 16), _randn(g, 2, 16, 2, 16)
    q = _randn(g, 2, 1, 4, 16)
    # the same cache as 4-row pages in a shuffled block table
    perm = torch.randperm(8, generator=g)
    pk, pv = torch.empty(8, 4, 2, 16), torch.empty(8, 4, 2, 16)
    pk[perm], pv[perm] = kc.reshape(8, 4, 2, 16), vc.reshape(8, 4, 2, 16)
    table = perm.reshape(2, 4).to(torch.int32)
    out = fa.flash_attn_with_kvcache(q, pk, pv, cache_seqlens=13, block_table=table)
    assert _rel(out, _ref(q, kc[:, :13], vc[:, :13])) <= TOL
    # k=, v=: the new rows are written into the caller's tensors, then attended to
    k0, v0 = kc.clone(), vc.clone()
    kn, vn = _randn(g, 2, 1, 2, 16), _randn(g, 2, 1, 2, 16)
    lens = torch.tensor([7, 12], dtype=torch.int32)
    out = fa.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens, causal=True)
    for b, n in enumerate((7, 12)):
        assert torch.equal(kc[b, n], kn[b, 0]) and torch.equal(vc[b, n], vn[b, 0])
        assert torch.equal(kc[b, :n], k0[b, :n]) and torch.equal(vc[b, n + 1:], v0[b, n + 1:])
        want = _ref(q[b:b + 1], kc[b:b + 1, :n + 1], vc[b:b + 1, :n + 1], True)
        assert _rel(out[b:b + 1], want) <= TOL


# ---------------------------------------------------------------------------------------
# code written against flash-attn runs by changing one import
# ---------------------------------------------------------------------------------------
#: a user's attention block, written for flash_attn's API (as docs/flash-attn.md shows):
#: a prompt through flash_attn_func (trainable), then decoding steps on a KV cache
USER_CODE = '''
import torch
from flash_attn import flash_attn_func, flash_attn_with_kvcache


def prefill(x, wq, wk, wv, heads, kv_heads):
    """x (batch, seqlen, dim) -> attention output (batch, seqlen, dim), causal, GQA."""
    B, N, D = x.shape
    d = D // heads
    q = (x @ wq).view(B, N, heads, d)
    k = (x @ wk).view(B, N, kv_heads, d)
    v = (x @ wv).view(B, N, kv_heads, d)
    return flash_attn_func(q, k, v, causal=True).reshape(B, N, D), k, v


def decode_step(x, wq, wk, wv, heads, kv_heads, k_cache, v_cache, cache_seqlens):
    """One new token x (batch, 1, dim) against the cache, appending its K, V in place."""
    B, _, D = x.shape
    d = D // heads
    q = (x @ wq).view(B, 1, heads, d)
    k = (x @ wk).view(B, 1, kv_heads, d)
    v = (x @ wv).view(B, 1, kv_heads, d)
    o = flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                causal=True)
    return o.reshape(B, 1, D)
'''


def test_code_written_for_flash_attn_runs_by_changing_one_import():
    src = USER_CODE.replace("from flash_attn import", "from gpu.flash_attn import")
    changed = [(a, b) for a, b in zip(USER_CODE.splitlines(), src.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("from gpu.flash_attn import")
    user = {}
    exec(compile(src, "user_code.py", "exec"), user)
    g = _gen(6)
    B, N, D, H, Hk = 2, 8, 32, 4, 2
    x = _randn(g, B, N + 1, D)
    wq = _randn(g, D, D).requires_grad_()
    wk, wv = (_randn(g, D, D * Hk // H).requires_grad_() for _ in range(2))
    out, k, v = user["prefill"](x[:, :N], wq, wk, wv, H, Hk)
    assert out.shape == (B, N, D) and out.requires_grad
    (gq,) = torch.autograd.grad(out.square().sum(), (wq,))
    # the same block in float64 torch, differentiated by torch
    wq64 = wq.detach().double().requires_grad_()
    x64 = x[:, :N].double()
    q64 = (x64 @ wq64).view(B, N, H, D // H)
    k64 = (x64 @ wk.detach().double()).view(B, N, Hk, D // H)
    v64 = (x64 @ wv.detach().double()).view(B, N, Hk, D // H)
    ref = _dense64(q64, k64, v64, causal=True).reshape(B, N, D)
    assert _rel(out, ref) <= TOL
    (wgq,) = torch.autograd.grad(ref.square().sum(), (wq64,))
    assert _rel(gq, wgq) <= TOL
    # one decoding step on a cache of 12 rows holding the prompt's K, V
    kc, vc = torch.zeros(B, 12, Hk, D // H), torch.zeros(B, 12, Hk, D // H)
    kc[:, :N], vc[:, :N] = k.detach(), v.detach()
    with torch.no_grad():
        step = user["decode_step"](x[:, N:], wq, wk, wv, H, Hk, kc, vc, N)
    x64 = x.double()
    q64 = (x64 @ wq64.detach()).view(B, N + 1, H, D // H)
    k64 = (x64 @ wk.detach().double()).view(B, N + 1, Hk, D // H)
    v64 = (x64 @ wv.detach().double()).view(B, N + 1, Hk, D // H)
    ref = _dense64(q64, k64, v64, causal=True).reshape(B, N + 1, D)[:, N:]
    assert _rel(step, ref) <= TOL
    assert _rel(kc[:, N], k64[:, N]) <= TOL              # appended in place


# ---------------------------------------------------------------------------------------
# refusals with torch CPU tensors: one line, naming the argument
# ---------------------------------------------------------------------------------------
def test_refusals():
    q, k, v = (torch.zeros(1, 4, 2, 8) for _ in range(3))
    with pytest.raises(ValueError) as e:                # meta: a second torch device
        fa.flash_attn_func(q, k.to("meta"), v)
    one_line(e, "different devices", "q: cpu", "k: meta", "all on one device")
    with pytest.raises(ValueError) as e:
        fa.flash_attn_func(q, k.numpy(), v)
    one_line(e, "mixed kinds", "k: numpy")
    with pytest.raises(ValueError) as e:
        fa.flash_attn_func(q.requires_grad_(), k, v, deterministic=True)
    one_line(e, "deterministic=True", "allowed: False")
    with pytest.raises(ValueError) as e:
        fa.flash_attn_func(q.detach().double(), k.double(), v.double())
    one_line(e, "q has dtype float64", "allowed")
    with pytest.raises(ValueError) as e:
        fa.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=torch.tensor([1, 2]))
    one_line(e, "cache_seqlens has shape (2,)")
    from gpu.autograd import flash_attention
    with pytest.raises(ValueError) as e:
        flash_attention(q.detach().numpy(), k, v)
    one_line(e, "q must be a torch tensor", "ndarray")
    with pytest.raises(ValueError) as e:
        flash_attention(q, k, v.to("meta"))
    one_line(e, "different devices", "v: meta")


def test_kernel_entry_points_take_cpu_tensors_as_their_numpy_path():
    """gpu.attention, attention_backward, attention_varlen (and its backward) and decode
    take torch CPU tensors too: CPU tensors out, equal to the NumPy path bit for bit,
    ledgers unchanged."""
    import gpu
    from gpu.backward.flash import attention_backward
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(4))
    n = [x.numpy() for x in (q, k, v, do)]

    def same(got, want):
        assert isinstance(got, torch.Tensor) and got.device.type == "cpu"
        assert np.array_equal(got.numpy(), want)

    O, L = gpu.attention(q, k, v, causal=True, return_stats=True)
    On, Ln = gpu.attention(*n[:3], causal=True, return_stats=True)
    same(O, On)
    same(L, Ln)
    for got, want in zip(attention_backward(q, k, v, O, do, L, causal=True),
                         attention_backward(*n[:3], On, n[3], Ln, causal=True)):
        same(got, want)
    cu = np.array([0, 10, 24], np.int32)
    t = [x[0].transpose(0, 1).contiguous() for x in (q, k, v, do)]     # (total, heads, d)
    O, L = gpu.attention_varlen(*t[:3], cu, cu, causal=True, return_stats=True)
    On, Ln = gpu.attention_varlen(*(x.numpy() for x in t[:3]), cu, cu, causal=True,
                                  return_stats=True)
    same(O, On)
    same(L, Ln)
    for got, want in zip(gpu.attention_varlen_backward(*t[:3], O, t[3], L, cu, cu, causal=True),
                         gpu.attention_varlen_backward(*(x.numpy() for x in t[:3]), On,
                                                       t[3].numpy(), Ln, cu, cu, causal=True)):
        same(got, want)
    q1 = q[:, :, :1].contiguous()
    O, L, led = gpu.decode(q1, k, v, cache_seqlens=[24], return_stats=True, count_traffic=True)
    On, Ln, ledn = gpu.decode(q1.numpy(), *n[1:3], cache_seqlens=[24], return_stats=True,
                              count_traffic=True)
    same(O, On)
    same(L, Ln)
    assert led.counts() == ledn.counts()
