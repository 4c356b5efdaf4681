"""Dropout (issue 18, item 3; FlashAttention paper Algorithms 2 and 4).

Philox-4x32-10 against the Random123 known-answer vectors; the keep mask's statistics;
the model (executed schedules == closed forms, outputs == the dense float64 reference
given the same mask Z); the kernels (plain fa2 forward and backward, in the simulator):
outputs and gradients against the reference given iosim's mask, so forward and backward
agree on it, exact counts, p = 0 bit-identical to no dropout, bad arguments refused.
"""
import json

import numpy as np
import pytest
from numba import cuda

import gpu
from gpu import _philox
import iosim
from gpu.backward import attention_backward
from iosim.backward import (backward_closed_form, execute_backward,
                            reference_attention_backward)
from iosim.dropout import (keep_mask, keep_threshold, philox4x32, problem_keep_mask,
                           seed_key)

M32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------
# Philox
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("counter, key, expected", [
    # Random123 kat_vectors, philox4x32 10 rounds
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    got = philox4x32(counter, key)
    assert tuple(int(x) for x in got) == expected
    # vectorised: the same call inside a batch of others gives the same words
    batch = philox4x32((np.array([1, counter[0], 7]), counter[1], counter[2], counter[3]), key)
    assert tuple(int(w[1]) for w in batch) == expected


@cuda.jit
def _fill_keep(out, key0, key1, offset, thr, M, z):
    """out[e] = keep(row e // M, col e % M of instance z) by the device Philox."""
    e = cuda.grid(1)
    if e < out.size:
        out[e] = 1 if _philox.keep(key0, key1, offset, z, e // M, e % M, thr) else 0


def test_device_philox_matches_host():
    """gpu._philox (the kernels' device function) is bit-identical to iosim.dropout."""
    seed, offset, p = 2 ** 40 + 77, 3, 0.3
    out = cuda.to_device(np.zeros(12 * 10, dtype=np.uint8))
    key0, key1, off, thr, _ = _philox.kernel_args(p, seed, offset)
    _fill_keep[4, 32](out, key0, key1, off, thr, 10, 1 * 4 + 1)        # z = b * heads + h
    got = out.copy_to_host().reshape(12, 10).astype(bool)
    assert np.array_equal(got, keep_mask(seed, offset, 1, 1, range(12), range(10), p, heads=4))


def test_keep_threshold_is_u_ge_p():
    """keep iff x >= ceil(p 2^32) is exactly u = x 2^-32 >= p (on the boundary too)."""
    for p in (0.0, 0.1, 0.5, 1 - 2 ** -33, 0.3):
        t = keep_threshold(p)
        for x in (t - 1, t, t + 1):
            if 0 <= x <= M32:
                assert (x * 2.0 ** -32 >= p) == (x >= t)
    assert seed_key(2 ** 40 + 5) == (5, 256)


# ---------------------------------------------------------------------------------------
# Mask statistics
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_fraction_binomial(p):
    """~1.3e5 draws: the kept fraction is within 5 binomial standard deviations of 1 - p
    (a generator off by 1% fails), in every row block and column residue mod 4 too."""
    Z = problem_keep_mask(iosim.Problem(N=256, d=16, heads=2, N_k=256, dropout_p=p), seed=7)
    n = Z.size
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(Z.mean() - (1 - p)) < 5 * sd
    for w in range(4):                                     # each Philox output word
        part = Z[..., w::4]
        assert abs(part.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / part.size)


def test_mask_depends_on_every_coordinate():
    """Same (seed, offset) -> same mask; a different seed, offset, batch, head, row or
    column gives a different, uncorrelated one (about half the entries differ at p=0.5)."""
    p, rows, cols = 0.5, range(64), range(64)
    base = keep_mask(1, 0, 0, 0, rows, cols, p, heads=2)
    assert np.array_equal(base, keep_mask(1, 0, 0, 0, rows, cols, p, heads=2))
    others = [keep_mask(2, 0, 0, 0, rows, cols, p, heads=2),
              keep_mask(1, 1, 0, 0, rows, cols, p, heads=2),
              keep_mask(1, 0, 0, 1, rows, cols, p, heads=2),
              keep_mask(1, 0, 1, 0, rows, cols, p, heads=2),
              keep_mask(2 ** 32 + 1, 0, 0, 0, rows, cols, p, heads=2),   # seed's high word
              keep_mask(1, 0, 0, 0, range(1, 65), cols, p, heads=2),     # shifted rows
              keep_mask(1, 0, 0, 0, rows, range(4, 68), p, heads=2)]     # shifted columns
    for Z in others:
        assert 0.4 < (Z != base).mean() < 0.6
    # a sub-block is the full mask's sub-block (what each tile regenerates)
    assert np.array_equal(keep_mask(1, 0, 0, 0, range(5, 9), range(3, 11), p, heads=2),
                          base[5:9, 3:11])


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), "0.5x"])
def test_bad_dropout_p_rejected(p):
    with pytest.raises(iosim.ConfigError, match="dropout_p"):
        iosim.Problem(N=8, d=8, dropout_p=p)
    q = np.zeros((1, 1, 16, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="dropout_p"):
        gpu.attention(q, q, q, dropout_p=p)


def test_kernels_without_dropout_refuse_it():
    """Every forward kernel of every algorithm takes dropout now (`DROPOUT_KERNELS`);
    what stays refused is refused for every p, by a ValueError naming the parameter, the
    value and what is allowed: the standard backward's kernel='fast' (it has none) and
    fa1's backward kernel='tc'; so are a bad seed and standard's backward without its Z."""
    from gpu.api import DROPOUT_KERNELS
    for alg in ("standard", "fa1", "fa2"):
        assert DROPOUT_KERNELS[alg] == ("auto", "plain", "fast", "tc")
    q = np.zeros((1, 1, 16, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="kernel='fast' runs only algorithm='fa2'"):
        attention_backward(q, q, q, q, q, (q, q.astype(np.uint8)), algorithm="standard",
                           kernel="fast", dropout_p=0.2)
    with pytest.raises(ValueError, match="kernel='tc'"):     # fa1 has one backward kernel
        attention_backward(q, q, q, q, q, (q[..., 0], q[..., 0]), algorithm="fa1",
                           kernel="tc", dropout_p=0.2)
    with pytest.raises(ValueError, match="dropout_seed"):
        gpu.attention(q, q, q, dropout_p=0.2, dropout_seed=-1)
    with pytest.raises(ValueError, match=r"\(P, Z\)"):        # standard needs the stored Z
        attention_backward(q, q, q, q, q, np.zeros((1, 1, 16, 16), np.float32),
                           algorithm="standard", dropout_p=0.2)


PROBLEMS = [dict(N=19, d=8, batch=2, heads=2, kv_heads=1),
            dict(N=21, N_k=13, d=8, heads=2, causal=True),
            dict(N=16, d=8, window=(3, 2))]


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("kw", PROBLEMS)
def test_model_dropout_exact_and_reference(alg, kw):
    """Executed ledgers equal the closed forms (standard: + Z written and read RCA
    forward, read 2 RCA backward, 1 byte each; fa1, fa2: unchanged); outputs and gradients
    equal the float64 reference given the same keep mask."""
    p, seed, offset = 0.3, 12345, 6
    prob = iosim.Problem(dtype="fp32", dropout_p=p, **kw)
    plain = iosim.Problem(dtype="fp32", **kw)
    t = iosim.Tiling(8, 4)
    ex = iosim.execute(alg, prob, t, dropout_seed=seed, dropout_offset=offset)
    cf = iosim.closed_form(alg, prob, t)
    assert ex.ledger.counts() == cf.counts()
    be = execute_backward(alg, prob, t, dropout_seed=seed, dropout_offset=offset)
    bc = backward_closed_form(alg, prob, t)
    assert be.ledger.counts() == bc.counts()
    base, bbase = iosim.closed_form(alg, plain, t), backward_closed_form(alg, plain, t)
    if alg == "standard":
        RCA = iosim.closed_form.__globals__["problem_sums"](prob, t)[3] * prob.instances
        assert cf.counts()["Z"] == (RCA, RCA) and bc.counts()["Z"] == (2 * RCA, 0)
        assert cf.hbm_bytes - base.hbm_bytes == 2 * RCA          # 1 byte per element
        assert bc.hbm_bytes - bbase.hbm_bytes == 2 * RCA
    else:
        assert cf.counts() == base.counts() and bc.counts() == bbase.counts()
    q, k, v = iosim.random_inputs(prob, 0)
    Z = problem_keep_mask(prob, seed, offset)
    assert 0 < Z.mean() < 1
    common = dict(causal=prob.causal, window=prob.window, dropout_p=p, dropout_keep=Z)
    ref = iosim.reference_attention(q, k, v, **common)
    assert np.allclose(ex.O, ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(ref, iosim.reference_attention(q, k, v, causal=prob.causal,
                                                          window=prob.window), atol=1e-2)
    do = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    for got, want in zip((be.dq, be.dk, be.dv),
                         reference_attention_backward(q, k, v, do, **common)):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_traffic_cli_dropout(capsys):
    """flashsim traffic --dropout: standard's ledger gains Z (1 byte per element written
    and read, N^2 each dense); fa2's is unchanged; a bad p or --levels is refused."""
    from analysis.cli import main as cli
    base = ["traffic", "--seq-len", "64", "--head-dim", "16", "--block-rows", "16",
            "--block-cols", "16", "--json"]
    out = {}
    for alg in ("standard", "fa2"):
        for p in ("0", "0.1"):
            assert cli(base + ["--algorithm", alg, "--dropout", p]) == 0
            out[alg, p] = json.loads(capsys.readouterr().out)
    z = out["standard", "0.1"]["per_tensor"]["Z"]
    assert (z["read_elements"], z["write_elements"], z["write_bytes"]) == (64 * 64,) * 3
    assert out["standard", "0.1"]["hbm_bytes"] == out["standard", "0"]["hbm_bytes"] + 2 * 64 * 64
    assert out["fa2", "0.1"]["hbm_bytes"] == out["fa2", "0"]["hbm_bytes"]
    assert cli(base + ["--algorithm", "fa2", "--dropout", "1.0"]) != 0
    assert "dropout_p" in capsys.readouterr().err
    assert cli(["traffic", "--algorithm", "fa2", "--seq-len", "64", "--head-dim", "64",
                "--levels", "--dropout", "0.1"]) != 0
    assert "--dropout" in capsys.readouterr().err


def test_reference_dropout_gradients_by_finite_differences():
    """The reference's dropout gradients are those of its own forward (central
    differences in float64 with the mask held fixed)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 6, 4)) for _ in range(3))
    do = rng.standard_normal((1, 1, 6, 4))
    Z = rng.random((1, 1, 6, 6)) > 0.4
    f = lambda q, k, v: (iosim.reference_attention(q, k, v, dropout_p=0.4, dropout_keep=Z)
                         * do).sum()
    grads = reference_attention_backward(q, k, v, do, dropout_p=0.4, dropout_keep=Z)
    for idx, (x, g) in enumerate(zip((q, k, v), grads)):
        num = np.zeros_like(x)
        for e in np.ndindex(x.shape):
            args = [q, k, v]
            hi, lo = x.copy(), x.copy()
            hi[e] += 1e-6
            lo[e] -= 1e-6
            args[idx] = hi
            f_hi = f(*args)
            args[idx] = lo
            num[e] = (f_hi - f(*args)) / 2e-6
        assert np.allclose(num, g, atol=1e-6)


# ---------------------------------------------------------------------------------------
# Kernels (simulator)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(N=20, d=16, batch=1, heads=2, kv_heads=1),
                                dict(N=17, d=16, heads=1, causal=True)])
def test_kernels_forward_backward_agree_on_mask(kw):
    """Plain fa2 forward and backward with dropout equal the float64 reference given
    iosim's keep mask (fp32 within 1e-5 relative), and their counts equal the closed
    forms (dropout adds no traffic): the backward regenerated the forward's mask."""
    p, seed, offset = 0.25, 99, 4
    prob = iosim.Problem(dtype="fp32", dropout_p=p, **kw)
    q, k, v = iosim.random_inputs(prob, 5)
    do = np.random.default_rng(6).standard_normal(q.shape).astype(np.float32)
    opts = dict(block_rows=8, block_cols=8, causal=prob.causal, dropout_p=p,
                dropout_seed=seed, dropout_offset=offset)
    O, L, led = gpu.attention(q, k, v, return_stats=True, count_traffic=True, **opts)
    Z = problem_keep_mask(prob, seed, offset)
    ref, lse = iosim.reference_attention(q, k, v, causal=prob.causal, dropout_p=p,
                                         dropout_keep=Z, return_lse=True)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(O, ref) < 1e-5
    assert np.allclose(L, lse, rtol=1e-5, atol=1e-5)       # L: before dropout
    t = iosim.Tiling(8, 8)
    assert led.counts() == iosim.closed_form("fa2", prob, t).counts()
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, L, count_traffic=True, **opts)
    want = reference_attention_backward(q, k, v, do, causal=prob.causal, dropout_p=p,
                                        dropout_keep=Z)
    for got, w in zip((dq, dk, dv), want):
        assert rel(got, w) < 1e-5
    assert bled.counts() == backward_closed_form("fa2", prob, t).counts()
    # a different seed in the backward is a different mask: the gradients disagree
    dq2, _, _ = attention_backward(q, k, v, O, do, L, **dict(opts, dropout_seed=seed + 1))
    assert rel(dq2, want[0]) > 1e-2


def test_kernel_dropout_zero_is_bit_identical():
    """dropout_p=0 compiles and runs exactly the kernels of no dropout."""
    prob = iosim.Problem(N=18, d=16, causal=True)
    q, k, v = iosim.random_inputs(prob, 8)
    do = np.random.default_rng(9).standard_normal(q.shape).astype(np.float32)
    opts = dict(block_rows=8, block_cols=8, causal=True, kernel="plain")
    O0, L0 = gpu.attention(q, k, v, return_stats=True, **opts)
    O1, L1 = gpu.attention(q, k, v, return_stats=True, dropout_p=0.0, dropout_seed=3, **opts)
    assert np.array_equal(O0, O1) and np.array_equal(L0, L1)
    g0 = attention_backward(q, k, v, O0, do, L0, **opts)
    g1 = attention_backward(q, k, v, O0, do, L0, dropout_p=0, dropout_seed=3, **opts)
    for a, b in zip(g0, g1):
        assert np.array_equal(a, b)


def test_standard_kernels_store_and_read_mask():
    """The plain standard kernels with dropout: the softmax kernel stores iosim's keep
    mask Z (uint8) over the active tiles, PV and the backward's dV and dP kernels read it;
    outputs and gradients equal the reference given that mask, counts the closed forms
    (Z: RCA written and read forward, 2 RCA read backward)."""
    from gpu.backward.standard import standard_forward
    p, seed, offset = 0.3, 5, 1
    prob = iosim.Problem(N=16, d=16, heads=2, kv_heads=1, causal=True, dropout_p=p)
    q, k, v = iosim.random_inputs(prob, 2)
    do = np.random.default_rng(4).standard_normal(q.shape).astype(np.float32)
    opts = dict(block_rows=8, block_cols=8, causal=True, dropout_p=p, dropout_seed=seed,
                dropout_offset=offset)
    t = iosim.Tiling(8, 8)
    O, led = gpu.attention(q, k, v, algorithm="standard", kernel="plain",
                           count_traffic=True, **opts)   # ('auto': the fast kernels, below)
    assert led.counts() == iosim.closed_form("standard", prob, t).counts()
    Zref = problem_keep_mask(prob, seed, offset)
    ref = iosim.reference_attention(q, k, v, causal=True, dropout_p=p, dropout_keep=Zref)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    assert rel(O, ref) < 1e-5
    O2, P, Z = standard_forward(q, k, v, **opts)
    assert Z.dtype == np.uint8 and np.array_equal(O, O2)
    seen = iosim.element_mask(16, True)
    assert np.array_equal(Z[..., seen] != 0, Zref[..., seen])
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, (P, Z), algorithm="standard",
                                            count_traffic=True, **opts)
    assert bled.counts() == backward_closed_form("standard", prob, t).counts()
    want = reference_attention_backward(q, k, v, do, causal=True, dropout_p=p,
                                        dropout_keep=Zref)
    for got, w in zip((dq, dk, dv), want):
        assert rel(got, w) < 1e-5


@pytest.mark.parametrize("kw", [dict(N=12, N_k=20, heads=2, kv_heads=1, causal=True),
                                dict(N=20, N_k=12, heads=1, window=(5, 3)),
                                dict(N=17, heads=1, causal=True, window=(6, 0))])
def test_standard_dropout_with_N_k_and_windows(kw):
    """The standard forward and backward with dropout at N_q != N_k and with local windows
    (rows that see no key included: N=20, N_k=12, window (5, 3)): the keep mask Z is
    stored N_q x N_k over the active tiles, counts equal the closed forms, outputs and
    gradients the float64 reference given iosim's mask (fp32, 1e-5 relative)."""
    from gpu.backward.standard import standard_forward
    p, seed, offset = 0.3, 5, 1
    prob = iosim.Problem(d=16, dtype="fp32", dropout_p=p, **kw)
    q, k, v = iosim.random_inputs(prob, 2)
    do = np.random.default_rng(4).standard_normal(q.shape).astype(np.float32)
    opts = dict(block_rows=8, block_cols=8, causal=prob.causal, window=prob.window,
                dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    t = iosim.Tiling(8, 8)
    O, P, Z = standard_forward(q, k, v, **opts)
    assert P.shape == Z.shape == (1, prob.heads, prob.N, prob.N_k)
    Zref = problem_keep_mask(prob, seed, offset)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    ref = iosim.reference_attention(q, k, v, causal=prob.causal, window=prob.window,
                                    dropout_p=p, dropout_keep=Zref)
    assert rel(O, ref) < 1e-5
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, (P, Z), algorithm="standard",
                                            count_traffic=True, **opts)
    assert bled.counts() == backward_closed_form("standard", prob, t).counts()
    want = reference_attention_backward(q, k, v, do, causal=prob.causal, window=prob.window,
                                        dropout_p=p, dropout_keep=Zref)
    for got, w in zip((dq, dk, dv), want):
        assert rel(got, w) < 1e-5



# ---------------------------------------------------------------------------------------
# The fast fa2 kernels and fa1 (simulator; `gpu` marked: real sizes on a GPU)
# ---------------------------------------------------------------------------------------
#: p, problem (fp32), tiles (B_r, B_c), block mask (True: all tiles). Odd sizes; N_q > N_k
#: causal (its first N_q - N_k rows see no key); N_q < N_k with a window; a block mask
#: whose second query block sees nothing; grouped K/V heads; batch 2.
FAST_CASES = [
    (0.3, dict(N=19, N_k=13, d=16, heads=2, kv_heads=1, causal=True), (8, 16), None),
    (0.5, dict(N=13, N_k=22, d=16, batch=2, heads=1, window=(4, 2)), (8, 16), None),
    (0.1, dict(N=16, N_k=24, d=16, heads=1), (8, 16), [[True, False], [False, False]]),
]


def _rel(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max()


def _drop_case(alg, p, kw, tiles, bm, seed=2024, offset=5):
    """(problem, q, k, v, do, Z, forward reference O and L, gradient references)."""
    prob = iosim.Problem(dtype="fp32", dropout_p=p, block_mask=bm, **kw)
    q, k, v = iosim.random_inputs(prob, kw["N"] + kw["d"])
    do = np.random.default_rng(kw["N"]).standard_normal(q.shape).astype(np.float32)
    Z = problem_keep_mask(prob, seed, offset)
    assert 0 < Z.mean() < 1
    common = dict(causal=prob.causal, window=prob.window, dropout_p=p, dropout_keep=Z,
                  block_mask=None if bm is None else prob.block_mask, B_r=tiles[0],
                  B_c=tiles[1])
    ref, lse = iosim.reference_attention(q, k, v, return_lse=True, **common)
    grads = reference_attention_backward(q, k, v, do, **common)
    return prob, q, k, v, do, Z, ref, lse, grads


def _check_forward(O, L, ref, lse, led, alg, prob, tiling):
    """O, L against the float64 reference given the mask (fp32: 1e-5 relative; a row
    that sees no key: O = 0, L = -inf; L before dropout); counts == iosim's closed form
    with dropout == without it."""
    assert np.isfinite(O).all()
    assert _rel(O, ref) < 1e-5
    fin = np.isfinite(lse)
    assert np.array_equal(np.isneginf(L), ~fin)
    assert np.abs(L[fin] - lse[fin]).max() < 1e-5 * max(1.0, np.abs(lse[fin]).max())
    assert np.all(O[~fin] == 0)
    cf = iosim.closed_form(alg, prob, tiling).counts()
    assert led.counts() == cf
    assert cf == iosim.closed_form(alg, iosim.Problem(**_fields(prob)), tiling).counts()


def _fields(prob):
    return dict(N=prob.N, N_k=prob.N_k, d=prob.d, batch=prob.batch, heads=prob.heads,
                kv_heads=prob.kv_heads, dtype=prob.dtype, causal=prob.causal,
                window=prob.window, block_mask=prob.block_mask)


@pytest.mark.parametrize("p, kw, tiles, bm", FAST_CASES)
def test_fast_fa2_dropout_forward_backward(p, kw, tiles, bm):
    """The fast fa2 forward and backward (kernel='fast') with dropout: O, L and dQ, dK, dV
    equal the float64 reference given iosim's keep mask (so forward and backward agree on
    it), rows that see no key get O = 0, L = -inf, dQ = 0; the counts equal the closed
    forms, the same with and without dropout; the plain kernels give the same numbers."""
    prob, q, k, v, do, Z, ref, lse, want = _drop_case("fa2", p, kw, tiles, bm)
    seed, offset = 2024, 5
    t = iosim.Tiling(*tiles)
    opts = dict(block_rows=tiles[0], block_cols=tiles[1], causal=prob.causal,
                window=prob.window, block_mask=bm, dropout_p=p, dropout_seed=seed,
                dropout_offset=offset, threads=16)     # (16: the fast kernels' plans here)
    O, L, led = gpu.attention(q, k, v, return_stats=True, count_traffic=True, kernel="fast",
                              **opts)
    _check_forward(O, L, ref, lse, led, "fa2", prob, t)
    O0 = gpu.attention(q, k, v, kernel="fast", **dict(opts, dropout_p=0.0))
    assert _rel(O0, ref) > 1e-2                             # the mask matters
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, L, count_traffic=True,
                                            kernel="fast", **opts)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert np.isfinite(g).all() and _rel(g, w) < 1e-5, name
    fin = np.isfinite(lse)
    assert np.all(dq[~fin] == 0)
    bc = backward_closed_form("fa2", prob, t).counts()
    assert bled.counts() == bc
    assert bc == backward_closed_form("fa2", iosim.Problem(**_fields(prob)), t).counts()
    # the plain kernels (same mask): the same numbers to fp32 rounding
    Op = gpu.attention(q, k, v, kernel="plain", **opts)
    assert _rel(O, Op) < 1e-6 * max(1.0, 1.0 / np.abs(Op).max())
    gp = attention_backward(q, k, v, O, do, L, kernel="plain", **opts)
    for g, w in zip((dq, dk, dv), gp):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()


@pytest.mark.parametrize("kernel", ["plain", "fast"])
@pytest.mark.parametrize("p, kw, tiles, bm", FAST_CASES[:2])
def test_fa1_dropout_forward_backward(kernel, p, kw, tiles, bm):
    """fa1 (Algorithm 1 with dropout, the paper's Algorithm 2; forward kernel 'plain' or
    'fast') and its backward (Algorithm 4): O, L (before dropout) and the gradients equal
    the float64 reference given iosim's keep mask; counts equal iosim's closed forms,
    the same with and without dropout, and the executed schedules' ledgers."""
    prob, q, k, v, do, Z, ref, lse, want = _drop_case("fa1", p, kw, tiles, bm)
    seed, offset = 2024, 5
    t = iosim.Tiling(*tiles)
    opts = dict(block_rows=tiles[0], block_cols=tiles[1], causal=prob.causal,
                window=prob.window, dropout_p=p, dropout_seed=seed, dropout_offset=offset,
                threads=16)
    O, L, led = gpu.attention(q, k, v, algorithm="fa1", kernel=kernel, return_stats=True,
                              count_traffic=True, **opts)
    _check_forward(O, L, ref, lse, led, "fa1", prob, t)
    ex = iosim.execute("fa1", prob, t, dropout_seed=seed, dropout_offset=offset)
    assert ex.ledger.counts() == led.counts()
    if kernel == "fast":
        return
    ones = np.ones_like(L)          # (l, m) = (1, L): the same P (test_gpu_backward)
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, (ones, L), algorithm="fa1",
                                            count_traffic=True, **opts)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert np.isfinite(g).all() and _rel(g, w) < 1e-5, name
    bc = backward_closed_form("fa1", prob, t).counts()
    assert bled.counts() == bc
    assert bc == backward_closed_form("fa1", iosim.Problem(**_fields(prob)), t).counts()
    be = execute_backward("fa1", prob, t, dropout_seed=seed, dropout_offset=offset)
    assert be.ledger.counts() == bc
    # another seed in the backward: another mask, other gradients
    dq2, _, _ = attention_backward(q, k, v, O, do, (ones, L), algorithm="fa1",
                                   **dict(opts, dropout_seed=seed + 1))
    assert _rel(dq2, want[0]) > 1e-2


def test_auto_runs_fast_with_dropout(monkeypatch):
    """kernel='auto' runs the fast fa2 forward and backward with dropout where it runs
    them without (the tiling and thread count too), passing the dropout on; p = 0 runs
    the build without dropout and gives bit-identical results."""
    from gpu.backward import fa2_fast as bwd_fast
    from gpu.forward import fa2_fast as fwd_fast
    calls = {"fwd": [], "bwd": []}
    for mod, key in ((fwd_fast, "fwd"), (bwd_fast, "bwd")):
        real = mod.run
        monkeypatch.setattr(mod, "run", lambda *a, _r=real, _k=key, **kw:
                            (calls[_k].append(kw), _r(*a, **kw))[1])
    prob = iosim.Problem(N=12, d=16, heads=1, causal=True)
    q, k, v = iosim.random_inputs(prob, 1)
    do = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    opts = dict(block_rows=8, block_cols=16, causal=True, threads=16)   # (GPU: the fast
    got = {}                                                            # kernels' plans)
    for p in (0.0, 0.0, 0.25):
        kw = dict(opts, dropout_p=p, dropout_seed=9) if p or got else opts
        O, L = gpu.attention(q, k, v, return_stats=True, **kw)
        grads = attention_backward(q, k, v, O, do, L, **kw)
        f, b = calls["fwd"][-1], calls["bwd"][-1]
        assert f.get("dropout") == ((p, 9, 0) if p else None)
        assert b.get("dropout") == ((p, 9, 0) if p else None)
        got.setdefault(p, []).append((O, L) + tuple(grads))
        assert (f["B_r"], f["B_c"], f["threads"], b["threads"]) == \
            (calls["fwd"][0]["B_r"], calls["fwd"][0]["B_c"], calls["fwd"][0]["threads"],
             calls["bwd"][0]["threads"])
    for a, b in zip(*got[0.0]):             # p = 0 (with a seed) == no dropout, bitwise
        assert np.array_equal(a, b, equal_nan=True)
    assert not np.allclose(got[0.25][0][0], got[0.0][0][0])


def test_dropout_builds_are_separate_specialisations():
    """Without dropout the fast kernels (and fa1's plain one) keep their arguments and
    names (the code the no-dropout timings measured; the PTX is unchanged, checked with
    scripts/ptx_snapshot.py); the dropout builds take key0, key1, offset, thr, rp more."""
    import inspect
    from gpu.backward import fa2_fast as bwd_fast
    from gpu.forward import fa1, fa1_fast, fa2_fast as fwd_fast
    builds = [(lambda dr: fwd_fast.get_kernel(8, 16, 16, "fp32", True, False, False, 16,
                                              dropout=dr), 14),
              (lambda dr: bwd_fast.get_kernel(8, 16, 16, "fp32", True, False, False, 16,
                                              dropout=dr), 18),
              (lambda dr: fa1_fast.fa1_fast_kernel(8, 8, 16, "fp32", False, False, False,
                                                   False, 16, False, 0, dr), 15),
              (lambda dr: fa1.fa1_forward_kernel(8, 8, 16, "fp32", False, False, False, 16,
                                                 False, dr), 15)]
    for make, n in builds:
        plain, drop = make(False), make(True)
        assert len(inspect.signature(plain.py_func).parameters) == n
        assert list(inspect.signature(drop.py_func).parameters)[n:] == \
            ["key0", "key1", "offset", "thr", "rp"]
        assert "dropout" not in plain.py_func.__name__
        assert "_dropout" in drop.py_func.__name__


@pytest.mark.gpu
@pytest.mark.parametrize("alg, p, kw", [
    ("fa2", 0.1, dict(N=700, N_k=513, d=64, heads=4, kv_heads=2, causal=True)),
    ("fa2", 0.5, dict(N=513, N_k=1000, d=128, heads=2, kv_heads=1)),
    ("fa2", 0.2, dict(N=1000, d=64, heads=2, window=(100, 30))),
    ("fa1", 0.1, dict(N=700, N_k=513, d=64, heads=4, kv_heads=2, causal=True)),
    ("fa1", 0.3, dict(N=1000, d=128, heads=2))])
def test_fast_dropout_on_gpu(alg, p, kw, monkeypatch):
    """On a GPU, fp32, default tilings: kernel='auto' with dropout runs the fast forward
    (fa2_fast / fa1_fast run recorded with the dropout) and, for fa2, the fast backward;
    O, L and the gradients equal the float64 reference given iosim's mask (1e-5
    relative; the gradients norm-wise within the fast backward's 1e-5, fa1's plain
    backward within the plain kernels' 1e-4), counts
    equal the closed forms (with dropout == without); fa1's backward (its one plain
    kernel) likewise."""
    from gpu.backward import fa2_fast as bwd_fast
    from gpu.forward import fa1_fast, fa2_fast as fwd_fast
    fwd = fwd_fast if alg == "fa2" else fa1_fast
    calls = {"fwd": [], "bwd": []}
    for mod, key in ((fwd, "fwd"), (bwd_fast, "bwd")):
        real = mod.run
        monkeypatch.setattr(mod, "run", lambda *a, _r=real, _k=key, **k_:
                            (calls[_k].append(k_), _r(*a, **k_))[1])
    seed, offset = 31337, 2
    prob = iosim.Problem(dtype="fp32", dropout_p=p, **kw)
    q, k, v = iosim.random_inputs(prob, 4)
    do = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    opts = dict(algorithm=alg, causal=prob.causal, window=prob.window, dropout_p=p,
                dropout_seed=seed, dropout_offset=offset)
    O, L, led = gpu.attention(q, k, v, return_stats=True, count_traffic=True, **opts)
    assert calls["fwd"] and calls["fwd"][-1]["dropout"] == (p, seed, offset)
    Z = problem_keep_mask(prob, seed, offset)
    common = dict(causal=prob.causal, window=prob.window, dropout_p=p, dropout_keep=Z)
    ref, lse = iosim.reference_attention(q, k, v, return_lse=True, **common)
    _check_forward(O, L, ref, lse, led, alg, prob, led.tiling)
    stats = L if alg == "fa2" else (np.ones_like(L), L)
    grads, bled = attention_backward(q, k, v, O, do, stats, count_traffic=True, **opts)
    if alg == "fa2":
        assert calls["bwd"] and calls["bwd"][-1]["dropout"] == (p, seed, offset)
    bc = backward_closed_form(alg, prob, bled.tiling).counts()
    assert bled.counts() == bc
    assert bc == backward_closed_form(alg, iosim.Problem(**_fields(prob)),
                                      bled.tiling).counts()
    want = reference_attention_backward(q, k, v, do, **common)
    # fp32 bounds, norm-wise: the fast backward's 1e-5 (tests/test_gpu_backward_fast), the
    # plain backward's 1e-4 (tests/test_gpu_backward; fa1's one kernel)
    tol = 1e-5 if alg == "fa2" else 1e-4
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        err = np.linalg.norm(np.asarray(g, np.float64) - w) / np.linalg.norm(w)
        assert np.isfinite(g).all() and err <= tol, (name, err)


def test_without_dropout_wraps_the_shared_body():
    """gpu._philox.without_dropout: the kernel of a build without dropout takes the body's
    arguments less the five dropout ones; a body without them last is refused."""
    import inspect

    from gpu import _philox

    def body(x, y, key0, key1, offset, thr, rp):
        pass

    assert list(inspect.signature(_philox.without_dropout(body)).parameters) == ["x", "y"]
    # the wrapper stays in body's module: the kernel's mangled name keeps the gpu package's
    # namespace, which analysis.hwmeasure's pass timing looks for
    assert _philox.without_dropout(body).__module__ == body.__module__ == __name__

    def wrong(x, key0, key1, offset, rp, thr):
        pass

    with pytest.raises(ValueError, match="last arguments"):
        _philox.without_dropout(wrong)


# ---------------------------------------------------------------------------------------
# Standard attention's fast (fp32 math) and tensor-core kernels with dropout: the unfused
# graph's mask Z stored in HBM by the softmax kernel, read by PV (and by the backward's
# dV and dP kernels); the tensor-core kernels' simulator test with emulated tile products
# is tests/test_gpu_standard_tc.py::test_dropout_with_emulated_tile_products
# ---------------------------------------------------------------------------------------
#: p, problem (fp32), tiles, block mask: odd sizes; N_q > N_k causal (rows that see no
#: key) with grouped K/V heads; N_q < N_k with a window, batch 2; a block mask
STD_FAST_CASES = [
    (0.3, dict(N=19, N_k=13, d=16, heads=2, kv_heads=1, causal=True), (8, 16), None),
    (0.5, dict(N=13, N_k=22, d=16, batch=2, heads=1, window=(4, 2)), (8, 16),
     [[True, False], [True, True]]),
]


@pytest.mark.parametrize("p, kw, tiles, bm", STD_FAST_CASES)
def test_standard_fast_dropout_forward_backward(p, kw, tiles, bm):
    """The fast standard forward (kernel='fast') with dropout: O equals the float64
    reference given iosim's keep mask and the plain kernels' O (same seed and offset);
    the Z it stores (standard_forward(kernel='fast')) is the plain kernels' bit for bit
    over the active tiles, and the standard backward given (P, Z) reproduces the
    reference gradients; counts equal iosim's closed forms with dropout (+ Z written and
    read RCA forward) and iosim's executed schedule."""
    from gpu.backward.standard import standard_forward
    prob, q, k, v, do, Zref, ref, lse, want = _drop_case("standard", p, kw, tiles, bm)
    seed, offset = 2024, 5
    t = iosim.Tiling(*tiles)
    opts = dict(algorithm="standard", block_rows=tiles[0], block_cols=tiles[1],
                causal=prob.causal, window=prob.window, block_mask=bm, dropout_p=p,
                dropout_seed=seed, dropout_offset=offset, threads=16)
    O, led = gpu.attention(q, k, v, kernel="fast", count_traffic=True, **opts)
    assert np.isfinite(O).all() and _rel(O, ref) < 1e-5
    fin = np.isfinite(lse)
    assert np.all(O[~fin] == 0)                       # rows that see no key
    cf = iosim.closed_form("standard", prob, t).counts()
    assert led.counts() == cf
    assert cf["Z"] != (0, 0)
    ex = iosim.execute("standard", prob, t, dropout_seed=seed, dropout_offset=offset)
    assert ex.ledger.counts() == cf
    Op = gpu.attention(q, k, v, kernel="plain", **opts)      # the plain kernels' mask
    assert np.abs(O - Op).max() <= 1e-6 * max(1.0, np.abs(Op).max())
    fo = {x: opts[x] for x in ("block_rows", "block_cols", "causal", "window", "block_mask",
                               "dropout_p", "dropout_seed", "dropout_offset", "threads")}
    Of, P, Z = standard_forward(q, k, v, kernel="fast", **fo)
    # iosim's bits, which the plain kernels store (test_standard_kernels_store_and_read_mask)
    act = np.kron(iosim.active_tiles(prob, t), np.ones(tiles, bool))[:prob.N, :prob.N_k]
    assert np.array_equal(Z[..., act], Zref[..., act].astype(np.uint8))
    assert np.array_equal(Of, O)
    bo = {x: fo[x] for x in fo if x != "threads"}
    (dq, dk, dv), bled = attention_backward(q, k, v, O, do, (P, Z), algorithm="standard",
                                            count_traffic=True, **bo)
    for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert np.isfinite(g).all() and _rel(g, w) < 1e-5, name
    assert bled.counts() == backward_closed_form("standard", prob, t).counts()


def test_auto_runs_standard_fast_with_dropout(monkeypatch):
    """kernel='auto' for standard fp32 runs the fast kernels with dropout where it runs
    them without (the same tiling and threads), passing the dropout and the Z buffer on;
    p = 0 (with a seed) runs the build without dropout, bit-identical to no dropout."""
    from gpu.forward import standard_fast
    calls = []
    real = standard_fast.run
    monkeypatch.setattr(standard_fast, "run",
                        lambda *a, **kw: (calls.append(kw), real(*a, **kw))[1])
    prob = iosim.Problem(N=12, d=16, heads=1, causal=True)
    q, k, v = iosim.random_inputs(prob, 1)
    opts = dict(algorithm="standard", block_rows=8, block_cols=16, causal=True, threads=16)
    O_none = gpu.attention(q, k, v, **opts)
    O_zero = gpu.attention(q, k, v, dropout_p=0.0, dropout_seed=9, **opts)
    O_drop = gpu.attention(q, k, v, dropout_p=0.25, dropout_seed=9, **opts)
    assert len(calls) == 3
    assert calls[0].get("dropout") is None and calls[1].get("dropout") is None
    assert calls[2]["dropout"] == (0.25, 9, 0) and calls[2]["z3"] is not None
    assert [(c["B_r"], c["B_c"], c["threads"]) for c in calls] == [(8, 16, 16)] * 3
    assert np.array_equal(O_none, O_zero)
    assert not np.allclose(O_drop, O_none)


def test_standard_dropout_builds_are_separate_specialisations():
    """The fast PV kernel and the tensor-core softmax, PV, dP and dV kernels without
    dropout keep their arguments and names (their PTX is unchanged: scripts/ptx_snapshot.py
    before and after); the dropout builds take the keep mask zm (and rp, or the Philox
    key, offset and threshold) more, and 'dropout' in their names."""
    import inspect
    from gpu.backward import standard_tc as btc
    from gpu.forward import standard_fast, standard_tc as ftc
    builds = [(lambda dr: standard_fast.pv_kernel(16, 16, 16, "fp32", True, False, False,
                                                 False, 16, 0, 0, dr), 11, ["zm", "rp"]),
              (lambda dr: ftc.pv_kernel(16, 16, 16, True, False, True, False, dr), 9,
               ["zm", "rp"]),
              (lambda dr: ftc.softmax_kernel(16, 16, True, False, True, False, 32, dr), 5,
               ["zm", "key0", "key1", "offset", "thr"]),
              (lambda dr: btc.dp_kernel(16, 16, 16, True, False, dr), 9, ["zm", "rp"]),
              (lambda dr: btc.dv_kernel(16, 16, 16, True, False, True, False, dr), 7,
               ["zm", "rp"])]
    for make, n, extra in builds:
        plain, drop = make(False), make(True)
        assert len(inspect.signature(plain.py_func).parameters) == n
        assert list(inspect.signature(drop.py_func).parameters)[n:] == extra
        assert plain.py_func.__module__ == drop.py_func.__module__
        assert plain.py_func.__module__.startswith("gpu.")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, dt, p, kw", [   # (two cases: each compiles ~11 kernels;
    # windows, block masks and odd tiles run in the simulator tests above)
    ("fast", "fp32", 0.1, dict(N=700, N_k=513, d=64, heads=4, kv_heads=2, causal=True)),
    ("tc", "fp16", 0.3, dict(N=1000, d=64, heads=4, kv_heads=2, causal=True))])
def test_standard_dropout_on_gpu(kernel, dt, p, kw, monkeypatch):
    """On a GPU, default tilings: kernel='auto' for standard with dropout runs the kernel
    it runs without (fp32: standard_fast, fp16: standard_tc; their run recorded with the
    dropout); O equals the float64 reference given iosim's mask (fp32: 1e-5 relative;
    fp16: 2e-2); the Z that standard_forward(kernel=...) stores is iosim's (= the plain
    kernels') over the active tiles, its O gpu.attention's; counts equal the closed forms;
    the backward (fp16: the tensor-core one, 'auto') given (P, Z) gives the reference
    gradients (norm-wise: fp32 1e-4, fp16 3e-2)."""
    from gpu.backward import standard_tc as btc
    from gpu.backward.standard import standard_forward
    from gpu.forward import standard_fast, standard_tc as ftc
    mod = standard_fast if kernel == "fast" else ftc
    calls = []
    for m, key in ((mod, "fwd"), (btc, "bwd")):
        real = m.run
        monkeypatch.setattr(m, "run", lambda *a, _r=real, _k=key, **k_:
                            (calls.append((_k, k_)), _r(*a, **k_))[1])
    seed, offset = 31337, 2
    prob = iosim.Problem(dtype=dt, dropout_p=p, **kw)
    q, k, v = iosim.random_inputs(prob, 4)
    do = np.random.default_rng(5).standard_normal(q.shape).astype(q.dtype)
    opts = dict(causal=prob.causal, window=prob.window, dropout_p=p, dropout_seed=seed,
                dropout_offset=offset)
    O, led = gpu.attention(q, k, v, algorithm="standard", count_traffic=True, **opts)
    assert calls and calls[-1][0] == "fwd" and calls[-1][1]["dropout"] == (p, seed, offset)
    t = led.tiling
    assert led.counts() == iosim.closed_form("standard", prob, t).counts()
    Zref = problem_keep_mask(prob, seed, offset)
    common = dict(causal=prob.causal, window=prob.window, dropout_p=p, dropout_keep=Zref)
    ref = iosim.reference_attention(q, k, v, **common)
    O64 = np.asarray(O, np.float64)
    tol = 1e-5 if dt == "fp32" else 2e-2
    assert np.isfinite(O64).all() and _rel(O64, ref) < tol
    fo = dict(opts, block_rows=t.B_r, block_cols=t.B_c)
    Of, P, Z = standard_forward(q, k, v, kernel=kernel, **fo)
    assert np.abs(np.asarray(Of, np.float64) - O64).max() <= \
        (1e-6 if dt == "fp32" else 1e-3) * max(1.0, np.abs(ref).max())
    act = np.kron(iosim.active_tiles(prob, t), np.ones((t.B_r, t.B_c), bool))
    act = act[:prob.N, :prob.N_k]
    # iosim's bits: those the plain kernels store (test_standard_kernels_store_and_read_mask)
    assert np.array_equal(Z[..., act], Zref[..., act].astype(np.uint8))
    grads, bled = attention_backward(q, k, v, O, do, (P, Z), algorithm="standard",
                                     count_traffic=True, **fo)
    if kernel == "tc":
        assert calls[-1][0] == "bwd" and calls[-1][1]["dropout"] == (p, seed, offset)
    assert bled.counts() == backward_closed_form("standard", prob, t).counts()
    want = reference_attention_backward(q, k, v, do, **common)
    gtol = 1e-4 if dt == "fp32" else 3e-2
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        g = np.asarray(g, np.float64)
        err = np.linalg.norm(g - w) / np.linalg.norm(w)
        assert np.isfinite(g).all() and err <= gtol, (name, err)


def _factory(dropout):
    scale = 3

    def kernel(x, out):
        out[0] = x * scale
        if dropout:
            out[0] = out[0] * rp          # noqa: F821 (the dropout build's argument)
    if dropout:
        kernel = _philox.with_args(kernel, ("zm", "rp"))
    return kernel


def test_with_args_appends_the_dropout_arguments():
    """gpu._philox.with_args: the dropout build is the kernel's own code with the extra
    parameters, the same closure values, module and qualified name (its mangled name keeps
    the gpu package's namespace); the build without dropout is the function itself."""
    import inspect
    plain, drop = _factory(False), _factory(True)
    assert list(inspect.signature(plain).parameters) == ["x", "out"]
    assert list(inspect.signature(drop).parameters) == ["x", "out", "zm", "rp"]
    assert drop.__module__ == plain.__module__ == __name__
    assert drop.__qualname__ == plain.__qualname__
    out = [0]
    plain(2, out)
    assert out == [6]
    drop(2, out, None, 0.5)
    assert out == [3.0]
