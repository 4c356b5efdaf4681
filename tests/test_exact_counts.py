"""Closed forms are exact at any size (issue 19, item 2): no int64 overflow.

The independent formula below sums over query blocks directly with Python integers
(tilings with few query blocks, so it is cheap at N >= 10^10): query block i holds
rows_i rows, its last row is last_i and it sees a_i key blocks (T_c dense, last_i // B_c
+ 1 causal), whose columns add up to min(a_i B_c, N).
"""
import json

import numpy as np
import pytest

import iosim
from analysis.cli import main as cli
from iosim.backward import backward_closed_form, backward_closed_form_arrays
from iosim.closed_form import floor_sum, tile_sums

BIG_N = [10**10 + 7, 4 * 10**9, 3 * 10**12 + 1]


def sums_by_blocks(N, B_r, B_c, causal):
    T_r, T_c = -(-N // B_r), -(-N // B_c)
    nA = RA = CA = RCA = 0
    for i in range(T_r):
        rows = min(B_r, N - i * B_r)
        last = i * B_r + rows - 1
        a = last // B_c + 1 if causal else T_c
        cols = min(a * B_c, N)
        nA, RA, CA, RCA = nA + a, RA + rows * a, CA + cols, RCA + rows * cols
    return nA, RA, CA, RCA


def forward_counts(alg, N, d, nA, RA, CA, RCA):
    """The table of iosim/closed_form.py's docstring, written out again."""
    if alg == "standard":
        return ({"Q": RA * d, "K": CA * d, "V": CA * d, "S": RCA, "P": RCA},
                {"S": RCA, "P": RCA, "O": N * d})
    if alg == "fa1":
        return ({"Q": RA * d, "K": N * d, "V": N * d, "O": RA * d, "l": RA, "m": RA},
                {"O": (N + RA) * d, "l": N + RA, "m": N + RA})
    return {"Q": N * d, "K": CA * d, "V": CA * d}, {"O": N * d, "L": N}


def backward_counts(alg, N, d, nA, RA, CA, RCA):
    """The table of iosim/backward.py's docstring, written out again."""
    Nd = N * d
    if alg == "standard":
        return ({"P": 2 * RCA, "dP": RCA, "dS": 2 * RCA, "dO": 2 * RA * d, "V": CA * d,
                 "K": CA * d, "Q": RA * d}, {"dP": RCA, "dS": RCA, "dV": Nd, "dQ": Nd, "dK": Nd})
    if alg == "fa1":
        return ({"K": Nd, "V": Nd, "Q": RA * d, "O": RA * d, "dO": RA * d, "dQ": RA * d,
                 "l": RA, "m": RA}, {"dQ": Nd + RA * d, "dK": 2 * Nd, "dV": 2 * Nd})
    return ({"dO": Nd + RA * d, "O": Nd, "K": Nd, "V": Nd, "Q": RA * d, "L": RA, "D": RA,
             "dQacc": RA * d + Nd}, {"D": N, "dQacc": Nd + RA * d, "dK": Nd, "dV": Nd, "dQ": Nd})


def _tilings(N):
    # few query blocks (the direct sum stays cheap), ragged and exact divisions
    return [(N // 3 + 1, 4096), (N // 2, 192), (N, 64 * 1000 + 3)]


@pytest.mark.parametrize("N", BIG_N)
@pytest.mark.parametrize("causal", [False, True])
def test_tile_sums_exact_at_huge_N(N, causal):
    for B_r, B_c in _tilings(N):
        got = tuple(int(x) for x in tile_sums(N, B_r, B_c, causal))
        assert got == sums_by_blocks(N, B_r, B_c, causal), (N, B_r, B_c)


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_exact_at_huge_N(alg, causal):
    N, d, batch, heads = 10**10 + 7, 128, 64, 16
    for B_r, B_c in _tilings(N):
        p = iosim.Problem(N=N, d=d, batch=batch, heads=heads, dtype="fp16", causal=causal)
        led = iosim.closed_form(alg, p, iosim.Tiling(B_r, B_c))
        reads, writes = forward_counts(alg, N, d, *sums_by_blocks(N, B_r, B_c, causal))
        k = batch * heads
        assert led.reads == {t: c * k for t, c in reads.items()}
        assert led.writes == {t: c * k for t, c in writes.items()}
        # the vectorised form, with a small configuration beside the huge one
        arr = iosim.closed_form_arrays(alg, [N, 1024], d, [B_r, 64], [B_c, 64], causal=causal,
                                       itemsize=2, instances=k)
        assert int(arr["hbm_bytes"][0]) == led.hbm_bytes > 0
        small = iosim.closed_form(alg, iosim.Problem(N=1024, d=d, batch=batch, heads=heads,
                                                     dtype="fp16", causal=causal),
                                  iosim.Tiling(64, 64))
        assert int(arr["hbm_bytes"][1]) == small.hbm_bytes


@pytest.mark.parametrize("alg", ["standard", "fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_closed_form_exact_at_huge_N(alg, causal):
    N, d, batch, heads, kv = 10**10 + 7, 64, 8, 16, 4
    B_r, B_c = N // 3 + 1, 4096
    reads, writes = backward_counts(alg, N, d, *sums_by_blocks(N, B_r, B_c, causal))
    k = batch * heads
    reads = {t: c * k for t, c in reads.items()}
    writes = {t: c * k for t, c in writes.items()}
    for t in ("dK", "dV"):                      # the grouped-head reduction pass
        reads[t] = reads.get(t, 0) + batch * heads * N * d
        writes[t] = writes.get(t, 0) + batch * kv * N * d
    p = iosim.Problem(N=N, d=d, batch=batch, heads=heads, kv_heads=kv, dtype="fp16",
                      causal=causal)
    led = backward_closed_form(alg, p, iosim.Tiling(B_r, B_c))
    assert led.reads == reads and led.writes == writes
    arr = backward_closed_form_arrays(alg, N, d, B_r, B_c, causal=causal, itemsize=2,
                                      batch=batch, heads=heads, kv_heads=kv)
    assert {t: int(c) for t, c in arr["reads"].items()} == reads
    assert int(arr["hbm_bytes"]) == led.hbm_bytes > 0


def test_floor_sum_exact_with_huge_terms():
    cases = [(5, 7, 10**15, 10**18), (10**6, 3, 10**13, 10**13 - 1), (12, 10**19, 3, 5)]
    for n, m, a, b in cases:
        assert int(floor_sum(n, m, a, b)) == sum((a * i + b) // m for i in range(n)), (n, m, a, b)
    # small arguments keep the fast int64 path
    assert floor_sum(np.arange(10), 3, 2, 1).dtype == np.int64


def test_counts_from_sums_exact_for_int64_sums():
    """Sums handed over as int64 arrays whose counts overflow int64 still give exact counts."""
    from iosim.backward import backward_counts_from_sums
    from iosim.closed_form import counts_from_sums
    N = 4 * 10**9
    sums = [np.array([x], dtype=np.int64) for x in (10**12, 2**60, 2**60, N * N // 2)]
    reads, writes = counts_from_sums("standard", np.array([N]), np.array([64]), *sums)
    assert int(reads["S"][0]) == N * N // 2 and int(reads["Q"][0]) == 2**60 * 64
    reads, _ = backward_counts_from_sums("standard", np.array([N]), 64, *sums)
    assert int(reads["P"][0]) == N * N


def test_small_configurations_stay_int64():
    rng = np.random.default_rng(0)
    N = rng.integers(128, 16385, 1000)
    out = iosim.closed_form_arrays("standard", N, 64, 64, 128, causal=True, instances=1024)
    assert out["hbm_bytes"].dtype == np.int64
    out = backward_closed_form_arrays("fa2", N, 64, 64, 128, causal=True, batch=64, heads=16)
    assert out["hbm_bytes"].dtype == np.int64


def test_traffic_cli_prints_exact_counts_at_4e9(capsys):
    """The issue's example: negative counts before."""
    N = 4_000_000_000
    rc = cli(["traffic", "--algorithm", "standard", "--seq-len", str(N), "--head-dim", "64",
              "--sram-bytes", "98304", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    B_r, B_c = out["block_rows"], out["block_cols"]
    T_r, T_c = -(-N // B_r), -(-N // B_c)      # dense: every query row sees every key
    reads, writes = forward_counts("standard", N, 64, T_r * T_c, N * T_c, N * T_r, N * N)
    assert out["per_tensor"]["S"]["read_elements"] == N * N == reads["S"]
    assert out["hbm_write_bytes"] == 2 * sum(writes.values()) > 0
    assert out["hbm_read_bytes"] == 2 * sum(reads.values()) > 0
