"""gpu.forward.fa2_fast (register-tiled FA2 forward) in Numba's CUDA simulator (or on a GPU).

Checks: fp32 output and L against the float64 dense reference (rel err <= 1e-5), ragged
N, causal, grouped K/V, a block mask with rows that see no key, huge logits, every
output element written (NaN poison), and the instrumented kernel's own counts equal to
iosim.closed_form('fa2', ...) exactly. Simulator cases are tiny (N <= 40, d <= 32).
"""
import numpy as np
import pytest

import iosim
from iosim import Problem, Tiling

cuda = pytest.importorskip("numba.cuda")

from gpu.forward import fa2_fast  # noqa: E402
from gpu._launch import counters_to_ledger, filled, new_counters  # noqa: E402


def _run(q, k, v, *, B_r, B_c, threads, TC=None, causal=False, block_mask=None,
         count=False, scale=None, stage=0):
    B, H, N, d = q.shape
    Hk = k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    q3 = cuda.to_device(np.ascontiguousarray(q.reshape(B * H, N, d)))
    k3 = cuda.to_device(np.ascontiguousarray(k.reshape(B * Hk, N, d)))
    v3 = cuda.to_device(np.ascontiguousarray(v.reshape(B * Hk, N, d)))
    o3 = filled((B * H, N, d), q.dtype, np.nan)
    L2 = filled((B * H, N), np.float32, np.nan)
    mask = None
    if block_mask is not None:
        mask = cuda.to_device(np.ascontiguousarray(block_mask, dtype=np.uint8))
    counters = new_counters(count)
    fa2_fast.run(q3, k3, v3, o3, L2, scale, N, H, H // Hk, mask, counters, B_r=B_r,
                 B_c=B_c, dt="fp32", causal=causal, count=count, threads=threads, TC=TC,
                 stage=stage)
    O = o3.copy_to_host().reshape(B, H, N, d)
    L = L2.copy_to_host().reshape(B, H, N)
    problem = Problem(N=N, d=d, batch=B, heads=H, kv_heads=Hk, causal=causal,
                      block_mask=block_mask)
    tiling = Tiling(B_r, B_c)
    led = counters_to_ledger(counters, "fa2", problem, tiling) if count else None
    return O, L, led, problem, tiling


def _inputs(B, H, Hk, N, d, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    q = (scale * rng.standard_normal((B, H, N, d))).astype(np.float32)
    k = (scale * rng.standard_normal((B, Hk, N, d))).astype(np.float32)
    v = rng.standard_normal((B, Hk, N, d)).astype(np.float32)
    return q, k, v


def _check(O, L, q, k, v, *, causal=False, block_mask=None, B_r=None, B_c=None, scale=None):
    ref, lse = iosim.reference_attention(q, k, v, causal=causal, block_mask=block_mask,
                                         B_r=B_r, B_c=B_c, scale=scale, return_lse=True)
    assert np.isfinite(O).all(), "output has NaN (unwritten) or inf elements"
    err = np.abs(O - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= 1e-5, err
    fin = np.isfinite(lse)
    assert (np.isneginf(L) == ~fin).all()
    lerr = np.abs(L[fin] - lse[fin]).max() / max(np.abs(lse[fin]).max(), 1.0) if fin.any() else 0
    assert lerr <= 1e-5, lerr


# (B_r, B_c, d, threads, TC): RM x RN register tiles 4x1, 4x2, 2x4, 1x1
CONFIGS = [(8, 8, 32, 16, 8), (16, 8, 32, 16, 4), (8, 16, 16, 16, 4), (4, 4, 16, 16, 4)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "Br%d_Bc%d_d%d_t%d_tc%d" % c)
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_matches_reference_and_counts(cfg, causal):
    B_r, B_c, d, threads, TC = cfg
    N = 21 if B_r == 4 else 37                  # ragged: neither block divides N
    q, k, v = _inputs(1, 2, 1, N, d, seed=B_r + d)   # grouped K/V: 2 query heads, 1 K/V head
    O, L, led, problem, tiling = _run(q, k, v, B_r=B_r, B_c=B_c, threads=threads, TC=TC,
                                      causal=causal, count=True)
    _check(O, L, q, k, v, causal=causal)
    assert led.counts() == iosim.closed_form("fa2", problem, tiling).counts()
    ex = iosim.execute("fa2", problem, tiling, q, k, v)
    assert led.counts() == ex.ledger.counts()


def test_block_mask_rows_without_keys_and_batches():
    B_r, B_c, d, threads, TC = 8, 8, 16, 16, 4
    N = 24
    q, k, v = _inputs(2, 2, 2, N, d, seed=3)
    mask = np.array([[True, False, True], [False, False, False], [False, True, True]])
    O, L, led, problem, tiling = _run(q, k, v, B_r=B_r, B_c=B_c, threads=threads, TC=TC,
                                      block_mask=mask, count=True)
    _check(O, L, q, k, v, block_mask=mask, B_r=B_r, B_c=B_c)
    assert (O[:, :, 8:16] == 0).all() and np.isneginf(L[:, :, 8:16]).all()
    assert led.counts() == iosim.closed_form("fa2", problem, tiling).counts()


@pytest.mark.parametrize("stage", [1, 2])
def test_staged_loads(stage):
    """stage 1 (next K/V tile loaded into registers during this tile's arithmetic) and
    stage 2 (into a second shared buffer): same outputs and exact counts, with tiles
    skipped by the causal limit and by a block mask between active ones."""
    B_r, B_c, d, threads, TC = 8, 8, 16, 16, 4
    N = 29
    q, k, v = _inputs(1, 2, 1, N, d, seed=11)
    mask = np.array([[True, False, True, True], [False, True, False, True],
                     [True, True, True, False], [False, False, True, True]])
    for causal, bm in ((True, None), (False, mask), (True, mask)):
        O, L, led, problem, tiling = _run(q, k, v, B_r=B_r, B_c=B_c, threads=threads, TC=TC,
                                          causal=causal, block_mask=bm, count=True,
                                          stage=stage)
        _check(O, L, q, k, v, causal=causal, block_mask=bm, B_r=B_r, B_c=B_c)
        assert led.counts() == iosim.closed_form("fa2", problem, tiling).counts()
    lay1 = fa2_fast.layout(64, 32, 64, 8, 8, True, stage=1)
    lay2 = fa2_fast.layout(64, 32, 64, 8, 8, True, stage=2)
    assert lay2["bytes"] - lay1["bytes"] == 4 * 32 * (68 + 64)   # one more K and V buffer


def test_huge_logits_and_single_row():
    q, k, v = _inputs(1, 1, 1, 13, 16, seed=5, scale=30.0)   # logits ~ 1e3..1e4
    O, L, _, _, _ = _run(q, k, v, B_r=8, B_c=8, threads=16, TC=4, causal=True)
    _check(O, L, q, k, v, causal=True)
    q, k, v = _inputs(1, 1, 1, 1, 16, seed=6)
    O, L, _, _, _ = _run(q, k, v, B_r=8, B_c=8, threads=16, TC=4)
    _check(O, L, q, k, v)


def test_uncounted_build_matches_and_scale():
    q, k, v = _inputs(1, 1, 1, 19, 32, seed=7)
    O, L, led, _, _ = _run(q, k, v, B_r=16, B_c=8, threads=16, TC=4, scale=0.3)
    assert led is None
    _check(O, L, q, k, v, scale=0.3)


def test_plan_and_layout():
    assert fa2_fast.plan(64, 64, 64, 256) == (16, 16, 4, 4, 4)
    assert fa2_fast.plan(128, 128, 64, 256) == (16, 16, 8, 8, 4)
    for d in (16, 32, 48, 64, 96, 128):
        assert fa2_fast.plan(32, 32, d, 128) is not None      # the api's last fallback
    for d in (32, 64, 96, 128):
        assert fa2_fast.plan(64, 64, d, 256) is not None
    # d = 80: no TC gives 4-column groups (d % 4 TC == 0) within the register limits
    assert fa2_fast.plan(64, 64, 80, 256) is None
    assert fa2_fast.plan(64, 64, 64, 7) is None
    assert fa2_fast.plan(64, 30, 64, 64, TC=2) is None        # B_c not a multiple of 4
    lay = fa2_fast.layout(64, 64, 64, 16, 16)
    # strides: multiples of 4 floats (16-byte rows); Qs, Ks = 4 (mod 32); Ps = TC (mod 32)
    assert (lay["QS"], lay["KS"], lay["PS"]) == (68, 68, 80)
    assert all(lay[key] % 4 == 0 for key in ("QO", "KO", "VO", "PO", "RO"))
    # Q 64x68 + K 64x68 + V 64x64 + P 64x80 + RED 64x16 floats
    assert lay["bytes"] == 4 * (64 * 68 * 2 + 64 * 64 + 64 * 80 + 64 * 16) == 75776
    assert fa2_fast.smem_bytes(64, 64, 64, 256) == 75776
    assert fa2_fast.supports(64, 64, 64, 256, smem_limit=232448)
    assert not fa2_fast.supports(64, 64, 64, 256, smem_limit=48 * 1024)
