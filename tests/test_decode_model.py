"""iosim.decode: executed decode schedules against closed forms, outputs against dense
float64, the split-KV combine, the num_splits rule and bad input."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from iosim import (KV_READS, ConfigError, DecodeProblem, choose_num_splits, combine_partials,
                   decode_closed_form, execute_decode, pages_touched, random_decode_inputs,
                   reference_decode, split_bounds)
from iosim.decode import check_num_splits, decode_mask


def rel_err(x, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref) / np.linalg.norm(ref)


def valid_splits(N_kv, top=8):
    out = []
    for S in range(1, top + 1):
        try:
            out.append(check_num_splits(N_kv, S))
        except ConfigError:
            pass
    return out


@st.composite
def decode_cases(draw):
    N_kv = draw(st.integers(1, 160))
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([g for g in (1, 2, 4) if heads % g == 0]))
    page = draw(st.one_of(st.none(), st.integers(1, 40)))
    p = DecodeProblem(N_kv=N_kv, d=draw(st.sampled_from([1, 3, 8, 16])),
                      batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv,
                      N_q=draw(st.integers(1, min(4, N_kv))),
                      dtype=draw(st.sampled_from(["fp32", "fp16"])), page_size=page)
    schedule = draw(st.sampled_from(["fa2_decode", "split_kv"]))
    S = 1 if schedule == "fa2_decode" else draw(st.sampled_from(valid_splits(N_kv)))
    return p, schedule, S, draw(st.sampled_from(KV_READS)), draw(st.integers(1, 48))


@settings(max_examples=150, deadline=None)
@given(decode_cases())
def test_closed_form_equals_executed(case):
    p, schedule, S, kv_reads, block_kv = case
    ex = execute_decode(schedule, p, num_splits=S, kv_reads=kv_reads, block_kv=block_kv)
    cf = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    assert ex.ledger.counts() == cf.counts()
    assert ex.ledger.hbm_bytes == cf.hbm_bytes
    assert ("block_table" in cf.reads) == p.paged


@settings(max_examples=60, deadline=None)
@given(decode_cases())
def test_executed_output_matches_float64(case):
    p, schedule, S, kv_reads, block_kv = case
    q, k, v = random_decode_inputs(p, seed=3)
    ex = execute_decode(schedule, p, q, k, v, num_splits=S, kv_reads=kv_reads,
                        block_kv=block_kv, page_seed=7)
    ref, lse = reference_decode(q, k, v, return_lse=True)
    assert ex.O.dtype == p.np_dtype and ex.O.shape == q.shape
    assert not np.isnan(ex.O).any()
    # fp32: float32 arithmetic (partials and combine in float32 too); fp16: O rounded once
    assert rel_err(ex.O, ref) <= (1e-5 if p.dtype == "fp32" else 4e-3)
    np.testing.assert_allclose(ex.stats["L"], lse, rtol=0, atol=1e-4 * (1 + np.abs(lse).max()))


@pytest.mark.parametrize("N_kv, N_q, S", [(1, 1, 1), (37, 3, 4), (100, 4, 7), (257, 16, 8), (64, 2, 64)])
def test_split_combine_is_exact_in_float64(N_kv, N_q, S):
    # float64 partials of each chunk (a row that sees nothing of a chunk: O = 0, L = -inf)
    # combined in float64 give dense float64 attention to float64 rounding
    rng = np.random.default_rng(N_kv)
    q = rng.standard_normal((2, 3, N_q, 8)) * 2
    k = rng.standard_normal((2, 3, N_kv, 8)) * 2
    v = rng.standard_normal((2, 3, N_kv, 8))
    ref, lse = reference_decode(q, k, v, return_lse=True)
    allowed, scale = decode_mask(N_q, N_kv), 1 / np.sqrt(8)
    Op, Lp = [], []
    for a, e in split_bounds(N_kv, S):
        s = np.where(allowed[:, a:e], scale * q @ np.swapaxes(k[..., a:e, :], -1, -2), -np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):
            m = s.max(axis=-1, keepdims=True)
            w = np.exp(s - np.where(np.isneginf(m), 0, m))
            l = w.sum(axis=-1, keepdims=True)
            Op.append(np.where(l > 0, (w @ v[..., a:e, :]) / np.where(l > 0, l, 1), 0.0))
            Lp.append(np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l > 0, l, 1)[..., 0]), -np.inf))
    O, L = combine_partials(np.stack(Op), np.stack(Lp))
    assert O.dtype == np.float64
    np.testing.assert_allclose(O, ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(L, lse, rtol=1e-13)


def test_combine_weights_empty_splits_zero():
    Op = np.array([[[1.0, 2.0]], [[5.0, 7.0]]])          # (S=2, N_q=1, d=2)
    O, L = combine_partials(Op, np.array([[0.0], [-np.inf]]))
    assert np.array_equal(O, [[1.0, 2.0]]) and L[0] == 0.0
    O, L = combine_partials(Op, np.array([[np.log(1.0)], [np.log(3.0)]]))
    np.testing.assert_allclose(O, [[4.0, 5.75]])
    np.testing.assert_allclose(L, [np.log(4.0)])


def test_pages_touched_brute_force():
    for N in (1, 5, 17, 64, 100, 129, 1000):
        for S in valid_splits(N, 40):
            for P in (1, 2, 3, 7, 16, 64, 128, 2000):
                want = sum((e - 1) // P - a // P + 1 for a, e in split_bounds(N, S))
                assert pages_touched(N, S, P) == want, (N, S, P)
    assert pages_touched(1000, 1, 64) == 16


def test_paged_numerics_go_through_the_table():
    # block_kv = P and one split: contiguous and paged read the same pieces in the same
    # order, so the outputs agree bit for bit, whatever the permutation of the pages
    p = DecodeProblem(N_kv=150, d=8, batch=3, heads=4, kv_heads=2, N_q=2, dtype="fp32", page_size=32)
    q, k, v = random_decode_inputs(p, seed=1)
    flat = execute_decode("fa2_decode", DecodeProblem(**{**p.__dict__, "page_size": None}),
                          q, k, v, block_kv=32)
    for page_seed in (0, 1):
        ex = execute_decode("fa2_decode", p, q, k, v, block_kv=32, page_seed=page_seed)
        table = ex.stats["block_table"]
        assert table.dtype == np.int32 and table.shape == (3, 5)
        assert sorted(table.ravel()) == list(range(15)) and not np.array_equal(table.ravel(), np.arange(15))
        assert np.array_equal(ex.O, flat.O)


def test_textbook_counts():
    # GQA 32 query heads on 8 K/V heads, N_kv = 4096, d = 128, fp16, 4 splits, pages of 256
    p = DecodeProblem(N_kv=4096, d=128, batch=2, heads=32, kv_heads=8, N_q=1, page_size=256)
    a = decode_closed_form("split_kv", p, num_splits=4, kv_reads="per_query_head")
    b = decode_closed_form("split_kv", p, num_splits=4, kv_reads="per_group")
    assert a.reads["K"] == 2 * 32 * 4096 * 128 and b.reads["K"] == a.reads["K"] // 4
    assert a.reads["Q"] == b.reads["Q"] == 4 * 2 * 32 * 128          # every split reads Q
    assert a.writes["Opart"] == a.reads["Opart"] == 4 * 2 * 32 * 128
    assert a.read_bytes_of("Opart") == 4 * a.reads["Opart"] and a.read_bytes_of("Lpart") == 4 * 4 * 64
    assert a.reads["block_table"] == 2 * 32 * 16 and b.reads["block_table"] == 2 * 8 * 16
    assert a.read_bytes_of("block_table") == 4 * a.reads["block_table"]
    assert a.writes["O"] == 2 * 32 * 128 and a.write_bytes_of("O") == 2 * a.writes["O"]
    f = decode_closed_form("fa2_decode", p, kv_reads="per_group")
    assert set(f.counts()) == {"Q", "K", "V", "O", "L", "block_table"}
    assert f.hbm_bytes == (2 * 32 * 128 * 2 * 2 + 2 * 2 * 8 * 4096 * 128 * 2
                           + 2 * 32 * 4 + 2 * 8 * 16 * 4)
    # a chunk of 1000 rows with pages of 256 straddles page boundaries: 2 splits share page 3
    q = DecodeProblem(N_kv=2000, d=64, page_size=256)
    assert decode_closed_form("split_kv", q, num_splits=2).reads["block_table"] == 9
    d = a.to_dict()
    assert d["hbm_bytes"] == a.hbm_read_bytes + a.hbm_write_bytes and d["paged"] == 256
    assert d["per_tensor"]["Lpart"]["write_bytes"] == 4 * 4 * 64 and "block_table" in a.table()


def test_choose_num_splits_examples():
    one = DecodeProblem(N_kv=32768, d=128, batch=1, heads=32)
    c = choose_num_splits(one, 132)
    assert c.num_splits == 5 > 1 and c.binding == "fill" and c.blocks_per_split == 32
    assert c.s_fill == 5 and c.s_cap_blocks == 256 and c.partial_fraction < 0.05
    assert choose_num_splits(DecodeProblem(N_kv=32768, d=128, batch=64, heads=32), 132).num_splits == 1
    # per_group: 8 blocks per split for 32 heads on 8 K/V heads
    g = choose_num_splits(DecodeProblem(N_kv=32768, d=128, heads=32, kv_heads=8), 132,
                          kv_reads="per_group")
    assert g.blocks_per_split == 8 and g.num_splits == 17
    assert choose_num_splits(one, 132, ctas_per_sm=2).num_splits == 9
    # caps: one 128-row block per split; a page per split; partial traffic
    short = choose_num_splits(DecodeProblem(N_kv=512, d=64), 132)
    assert (short.num_splits, short.binding) == (4, "blocks")
    paged = choose_num_splits(DecodeProblem(N_kv=512, d=64, page_size=16), 132)
    assert (paged.num_splits, paged.binding, paged.s_cap_traffic) == (12, "traffic", 12)
    wide = choose_num_splits(DecodeProblem(N_kv=256, d=128, N_q=16), 132)
    assert (wide.num_splits, wide.s_cap_traffic) == (1, 1)
    assert choose_num_splits(DecodeProblem(N_kv=64, d=8), 132).num_splits == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200000), st.sampled_from([64, 128]), st.integers(1, 64),
       st.sampled_from([1, 8, 32]), st.integers(1, 16), st.one_of(st.none(), st.sampled_from([16, 256])),
       st.sampled_from(KV_READS), st.sampled_from([1, 108, 132]))
def test_choose_num_splits_rule(N_kv, d, batch, heads, N_q, page, kv_reads, sms):
    N_q = min(N_q, N_kv)
    p = DecodeProblem(N_kv=N_kv, d=d, batch=batch, heads=heads, kv_heads=max(1, heads // 4),
                      N_q=N_q, page_size=page)
    c = choose_num_splits(p, sms, kv_reads=kv_reads)
    S = c.num_splits
    assert check_num_splits(N_kv, S) == S >= 1
    assert S <= max(c.s_fill, 1) and S <= c.s_cap_blocks and S <= c.s_cap_traffic
    assert S == 1 or c.partial_bytes <= 0.05 * c.kv_bytes
    assert S * c.blocks_per_split >= c.target_blocks or c.binding != "fill"
    if S > 1:   # the smallest S that fills: one fewer does not
        assert (S - 1) * c.blocks_per_split < c.target_blocks or c.binding != "fill"
    led = decode_closed_form("split_kv", p, num_splits=S, kv_reads=kv_reads)
    assert c.kv_bytes == led.read_bytes_of("K") + led.read_bytes_of("V")
    assert c.partial_bytes == sum(led.read_bytes_of(t) + led.write_bytes_of(t) for t in ("Opart", "Lpart"))


def test_nan_in_a_visible_cache_row_gives_nan():
    p = DecodeProblem(N_kv=40, d=4, N_q=2, dtype="fp32", page_size=8)
    q, k, v = random_decode_inputs(p, seed=2)
    k[0, 0, 39] = np.nan            # only row 1 (the last) sees cache row 39
    ex = execute_decode("split_kv", p, q, k, v, num_splits=3, block_kv=5)
    assert np.isnan(ex.O[0, 0, 1]).all() and not np.isnan(ex.O[0, 0, 0]).any()


@pytest.mark.parametrize("kwargs, match", [
    (dict(N_kv=0, d=4), "N_kv=0"), (dict(N_kv=4, d=-1), "d=-1"),
    (dict(N_kv=8, d=4, N_q=0), r"N_q=0 .*allowed: integers 1\.\.8"),
    (dict(N_kv=80, d=4, N_q=17), r"N_q=17 .*allowed: integers 1\.\.16"),
    (dict(N_kv=3, d=4, N_q=4), r"N_q=4 .*N_kv=3.*1\.\.3"),
    (dict(N_kv=8, d=4, heads=4, kv_heads=3), "kv_heads=3.*divisor"),
    (dict(N_kv=8, d=4, dtype="fp8"), "dtype='fp8'"),
    (dict(N_kv=8, d=4, page_size=0), r"page_size=0 .*None \(contiguous cache\)"),
    (dict(N_kv=8, d=4, page_size=2.5), r"page_size=2.5"),
])
def test_problem_rejects_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DecodeProblem(**kwargs)


def test_schedules_reject_bad_input():
    p = DecodeProblem(N_kv=10, d=4)
    with pytest.raises(ConfigError, match=r"num_splits=6 .*N_kv=10.*split 5 empty"):
        execute_decode("split_kv", p, num_splits=6)
    with pytest.raises(ConfigError, match="num_splits=0"):
        decode_closed_form("split_kv", p, num_splits=0)
    with pytest.raises(ConfigError, match=r"num_splits=2 .*fa2_decode.*allowed: 1"):
        decode_closed_form("fa2_decode", p, num_splits=2)
    with pytest.raises(ConfigError, match=r"kv_reads='per_head'.*per_query_head, per_group"):
        execute_decode("fa2_decode", p, kv_reads="per_head")
    with pytest.raises(ConfigError, match=r"schedule='fa1'.*fa2_decode, split_kv"):
        decode_closed_form("fa1", p)
    with pytest.raises(ConfigError, match=r"q has shape \(1, 1, 2, 4\).*\(1, 1, 1, 4\)"):
        execute_decode("fa2_decode", p, np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 10, 4)),
                       np.zeros((1, 1, 10, 4)))
    with pytest.raises(ConfigError, match="block_kv=0"):
        execute_decode("fa2_decode", p, block_kv=0)
    with pytest.raises(ConfigError, match="sm_count=0"):
        choose_num_splits(p, 0)
    with pytest.raises(ConfigError, match="max_partial_fraction=0"):
        choose_num_splits(p, 132, max_partial_fraction=0)
