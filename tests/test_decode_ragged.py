"""Ragged batches (per-sequence cache_seqlens) and append-and-attend in iosim.decode
(issue 37): executed schedules against the closed form, outputs against dense float64 per
sequence, the ledger as a sum of per-sequence ledgers, the split rule, the time model's
refusal, `flashsim traffic --cache-seqlens / --append`, and bad input."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import iosim
from analysis.cli import main
from iosim import ConfigError, DecodeProblem, choose_num_splits, decode_closed_form, execute_decode
from iosim.decode import (DECODE_ORDER, append_kv, nonempty_chunks, paged_cache, random_decode_inputs,
                          random_new_kv, reference_decode, sequence_chunks, split_bounds)


def rel_err(x, ref):
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref) / (den if den else 1.0)


@st.composite
def ragged_cases(draw):
    batch = draw(st.integers(1, 3))
    short = draw(st.booleans())          # many 0 / 1 lengths, or lengths up to 60
    lens = tuple(draw(st.lists(st.integers(0, 2 if short else 60), min_size=batch,
                               max_size=batch)))
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([g for g in (1, 2, 4) if heads % g == 0]))
    p = DecodeProblem.ragged(lens, draw(st.sampled_from([1, 3, 8])), heads=heads, kv_heads=kv,
                             N_q=draw(st.integers(1, 4)), append=draw(st.booleans()),
                             dtype=draw(st.sampled_from(["fp32", "fp16"])),
                             page_size=draw(st.one_of(st.none(), st.integers(1, 20))))
    # S from 1 to beyond the shortest (and often the longest) sequence
    S = draw(st.integers(1, min(p.seqlens) + 3))
    schedule = "fa2_decode" if S == 1 and draw(st.booleans()) else "split_kv"
    return p, schedule, S, draw(st.sampled_from(iosim.KV_READS)), draw(st.integers(1, 16))


@settings(max_examples=150, deadline=None)
@given(ragged_cases())
def test_closed_form_equals_executed(case):
    p, schedule, S, kv_reads, block_kv = case
    ex = execute_decode(schedule, p, num_splits=S, kv_reads=kv_reads, block_kv=block_kv)
    cf = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads)
    assert ex.ledger.counts() == cf.counts()
    assert ex.ledger.hbm_bytes == cf.hbm_bytes
    assert ("K_new" in cf.reads) == p.append == ("K" in cf.writes)


@settings(max_examples=60, deadline=None)
@given(ragged_cases())
def test_outputs_match_float64_per_sequence(case):
    p, schedule, S, kv_reads, block_kv = case
    q, k, v = random_decode_inputs(p, seed=5)
    kn, vn = random_new_kv(p, seed=5) if p.append else (None, None)
    ex = execute_decode(schedule, p, q, k, v, num_splits=S, kv_reads=kv_reads,
                        block_kv=block_kv, page_seed=3, k_new=kn, v_new=vn)
    kk, vv = append_kv(p, k, v, kn, vn) if p.append else (k, v)
    ref, lse = reference_decode(q, kk, vv, seqlens=p.seqlens, return_lse=True)
    # rows past each cache are NaN in k, v: any read of them would show here
    assert not np.isnan(ex.O).any() and not np.isnan(ex.stats["L"]).any()
    assert rel_err(ex.O, ref) <= (1e-5 if p.dtype == "fp32" else 4e-3)
    L = ex.stats["L"]
    assert np.array_equal(np.isneginf(L), np.isneginf(lse))      # rows that see no key
    assert np.all(ex.O[np.isneginf(lse)] == 0)
    fin = np.isfinite(lse)
    np.testing.assert_allclose(L[fin], lse[fin], rtol=0, atol=1e-4 * (1 + np.abs(lse[fin]).max(initial=0)))


@settings(max_examples=60, deadline=None)
@given(ragged_cases())
def test_ledger_is_the_sum_of_per_sequence_ledgers(case):
    p, schedule, S, kv_reads, _ = case
    whole = decode_closed_form(schedule, p, num_splits=S, kv_reads=kv_reads).counts()
    total: dict = {}
    for n in p.cache_seqlens:
        one = DecodeProblem.ragged((n,), p.d, heads=p.heads, kv_heads=p.kv_heads, N_q=p.N_q,
                                   append=p.append, dtype=p.dtype, page_size=p.page_size)
        for t, (r, w) in execute_decode(schedule, one, num_splits=S,
                                        kv_reads=kv_reads).ledger.counts().items():
            a, b = total.get(t, (0, 0))
            total[t] = (a + r, b + w)
    assert whole == total


@pytest.mark.parametrize("page", [None, 7, 16])
@pytest.mark.parametrize("kv_reads", iosim.KV_READS)
def test_equal_lengths_give_the_uniform_ledger(page, kv_reads):
    # per-sequence lengths all equal, no append, every split non-empty: the one-N_kv ledger
    uni = DecodeProblem(N_kv=45, d=8, batch=3, heads=4, kv_heads=2, N_q=3, page_size=page)
    rag = DecodeProblem.ragged((45,) * 3, 8, heads=4, kv_heads=2, N_q=3, page_size=page)
    assert rag.N_kv == 45 and rag.seqlens == (45,) * 3 and not uni.is_ragged
    for S in (1, 4, 9):
        schedule = "fa2_decode" if S == 1 else "split_kv"
        a = decode_closed_form(schedule, uni, num_splits=S, kv_reads=kv_reads)
        b = decode_closed_form(schedule, rag, num_splits=S, kv_reads=kv_reads)
        assert a.counts() == b.counts() and a.hbm_bytes == b.hbm_bytes
        assert sequence_chunks(45, S) == split_bounds(45, S)
        # the uniform ledger's own output has no ragged keys (unchanged)
        assert "cache_seqlens" not in a.to_dict() and b.to_dict()["cache_seqlens"] == [45] * 3


def test_empty_blocks_read_nothing():
    # lengths 0, 1 and 5 with 4 splits: the 0 sequence's blocks and the 1 sequence's last
    # three blocks read nothing (no Q, no K/V, no block-table entry), but write partials
    p = DecodeProblem.ragged((0, 1, 5), 4, heads=2, N_q=2, page_size=2, dtype="fp32")
    assert [nonempty_chunks(n, 4) for n in p.seqlens] == [0, 1, 3]   # 5 rows: C = 2
    led = decode_closed_form("split_kv", p, num_splits=4)
    assert led.reads["Q"] == (0 + 1 + 3) * 2 * 2 * 4
    assert led.reads["K"] == 2 * 6 * 4
    assert led.reads["block_table"] == 2 * (0 + 1 + 3)      # chunks [0,2) [2,4) [4,5)
    assert led.writes["Opart"] == led.reads["Opart"] == 4 * 3 * 2 * 2 * 4
    ex = execute_decode("split_kv", p, num_splits=4)
    assert ex.ledger.counts() == led.counts()
    # sequence 0 sees nothing; sequence 1 (one cache row): new row 0 is before its start
    assert np.all(ex.O[0] == 0) and np.all(np.isneginf(ex.stats["L"][0]))
    assert np.all(ex.O[1, :, 0] == 0) and np.all(np.isneginf(ex.stats["L"][1, :, 0]))
    assert np.all(np.isfinite(ex.stats["L"][1, :, 1])) and np.all(np.isfinite(ex.stats["L"][2]))
    # all empty, one split: the block writes O = 0, L = -inf, reads nothing
    z = execute_decode("fa2_decode", DecodeProblem.ragged((0, 0), 4, dtype="fp32"))
    assert set(z.ledger.counts()) == {"O", "L"} and np.all(z.O == 0)


def test_append_ledger_and_cache():
    # two sequences with 5 and 0 cached rows append N_q = 3 rows through pages of 4:
    # rows [5, 8) touch page 1 only, rows [0, 3) page 0
    p = DecodeProblem.ragged((5, 0), 2, heads=2, kv_heads=1, N_q=3, append=True, page_size=4,
                             dtype="fp32")
    assert p.seqlens == (8, 3) and p.N_kv == 8
    led = decode_closed_form("fa2_decode", p)
    assert led.reads["K_new"] == led.reads["V_new"] == led.writes["K"] == led.writes["V"] == 2 * 3 * 2
    assert led.reads["block_table"] == 2 * (2 + 1) + (1 + 1)     # attention 2 heads, append
    assert led.read_bytes_of("K_new") == 4 * led.reads["K_new"]
    q, k, v = random_decode_inputs(p, seed=1)
    kn, vn = random_new_kv(p, seed=1)
    ex = execute_decode("fa2_decode", p, q, k, v, k_new=kn, v_new=vn, page_seed=2)
    assert ex.ledger.counts() == led.counts()
    kk, vv = append_kv(p, k, v, kn, vn)
    table = ex.stats["block_table"]
    assert table[1, 1] == -1                 # sequence 1 has one page; the rest unused
    for b, n in enumerate(p.seqlens):
        for c in range(n):
            assert np.array_equal(ex.stats["K"][table[b, c // 4], c % 4], kk[b, :, c])
    # new row r of sequence b sees cache rows c <= n_b + r: its own new key included
    assert rel_err(ex.O, reference_decode(q, kk, vv, seqlens=p.seqlens)) <= 1e-5
    # uniform-length append, contiguous: the cache after the step is append_kv's
    u = DecodeProblem.ragged((4, 4), 2, N_q=2, append=True, dtype="fp32")
    q, k, v = random_decode_inputs(u)
    kn, vn = random_new_kv(u)
    ex = execute_decode("split_kv", u, q, k, v, num_splits=2, k_new=kn, v_new=vn)
    assert np.array_equal(ex.stats["K"], append_kv(u, k, v, kn, vn)[0])


def test_paged_cache_of_a_ragged_batch():
    p = DecodeProblem.ragged((5, 0, 9), 2, page_size=4, dtype="fp32")
    q, k, v = random_decode_inputs(p)
    assert np.isnan(k[0, :, 5:]).all() and not np.isnan(k[0, :, :5]).any()
    kp, vp, table = paged_cache(p, k, v, seed=1)
    assert table.shape == (3, 3) and kp.shape == (2 + 0 + 3, 4, 1, 2)
    assert sorted(table[table >= 0].tolist()) == list(range(5))
    assert table[0, 2] == -1 and (table[1] == -1).all()


def test_choose_num_splits_on_ragged_batches():
    # the longest sequence sets the block cap, the sum of lengths the traffic cap
    p = DecodeProblem.ragged((32768, 0, 100), 128, heads=32)
    c = choose_num_splits(p, 132)
    assert c.s_cap_blocks == 256 and c.kv_bytes == 2 * 32 * 32868 * 128 * 2
    assert c.num_splits == c.s_fill == 2 and c.binding == "fill"
    # no "nonempty" step: short sequences' empty chunks read nothing
    short = choose_num_splits(DecodeProblem.ragged((300, 1), 8), 132, block_kv=1)
    assert short.num_splits == min(short.s_fill, short.s_cap_blocks, short.s_cap_traffic)
    empty = choose_num_splits(DecodeProblem.ragged((0, 0), 64), 132)
    assert empty.num_splits == 1 and empty.kv_bytes == 0 and empty.to_dict()["partial_fraction"] is None
    # equal lengths: the one-N_kv rule's answer
    for n in (100, 4096, 32768):
        a = choose_num_splits(DecodeProblem(N_kv=n, d=128, heads=8), 132)
        b = choose_num_splits(DecodeProblem.ragged((n,), 128, heads=8), 132)
        assert (a.num_splits, a.kv_bytes) == (b.num_splits, b.kv_bytes)


def test_min_split_rows_raises_the_block_cap():
    p = DecodeProblem.ragged((16384, 3000), 128, heads=8, kv_heads=1)
    assert choose_num_splits(p, 132, 4, min_split_rows=2048).s_cap_blocks == 8
    assert choose_num_splits(p, 132, 4, min_split_rows=64).s_cap_blocks == 16384 // 128
    paged = DecodeProblem.ragged((16384, 3000), 128, page_size=256)
    assert choose_num_splits(paged, 132, min_split_rows=4096).s_cap_blocks == 4
    for bad in (-1, 1.5, True, "2048"):
        with pytest.raises(ConfigError, match=f"min_split_rows={bad!r} is not allowed"):
            choose_num_splits(p, 132, min_split_rows=bad)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 200000), min_size=1, max_size=64),
       st.sampled_from([(32, 32), (32, 8), (8, 1)]), st.sampled_from([None, 16, 256]),
       st.sampled_from(["flat", "tc", "tiled"]))
def test_auto_splits_of_a_ragged_batch(lens, heads, page, kernel):
    """gpu.decode's rule: equal lengths (or the tiled kernel) take the uniform rule; a
    ragged batch never fewer splits than that, and more only within RAGGED_WAVES waves and
    chunks of the longest sequence of at least RAGGED_MIN_ROWS rows (or its unit)."""
    from iosim.launch import decode as geo
    H, Hk = heads
    p = DecodeProblem.ragged(tuple(lens), 128, heads=H, kv_heads=Hk, page_size=page)
    kr = "per_group" if H != Hk and kernel != "tiled" else "per_query_head"
    per_sm = geo.ctas_per_sm(p, kr, kernel)
    uniform = choose_num_splits(p, 132, per_sm, kv_reads=kr,
                                fill="floor" if kernel == "tc" else "ceil")
    c = geo.auto_num_splits(p, 132, kr, kernel)
    if kernel == "tiled" or len(set(lens)) < 2:
        assert c == uniform
        return
    assert c.num_splits >= uniform.num_splits
    if c.num_splits > uniform.num_splits:
        unit = max(page or 128, geo.RAGGED_MIN_ROWS)
        assert c.num_splits <= max(1, max(lens) // unit)
        assert (c.num_splits - 1) * c.blocks_per_split < geo.RAGGED_WAVES * 132 * per_sm
        assert c.num_splits <= c.s_cap_traffic


def test_decode_order_is_the_counters_order():
    assert DECODE_ORDER[-5:] == ("Opart", "Lpart", "block_table", "K_new", "V_new")
    from gpu.decode import append as A, split_kv as K
    assert K.COUNTED == DECODE_ORDER and A.C == K.C


@pytest.mark.parametrize("main", ["tiled", "flat"])
def test_time_model_on_ragged_batches_and_appends(main):
    """Each main kernel's model on a ragged batch: between the batch at its shortest and at
    its longest length. The tiled model was never timed on a ragged batch (a warning says
    so); the flat one was fitted with ragged rows among its own (no such warning)."""
    from iosim import predict_decode
    for page, kv_reads, kv in ((None, "per_query_head", 32), (256, "per_group", 8)):
        kw = dict(heads=32, kv_heads=kv, page_size=page)
        lens = (16384, 100, 0, 4096, 9000)
        rag = DecodeProblem.ragged(lens, 128, **kw)
        for S in (1, 3, 8):
            t = predict_decode(rag, num_splits=S, kv_reads=kv_reads, main=main)
            warned = any("ragged batch" in w for w in t["warnings"])
            assert t["predicted_ms"] > 0 and warned == (main == "tiled")
            # between the same batch with every sequence at the shortest and the longest
            lo = predict_decode(DecodeProblem.ragged((100,) * 5, 128, **kw), num_splits=S,
                                kv_reads=kv_reads, main=main)
            hi = predict_decode(DecodeProblem.ragged((16384,) * 5, 128, **kw), num_splits=S,
                                kv_reads=kv_reads, main=main)
            # (equal, to rounding, where the longest CTAs alone set the time)
            assert lo["predicted_ms"] <= t["predicted_ms"] <= hi["predicted_ms"] * (1 + 1e-12)
            assert t["tiles_per_cta"] == hi["tiles_per_cta"]        # the longest CTA
            assert t["main_hbm_bytes"] < hi["main_hbm_bytes"]
    # equal lengths without an append: the same prediction as one N_kv
    eq = DecodeProblem.ragged((4096,) * 2, 128, heads=32, kv_heads=8)
    uni = DecodeProblem(N_kv=4096, d=128, batch=2, heads=32, kv_heads=8)
    assert predict_decode(eq, num_splits=3) == predict_decode(uni, num_splits=3)
    assert predict_decode(eq) == predict_decode(uni)
    app = DecodeProblem.ragged((4096, 4096), 128, heads=32, kv_heads=8, append=True)
    with pytest.raises(ConfigError, match="append"):
        predict_decode(app)


@pytest.mark.parametrize("kwargs, match", [
    (dict(N_kv=None, d=4, batch=2, cache_seqlens=(1, 2, 3)), r"cache_seqlens=\(1, 2, 3\) .*batch=2"),
    (dict(N_kv=None, d=4, batch=2, cache_seqlens=(1, -2)), r"cache_seqlens=\(1, -2\).*ints >= 0"),
    (dict(N_kv=None, d=4, cache_seqlens=(True,)), r"cache_seqlens=\(True,\)"),
    (dict(N_kv=None, d=4, cache_seqlens="12"), r"cache_seqlens='12'"),
    (dict(N_kv=7, d=4, batch=2, cache_seqlens=(3, 5)), r"N_kv=7 .*None or 5"),
    (dict(N_kv=8, d=4, append=True), r"append=True needs cache_seqlens"),
    (dict(N_kv=None, d=4, cache_seqlens=3, append=1), r"append=1"),
    (dict(N_kv=None, d=4, cache_seqlens=3, N_q=17), r"N_q=17 .*1\.\.16"),
    (dict(N_kv=None, d=4), r"N_kv=None"),
])
def test_problem_rejects_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DecodeProblem(**kwargs)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.booleans(), st.none(),
                 st.text(max_size=3), st.binary(min_size=2, max_size=2),
                 st.lists(st.one_of(st.integers(-2, 5), st.floats(), st.booleans()),
                          max_size=3),
                 st.sampled_from([np.array([1, 2]), np.array([1.0, 2.0]), np.array([[1, 2]]),
                                  np.array([], int), np.int32(4), (3, np.int64(2)), {1, 2}])))
def test_cache_seqlens_fuzz(value):
    # batch 2: valid values build a problem with two lengths >= 0; others: one line
    try:
        p = DecodeProblem(None, 4, batch=2, cache_seqlens=value)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).startswith(("cache_seqlens=", "N_kv="))
        return
    assert len(p.cache_seqlens) == 2 and all(type(n) is int and n >= 0 for n in p.cache_seqlens)
    assert p.N_kv == max(p.cache_seqlens)


def test_schedules_reject_bad_input():
    p = DecodeProblem.ragged((3, 0), 4, N_q=2, append=True)
    with pytest.raises(ConfigError, match="num_splits=0"):
        decode_closed_form("split_kv", p, num_splits=0)
    with pytest.raises(ConfigError, match=r"num_splits=2 .*fa2_decode"):
        execute_decode("fa2_decode", p, num_splits=2)
    q, k, v = random_decode_inputs(p)
    with pytest.raises(ConfigError, match=r"k_new has shape \(2, 1, 1, 4\); the problem needs \(2, 1, 2, 4\)"):
        execute_decode("fa2_decode", p, q, k, v, k_new=np.zeros((2, 1, 1, 4)), v_new=np.zeros((2, 1, 1, 4)))
    u = DecodeProblem.ragged((3, 0), 4)
    with pytest.raises(ConfigError, match="k_new / v_new given for a problem with append=False"):
        execute_decode("fa2_decode", u, k_new=np.zeros((2, 1, 1, 4)))


def test_cli_ragged_json_equals_the_closed_form(capsys):
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "2", "--head-dim", "64",
               "--heads", "8", "--kv-heads", "2", "--cache-seqlens", "100,0,4096,1",
               "--append", "--page-size", "16", "--num-splits", "3", "--kv-reads",
               "per_group", "--json"])
    out = json.loads(capsys.readouterr().out)
    led = decode_closed_form("split_kv", DecodeProblem.ragged(
        (100, 0, 4096, 1), 64, heads=8, kv_heads=2, N_q=2, append=True, page_size=16),
        num_splits=3, kv_reads="per_group")
    assert rc == 0 and out["cache_seqlens"] == [100, 0, 4096, 1] and out["append"] is True
    assert out["hbm_bytes"] == led.hbm_bytes and out["per_tensor"] == led.per_tensor()
    assert out["seq_len_kv"] == 4098 and out["batch"] == 4


def test_cli_ragged_table_and_levels(capsys):
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "1", "--head-dim", "128",
               "--heads", "32", "--kv-heads", "8", "--cache-seqlens", "16384,0,1",
               "--levels"])
    out = capsys.readouterr().out
    from iosim.launch.decode import auto_num_splits
    rag = DecodeProblem.ragged((16384, 0, 1), 128, heads=32, kv_heads=8)
    # the tensor-core kernel runs it with a block per K/V head (gpu.decode's defaults:
    # --kv-reads auto) and its model predicts the time
    led = decode_closed_form("split_kv", rag, num_splits=auto_num_splits(
        rag, 132, "per_group", "tc").num_splits, kv_reads="per_group")
    assert rc == 0 and "cache_seqlens=[16384, 0, 1]" in out and led.table() in out
    assert "kv_reads=per_group" in out
    assert "predicted time on H100-SXM" in out
    assert "warning: the tensor-core kernel's model" in out
    # an append: no number, one line saying why
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "1", "--head-dim", "128",
               "--heads", "32", "--kv-heads", "8", "--cache-seqlens", "16384,0,1",
               "--append", "--levels"])
    out = capsys.readouterr().out
    declined = [line for line in out.splitlines() if line.startswith("no predicted time")]
    assert rc == 0 and len(declined) == 1 and "append" in declined[0]
    assert "predicted time on" not in out


@pytest.mark.parametrize("argv, word", [
    (["--cache-seqlens", "100,-1"], "cache_seqlens"),
    (["--cache-seqlens", "100,x"], "--cache-seqlens"),
    (["--cache-seqlens", "100,5", "--batch", "3"], "--batch=3"),
    (["--cache-seqlens", "100,5", "--seq-len-kv", "100"], "--seq-len-kv"),
    (["--seq-len-kv", "100", "--append"], "--append needs --cache-seqlens"),
    (["--cache-seqlens", "100,5", "--num-splits", "0"], "num_splits=0"),
    (["--cache-seqlens", "100,5", "--seq-len", "17"], "N_q=17"),
])
def test_cli_bad_input_one_line(argv, word, capsys):
    argv = ["--seq-len", "1"] + argv if "--seq-len" not in argv else argv
    try:
        rc = main(["traffic", "--algorithm", "fa2", "--head-dim", "64"] + argv)
    except SystemExit as e:         # argparse's own type check
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and word in err[0], err
