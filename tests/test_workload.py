"""A model's attention traffic (issue 40, item 3): iosim.workload's calls and their
pricing, `flashsim model` and its figure.

References, independent of the code under test: the executed schedules (iosim.execute,
execute_backward, iosim.decode.execute_decode through CountingMemory) for small runs, the
closed forms called here call by call, transformers' sliding-window mask written out
(kv_idx <= q_idx and kv_idx > q_idx - sliding_window), and gpu's launch rules
(iosim.kernel_plan, iosim.choose_num_splits) asked directly.
"""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iosim
from _cli import run_cli
from _errors import one_line
from _ledgers import bytes_by_layer, closed as _closed, executed as _executed
from iosim import ConfigError, Problem, Tiling
from iosim.decode import DecodeProblem, decode_closed_form
from iosim.workload import (AttentionCall, KNOWN_CONFIGS, ModelShape, calls_from_config,
                            load_config, model_shape, record, recording, traffic_table)

#: a small model: 3 layers, the middle one sliding (window 20 keys), 4 query heads on
#: 2 K/V heads, d = 8
SMALL = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "sliding_window": 20,
         "layer_types": ["full_attention", "sliding_attention", "full_attention"]}


# ---------------------------------------------------------------------------------------
# The per-layer ledger: the sum of the closed forms of the calls, and the executed schedules
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("train", [False, True])
def test_layer_ledger_is_the_sum_of_the_closed_forms(train):
    calls = calls_from_config(SMALL, prefill=40, decode_steps=0 if train else 30,
                              batch=2, train=train)
    table = traffic_table(calls)
    sections = ([("train", False), ("train", True)] if train
                else [("prefill", False), ("decode", False)])
    for step, backward in sections:
        want = bytes_by_layer(calls, _closed, step, backward)
        got = table.by_layer(step, backward)
        assert [g.layer for g in got] == [0, 1, 2]
        for g in got:
            rd, wr = want[g.layer]
            assert g.read_bytes == rd and g.write_bytes == wr
            assert isinstance(g.hbm_bytes, int)
            assert g.hbm_bytes == sum(rd.values()) + sum(wr.values())


@pytest.mark.parametrize("train", [False, True])
def test_small_run_equals_the_executed_schedules(train):
    cfg = dict(SMALL, sliding_window=9)
    calls = calls_from_config(cfg, prefill=12, decode_steps=0 if train else 4, train=train)
    table = traffic_table(calls)
    cache = {}

    def executed(c):
        key = (c.problem, c.algorithm, c.tiling, c.num_splits, c.kv_reads, c.backward)
        if key not in cache:
            cache[key] = _executed(c)
        return cache[key]

    for row in table.rows:                  # call by call
        assert row.ledger.counts() == executed(row.call).counts()
    for step, backward in ({("train", False), ("train", True)} if train
                           else {("prefill", False), ("decode", False)}):
        want = bytes_by_layer(calls, executed, step, backward)
        for g in table.by_layer(step, backward):
            assert (g.read_bytes, g.write_bytes) == want[g.layer]


def test_sliding_windows_follow_transformers_mask():
    """transformers: query q sees key kv iff kv <= q and kv > q - sliding_window."""
    W, N, K = 9, 12, 4
    calls = calls_from_config(dict(SMALL, sliding_window=W), prefill=N, decode_steps=K)
    q, kv = np.arange(N)[:, None], np.arange(N)[None, :]
    hf = (kv <= q) & (kv > q - W)
    pre = {c.layer: c for c in calls if c.step == "prefill"}
    assert np.array_equal(iosim.element_mask(N, True, window=pre[1].problem.window), hf)
    assert pre[0].problem.window == pre[2].problem.window == (-1, -1)
    for c in calls:
        if c.step == "decode":
            k = sum(1 for o in calls if o.step == "decode" and o.layer == c.layer
                    and calls.index(o) <= calls.index(c))     # step number, 1-based
            total = N + k                                     # cache rows after appending
            seen = int(((np.arange(total) <= total - 1) & (np.arange(total) > total - 1 - W)).sum())
            assert c.problem.N_kv == (seen if c.layer == 1 else total)
    # a window as wide as the prompt is no window: the same mask, and the models take it
    wide = calls_from_config(dict(SMALL, sliding_window=N), prefill=N, decode_steps=0)
    assert wide[1].problem.window == (-1, -1)


def test_calls_follow_gpu_launch_rules():
    calls = calls_from_config(SMALL, prefill=300, decode_steps=5, batch=3, preset="H200")
    hw = iosim.get_hardware("H200")
    assert len(calls) == 3 * (1 + 5)
    assert [c.layer for c in calls] == [0, 1, 2] * 6
    assert [c.step for c in calls] == ["prefill"] * 3 + ["decode"] * 15
    for c in calls[:3]:
        plan = iosim.kernel_plan("fa2", c.problem, hw)
        assert c.tiling == (plan.tiling.B_r, plan.tiling.B_c) and c.algorithm == "fa2"
        assert c.problem.causal and c.problem.N == 300 and c.problem.batch == 3
    full = [c for c in calls if c.step == "decode" and c.layer == 0]
    assert [c.problem.N_kv for c in full] == [301, 302, 303, 304, 305]
    for c in full:
        S = iosim.choose_num_splits(c.problem, hw.sm_count).num_splits
        assert c.num_splits == S and c.algorithm == ("fa2_decode" if S == 1 else "split_kv")
    train = calls_from_config(SMALL, prefill=64, decode_steps=0, train=True)
    assert [(c.layer, c.backward) for c in train] == \
        [(0, False), (1, False), (2, False), (2, True), (1, True), (0, True)]
    bwd = iosim.kernel_plan("fa2", train[3].problem, iosim.get_hardware("H100-SXM"),
                            pass_="bwd").tiling
    assert train[3].tiling == (bwd.B_r, bwd.B_c)


# ---------------------------------------------------------------------------------------
# Pricing: DRAM and time, or the reason
# ---------------------------------------------------------------------------------------
def test_traffic_table_gives_numbers_or_a_reason():
    calls = calls_from_config(SMALL, prefill=256, decode_steps=2)
    table = traffic_table(calls, "H100-SXM")
    assert table.preset == "H100-SXM" and len(table.rows) == len(calls)
    for row, call in zip(table.rows, calls):
        assert row.call is call
        if row.dram_bytes is None or row.predicted_ms is None:
            assert row.reason and "\n" not in row.reason
    pre = table.select("prefill")
    assert pre[0].dram_bytes > 0 and pre[0].predicted_ms > 0 and pre[0].reason is None
    # the sliding layer's window is modelled (fa2 forward), with the models' trust
    # statements; a window was never measured, so they say it is outside the validated range
    assert pre[1].dram_bytes > 0 and pre[1].predicted_ms > 0
    assert len(pre[1].trust) == 2 and all("outside validated range" in t for t in pre[1].trust)
    dec = table.select("decode")
    # gpu.decode runs its flat kernel here: its time model gives the time (no DRAM bytes:
    # the L2 / DRAM model does not cover decoding), with that model's held-out score
    assert all(r.dram_bytes is None and r.predicted_ms > 0 and "time only" in r.reason
               and any(w.startswith("the flat kernel's model: held-out") for w in r.warnings)
               for r in dec)
    bf = traffic_table(calls_from_config(SMALL, prefill=256, decode_steps=0, dtype="bf16"))
    assert all(r.dram_bytes > 0 and any("bf16" in t for t in r.trust) for r in bf.rows)


def test_traffic_table_refuses_bad_input():
    c = calls_from_config(SMALL, prefill=8, decode_steps=0)[0]
    for bad, word in ((c, "calls"), ([c, "x"], "calls[1]"), (5, "calls")):
        with pytest.raises(ConfigError) as e:
            traffic_table(bad)
        one_line(e, word)
    with pytest.raises(ConfigError) as e:
        traffic_table([c], "H900")
    one_line(e, "preset='H900'", "H100-SXM")
    assert traffic_table([]).rows == ()


# ---------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------
def _call(layer=0):
    return AttentionCall(layer, "prefill", Problem(N=16, d=8, dtype="fp16", causal=True),
                         "fa2", (16, 16))


def test_recording_nests_and_is_a_no_op_outside():
    record(_call())                                  # outside: nothing, no error
    with recording() as outer:
        record(_call(0))
        with recording() as inner:
            record(_call(1))
        record(_call(2))
        with recording() as empty:
            pass
    record(_call(3))
    assert [c.layer for c in outer] == [0, 1, 2]
    assert [c.layer for c in inner] == [1] and empty == []
    with pytest.raises(RuntimeError):
        with recording() as lost:
            raise RuntimeError("boom")
    record(_call(4))
    assert lost == []                               # closed by the exception
    with recording() as calls:
        with pytest.raises(ConfigError) as e:
            record("not a call")
        one_line(e, "call", "AttentionCall")
    assert calls == []


def test_recorded_calls_price_like_built_ones():
    built = calls_from_config(SMALL, prefill=32, decode_steps=3)
    with recording() as calls:
        for c in built:
            record(c)
    a, b = traffic_table(calls), traffic_table(built)
    assert [r.hbm_bytes for r in a.rows] == [r.hbm_bytes for r in b.rows]


def test_packed_batches_price_their_ledger_only():
    """gpu.hf records a padded batch as the packed problem it runs (iosim.VarlenProblem)."""
    from iosim import VarlenProblem, execute_varlen, execute_varlen_backward
    p = VarlenProblem((5, 0, 12), (5, 0, 12), 8, heads=2, kv_heads=1, dtype="fp16",
                      causal=True)
    fwd = AttentionCall(0, "prefill", p, "fa2", (8, 4))
    bwd = AttentionCall(0, "train", p, "fa2", (4, 8), backward=True)
    table = traffic_table([fwd, bwd])
    f, b = table.rows
    assert f.ledger.counts() == execute_varlen("fa2", p, Tiling(8, 4)).ledger.counts()
    assert b.ledger.counts() == execute_varlen_backward(p, Tiling(4, 8)).ledger.counts()
    for r in (f, b):
        assert r.dram_bytes is None and r.predicted_ms is None and "variable-length" in r.reason
    with pytest.raises(ConfigError) as e:
        AttentionCall(0, "train", p, "fa1", (4, 8), backward=True)
    one_line(e, "algorithm='fa1'", "fa2")
    from analysis.model_traffic import format_summary, summarise
    text = format_summary(summarise(table), "packed")
    assert "varlen N_q=5/0/12" in text and f"{f.hbm_bytes:,}" in text


def test_recorded_decode_steps_on_other_problems_summarise():
    """A backend may run a decoding step on the forward kernels (a window narrower than the
    cache) or packed: the summary still counts it as a decode step at its key rows."""
    from analysis.model_traffic import format_summary, summarise
    calls = [AttentionCall(0, "prefill", Problem(N=64, d=8, causal=True, window=(15, 0)),
                           "fa2", (16, 16)),
             AttentionCall(0, "decode", Problem(N=1, N_k=65, d=8, causal=True, window=(15, 0)),
                           "fa2", (16, 16)),
             AttentionCall(0, "decode", iosim.VarlenProblem((1, 1), (66, 40), 8, causal=True),
                           "fa2", (16, 16))]
    s = summarise(traffic_table(calls))
    dec = s["sections"]["decode"]
    assert dec["steps"] == 2 and dec["layers"][0]["cache_rows"] == [65, 66]
    assert dec["first_step"]["cache_rows"] == [65] and dec["last_step"]["cache_rows"] == [66]
    text = format_summary(s, "recorded")
    assert "65..66" in text


# ---------------------------------------------------------------------------------------
# AttentionCall's checks
# ---------------------------------------------------------------------------------------
P = Problem(N=16, d=8, dtype="fp16", causal=True)
D = DecodeProblem(N_kv=100, d=8)


@pytest.mark.parametrize("kw,words", [
    (dict(layer=-1), ["layer=-1"]), (dict(layer=True), ["layer=True"]),
    (dict(layer=1.5), ["layer=1.5"]), (dict(step="warmup"), ["step='warmup'", "prefill"]),
    (dict(problem="N=16"), ["problem", "VarlenProblem", "DecodeProblem"]),
    (dict(algorithm="fa3"), ["algorithm='fa3'", "fa2"]),
    (dict(algorithm="split_kv"), ["algorithm='split_kv'"]),
    (dict(tiling=None), ["tiling=None", "(B_r, B_c)"]), (dict(tiling=(0, 16)), ["tiling"]),
    (dict(tiling=(16,)), ["tiling"]), (dict(num_splits=2), ["num_splits=2"]),
    (dict(backward=True), ["step='prefill'", "train"]), (dict(backward=1), ["backward=1"]),
    (dict(kv_reads="per_block"), ["kv_reads='per_block'", "per_group"]),
    (dict(problem=D, step="decode", tiling=(16, 16), algorithm="fa2_decode"), ["tiling"]),
    (dict(problem=D, step="decode", tiling=None, algorithm="fa2"), ["algorithm='fa2'"]),
    (dict(problem=D, step="prefill", tiling=None, algorithm="fa2_decode"), ["step"]),
    (dict(problem=D, step="decode", tiling=None, algorithm="fa2_decode", num_splits=2),
     ["num_splits=2", "split_kv"]),
    (dict(problem=D, step="decode", tiling=None, algorithm="split_kv", num_splits=0),
     ["num_splits=0"]),
])
def test_attention_call_refuses_bad_fields(kw, words):
    args = dict(layer=0, step="prefill", problem=P, algorithm="fa2", tiling=(16, 16))
    args.update(kw)
    with pytest.raises(ConfigError) as e:
        AttentionCall(**args)
    one_line(e, *words)


def test_attention_call_normalises():
    c = AttentionCall(np.int64(2), "train", P, "fa2", Tiling(16, 32), backward=True)
    assert c.layer == 2 and type(c.layer) is int and c.tiling == (16, 32) and c.pass_ == "bwd"
    d = AttentionCall(0, "decode", D, "split_kv", None, num_splits=4, kv_reads="per_group")
    assert d.pass_ == "decode" and d.num_splits == 4
    # a decoding step that a backend runs through the forward kernels is a Problem
    f = AttentionCall(0, "decode", Problem(N=1, N_k=100, d=8, causal=True), "fa2", (1, 64))
    assert f.pass_ == "fwd"


# ---------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------
def test_known_configs_read_as_published():
    shapes = {n: model_shape(load_config(n)[1], n) for n in KNOWN_CONFIGS}
    assert {"llama3-8b", "mistral-7b", "gemma2-9b"} <= set(shapes)
    ll = shapes["llama3-8b"]
    assert (ll.layers, ll.heads, ll.kv_heads, ll.head_dim) == (32, 32, 8, 128)
    assert ll.windows == (None,) * 32 and ll.max_positions == 8192
    mi = shapes["mistral-7b"]
    assert mi.windows == (4096,) * 32 and mi.head_dim == 128
    ge = shapes["gemma2-9b"]
    assert (ge.layers, ge.heads, ge.kv_heads, ge.head_dim) == (42, 16, 8, 256)
    assert ge.windows == tuple(4096 if i % 2 == 0 else None for i in range(42))
    g2 = shapes["gpt2-medium"]                       # GPT-2's own field names
    assert (g2.layers, g2.heads, g2.kv_heads, g2.head_dim) == (24, 16, 16, 64)
    with open(iosim.workload.CONFIGS_PATH) as f:
        assert "shapes only" in json.load(f)["about"].lower()


BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}


@pytest.mark.parametrize("cfg,windows", [
    (BASE, (None,) * 4),
    (dict(BASE, sliding_window=None), (None,) * 4),
    (dict(BASE, sliding_window=64), (64,) * 4),                               # Mistral
    (dict(BASE, sliding_window=64, use_sliding_window=False), (None,) * 4),   # Qwen2 off
    (dict(BASE, sliding_window=64, use_sliding_window=True, max_window_layers=2),
     (None, None, 64, 64)),                                                  # Qwen2 on
    (dict(BASE, sliding_window=64, sliding_window_pattern=2), (64, None, 64, None)),
    (dict(BASE, sliding_window=64, model_type="gemma2"), (64, None, 64, None)),
    (dict(BASE, sliding_window=64, layer_types=["full_attention", "sliding_attention",
                                                "sliding_attention", "full_attention"]),
     (None, 64, 64, None)),
])
def test_sliding_layer_types(cfg, windows):
    assert model_shape(cfg).windows == windows


def test_config_objects_and_defaults():
    s = model_shape(SimpleNamespace(**BASE))
    assert (s.heads, s.kv_heads, s.head_dim) == (8, 8, 64)            # hidden // heads
    s = model_shape({"text_config": dict(BASE, num_key_value_heads=2, head_dim=96),
                     "model_type": "gemma3"})
    assert (s.kv_heads, s.head_dim) == (2, 96)
    assert isinstance(s, ModelShape) and s.name == "config"


@pytest.mark.parametrize("cfg,words", [
    ({"num_attention_heads": 8, "hidden_size": 512}, ["num_hidden_layers is missing"]),
    ({"num_hidden_layers": 2, "hidden_size": 512}, ["num_attention_heads is missing"]),
    ({"num_hidden_layers": 2, "num_attention_heads": 8}, ["hidden_size is missing"]),
    (dict(BASE, num_hidden_layers=0), ["num_hidden_layers=0"]),
    (dict(BASE, num_hidden_layers="32"), ["num_hidden_layers='32'"]),
    (dict(BASE, num_key_value_heads=3), ["num_key_value_heads=3", "divisor"]),
    (dict(BASE, hidden_size=500), ["hidden_size=500"]),
    (dict(BASE, head_dim=512), ["head_dim=512", "1..256"]),
    (dict(BASE, sliding_window=0), ["sliding_window=0"]),
    (dict(BASE, sliding_window=8, layer_types=["full_attention"] * 3), ["layer_types", "4"]),
    (dict(BASE, sliding_window=8, layer_types=["chunked_attention"] * 4),
     ["layer_types[0]='chunked_attention'", "sliding_attention"]),
    (dict(BASE, layer_types=["sliding_attention"] * 4), ["sliding_window"]),
    (dict(BASE, sliding_window=8, use_sliding_window=True, max_window_layers=-1),
     ["max_window_layers=-1"]),
    ("llama", ["config", "dict"]),
    (dict(BASE, kv_lora_rank=512), ["kv_lora_rank=512", "latent"]),
    (dict(BASE, attn_layer_period=8), ["attn_layer_period=8", "hybrid"]),
    (dict(BASE, model_type="bert"), ["model_type='bert'", "decoder-only"]),
    (dict(BASE, is_encoder_decoder=True), ["is_encoder_decoder=True", "decoder-only"]),
])
def test_bad_configs(cfg, words):
    with pytest.raises(ConfigError) as e:
        model_shape(cfg)
    one_line(e, *words)


def test_load_config_by_path(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(BASE, num_key_value_heads=2)))
    name, cfg = load_config(str(d / "config.json"))
    assert name == "my-model" and model_shape(cfg).kv_heads == 2
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, words in ((tmp_path / "bad.json", ["not JSON"]),
                        (tmp_path / "list.json", ["list", "JSON object"]),
                        (tmp_path / "missing.json", ["neither", "llama3-8b"])):
        with pytest.raises(ConfigError) as e:
            load_config(str(path))
        one_line(e, *words)
    with pytest.raises(ConfigError) as e:
        load_config(5)
    one_line(e, "config=5", "llama3-8b")


@pytest.mark.parametrize("kw,words", [
    (dict(batch=0), ["batch=0"]), (dict(prefill=0), ["prefill=0"]),
    (dict(prefill=8.5), ["prefill=8.5"]), (dict(decode_steps=-1), ["decode_steps=-1"]),
    (dict(dtype="fp8"), ["dtype='fp8'"]), (dict(preset="H900"), ["preset='H900'", "H200"]),
    (dict(kv_reads="x"), ["kv_reads='x'"]), (dict(train=1), ["train=1"]),
    (dict(train=True, decode_steps=3), ["decode_steps=3", "train=True"]),
    (dict(train=True, decode_steps=0, config=dict(SMALL, head_dim=256)),
     ["head_dim=256", "kernel_plan", "1..128"]),
])
def test_calls_from_config_refuses_bad_arguments(kw, words):
    config = kw.pop("config", SMALL)
    with pytest.raises(ConfigError) as e:
        calls_from_config(config, **kw)
    one_line(e, *words)


# ---------------------------------------------------------------------------------------
# Hypothesis: any small config either builds calls that price exactly, or is refused in
# one line
# ---------------------------------------------------------------------------------------
@st.composite
def configs(draw):
    layers = draw(st.integers(1, 3))
    kv = draw(st.sampled_from([1, 2]))
    cfg = {"num_hidden_layers": layers, "num_attention_heads": kv * draw(st.sampled_from([1, 2])),
           "num_key_value_heads": kv, "head_dim": draw(st.sampled_from([4, 8, 16]))}
    if draw(st.booleans()):
        cfg["sliding_window"] = draw(st.integers(1, 40))
        if draw(st.booleans()):
            cfg["layer_types"] = draw(st.lists(st.sampled_from(
                ["full_attention", "sliding_attention"]), min_size=layers, max_size=layers))
    if draw(st.booleans()):          # now and then a bad field
        key = draw(st.sampled_from(sorted(cfg)))
        cfg[key] = draw(st.sampled_from([0, -3, None, "x", 2.5, 1000]))
    return cfg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), N=st.integers(-1, 48), K=st.integers(-1, 3),
       batch=st.integers(0, 2), train=st.booleans())
def test_property_calls_price_exactly_or_refuse(cfg, N, K, batch, train):
    try:
        calls = calls_from_config(cfg, prefill=N, decode_steps=0 if train else K,
                                  batch=batch, train=train)
    except ConfigError as e:
        assert "\n" not in str(e) and "allowed" in str(e)
        return
    layers = cfg["num_hidden_layers"]
    assert len(calls) == layers * (2 if train else 1 + K)
    table = traffic_table(calls)
    for row in table.rows:
        assert row.ledger.counts() == _closed(row.call).counts()
        assert row.reason is None or "\n" not in row.reason
        assert (row.dram_bytes is not None and row.predicted_ms is not None) or row.reason


@settings(max_examples=60, deadline=None)
@given(layer=st.one_of(st.integers(-2, 3), st.none(), st.floats(0, 2)),
       step=st.sampled_from(["prefill", "decode", "train", "eval", 1]),
       decode=st.booleans(), algorithm=st.sampled_from(["fa2", "fa1", "fa2_decode",
                                                        "split_kv", "fa4"]),
       tiling=st.sampled_from([None, (16, 16), (0, 4), (8,), "16x16"]),
       S=st.integers(0, 3), backward=st.sampled_from([False, True, 0, "no"]))
def test_property_attention_call_is_valid_or_refused(layer, step, decode, algorithm,
                                                     tiling, S, backward):
    try:
        c = AttentionCall(layer, step, D if decode else P, algorithm, tiling,
                          num_splits=S, backward=backward)
    except ConfigError as e:
        assert "\n" not in str(e) and "allowed" in str(e)
        return
    assert c.pass_ in ("fwd", "bwd", "decode")
    assert _closed(c).hbm_bytes > 0


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.sampled_from(["call", "decode", None, 3, "x", (16, 16)]), max_size=6),
       preset=st.sampled_from(["H100-SXM", "h200", "A100-40GB", "H900", ""]))
def test_property_traffic_table_prices_calls_or_names_the_bad_item(items, preset):
    good = {"call": _call(), "decode": AttentionCall(1, "decode", D, "split_kv", None,
                                                     num_splits=3)}
    calls = [good.get(x, x) if isinstance(x, str) else x for x in items]
    bad = [i for i, c in enumerate(calls) if not isinstance(c, AttentionCall)]
    try:
        table = traffic_table(calls, preset)
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and "allowed" in msg
        if preset in ("H900", ""):
            assert f"preset={preset!r}" in msg and "H100-SXM" in msg
        else:
            assert bad and f"calls[{bad[0]}]" in msg
        return
    assert not bad and len(table.rows) == len(calls)
    assert [r.ledger.counts() for r in table.rows] == [_closed(c).counts() for c in calls]


# ---------------------------------------------------------------------------------------
# flashsim model
# ---------------------------------------------------------------------------------------
def test_cli_model_table_and_json(tmp_path):
    out = tmp_path / "run.json"
    rc, text, err = run_cli(["model", "llama3.1-8b", "--prefill", "1024", "--decode", "3",
                             "--json", str(out)])
    assert rc == 0, err
    data = json.loads(out.read_text())
    assert "32 layers, 32 query heads, 8 K/V heads, d=128" in text
    assert "prefill, per layer" in text and "decode, sum over 3 steps per layer" in text
    assert "   0-31  N=1024 causal" in text              # equal layers on one line
    pre, dec = data["sections"]["prefill"], data["sections"]["decode"]
    assert len(pre["layers"]) == len(dec["layers"]) == 32 and dec["steps"] == 3
    # the printed per-layer ledger is the closed form of the layer's call, exactly
    p = Problem(N=1024, d=128, heads=32, kv_heads=8, dtype="fp16", causal=True)
    t = pre["layers"][0]["tiling"]
    led = iosim.closed_form("fa2", p, Tiling(*t))
    assert pre["layers"][0]["ledger_bytes"] == led.hbm_bytes and f"{led.hbm_bytes:,}" in text
    assert pre["total"]["ledger_bytes"] == 32 * led.hbm_bytes
    first = DecodeProblem(N_kv=1025, d=128, heads=32, kv_heads=8)
    # gpu.decode's defaults: the flat kernel reads each K/V head once for its 4 query heads
    from iosim.launch.decode import ctas_per_sm
    S = iosim.choose_num_splits(first, 132, ctas_per_sm(first, "per_group", "flat"),
                                kv_reads="per_group").num_splits
    sched = "fa2_decode" if S == 1 else "split_kv"
    assert dec["first_step"]["ledger_bytes"] == 32 * decode_closed_form(
        sched, first, num_splits=S, kv_reads="per_group").hbm_bytes
    assert dec["first_step"]["cache_rows"] == [1025] and dec["last_step"]["cache_rows"] == [1027]
    assert data["reasons"] and "[1] no DRAM bytes" in text      # decode: time only, said so
    rc, text2, _ = run_cli(["model", "llama3.1-8b", "--prefill", "1024", "--decode", "3",
                            "--json", "-"])
    assert rc == 0 and json.loads(text2)["sections"]["prefill"] == pre
    rc, text3, _ = run_cli(["model", "llama3.1-8b", "--prefill", "1024", "--decode", "3",
                            "--every-layer"])
    assert rc == 0 and "     31  N=1024 causal" in text3


def test_cli_model_train_and_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    rc, text, err = run_cli(["model", str(path), "--prefill", "64", "--train", "--gpu", "H200"])
    assert rc == 0, err
    assert "training step, forward, per layer" in text and "training step, backward" in text
    assert "window=19,0" in text and "on H200" in text


@pytest.mark.parametrize("argv,words", [
    (["model", "llama9"], ["llama9", "llama3-8b"]),
    (["model", "llama3-8b", "--prefill", "0"], ["prefill=0"]),
    (["model", "llama3-8b", "--batch", "-1"], ["batch=-1"]),
    (["model", "llama3-8b", "--decode", "-2"], ["decode_steps=-2"]),
    (["model", "llama3-8b", "--train", "--decode", "5"], ["--decode=5", "--train"]),
    (["model", "llama3-8b", "--gpu", "H900"], ["H900"]),
    (["model", "llama3-8b", "--dtype", "int8"], ["dtype='int8'"]),
    (["model", "llama3-8b", "--figure", "x.jpg"], ["--figure", ".png"]),
    (["model", "llama3-8b", "--prefill", "x"], ["--prefill"]),
    (["model", "llama3-8b", "--decode", "100000"], ["--decode=100000", "3,200,032 calls",
                                                    "15,624"]),
])
def test_cli_model_bad_input_exits_2(argv, words):
    rc, out, err = run_cli(argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_cli_model_columns_stay_apart_at_any_size():
    rc, out, err = run_cli(["model", "llama3.1-8b", "--prefill", "1000000000", "--decode", "2"])
    assert rc == 0, err
    assert "64x64  " in out and "..1,000,000,002  split_kv" in out
    assert " 128,000,024,704,000,000,000  " in out      # the exact ledger, apart from DRAM
    assert "too large for the L2 / DRAM model" in out   # the model's reason, as a note


def test_cli_model_figure(tmp_path):
    png = tmp_path / "layers.png"
    rc, text, err = run_cli(["model", "gemma2-9b", "--prefill", "512", "--decode", "2",
                             "--figure", str(png)])
    assert rc == 0, err
    assert png.stat().st_size > 0 and (tmp_path / "layers.svg").stat().st_size > 0
    assert f"figure: {png}" in text


def test_figure_reads_at_a_glance():
    import matplotlib.pyplot as plt
    from analysis.figures import model_layers
    from analysis.figures._style import DPI
    fig = model_layers.plot(model_layers.generate(prefill=1024, decode_steps=2))
    try:
        fig.canvas.draw()
        assert fig._suptitle.get_text().count("\n") == 0
        (ax,) = fig.axes
        assert ax.get_title().count("\n") == 0 and "1,024 tokens" in ax.get_title()
        assert fig.bbox.width <= 1300 * fig.dpi / DPI
        leg = ax.get_legend().get_window_extent()
        assert fig.bbox.x0 <= leg.x0 and leg.x1 <= fig.bbox.x1 and leg.y1 <= fig.bbox.y1
        heights = [b.get_height() for b in ax.patches]
        assert len(heights) == 2 * 32 and min(heights) > 0
    finally:
        plt.close(fig)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_COMMAND = ["model", "llama3.1-8b", "--prefill", "8192", "--decode", "100"]


def test_docs_page_shows_what_the_command_prints():
    """docs/model-traffic.md's table is the command's output as it stands (after a change
    to the models: remake it, and its figure, with the command the page names)."""
    with open(os.path.join(ROOT, "docs", "index.md")) as f:
        assert "(model-traffic.md)" in f.read()
    with open(os.path.join(ROOT, "docs", "model-traffic.md")) as f:
        page = f.read()
    rc, out, err = run_cli(DOCS_COMMAND)
    assert rc == 0, err
    assert "flashsim " + " ".join(DOCS_COMMAND) + " --figure docs/model-traffic.png" in page
    assert out.strip() in page, ("docs/model-traffic.md is stale: paste the output of "
                                 "flashsim " + " ".join(DOCS_COMMAND))
    assert os.path.getsize(os.path.join(ROOT, "docs", "model-traffic.png")) > 0
    # and the prose quotes the same numbers
    rc, js, _ = run_cli(DOCS_COMMAND + ["--json", "-"])
    sec = json.loads(js)["sections"]
    pre, dec = sec["prefill"]["layers"][0], sec["decode"]["layers"][0]
    assert f"predicts {pre['dram_bytes'] / 1e6:.0f} MB of" in page
    assert f"{dec['ledger_bytes'] / 1e9:.1f} GB a layer over\n  the 100 steps" in page
    assert f"against the prefill's {pre['ledger_bytes'] / 1e9:.1f} GB" in page
    assert f"(S = {dec['kernel'].split('S=')[1].split()[0]})" in page
    rc, js, _ = run_cli(DOCS_COMMAND + ["--kv-reads", "per_query_head", "--json", "-"])
    each = json.loads(js)["sections"]["decode"]["layers"][0]["ledger_bytes"]
    assert f"about four times\n  that ({each / 1e9:.1f} GB a layer)" in page


# ---------------------------------------------------------------------------------------
# On the GPU: a transformers model on gpu.hf's backend records the calls its config gives
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_hf_run_records_the_calls_built_from_its_config():
    """A Llama-shaped model (2 layers, random weights) generating on gpu.hf records, call
    by call, the layer, step, problem, tiling and num_splits that calls_from_config builds
    from its config for the device's preset, and so prices to the same ledger."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("gpu.hf")
    name = torch.cuda.get_device_name()
    preset = "H200" if "H200" in name else "H100-SXM" if "H100" in name else None
    if preset is None:
        pytest.skip(f"no preset for {name}")
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, hidden_size=512,
                                      intermediate_size=1024, vocab_size=1000,
                                      max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.float16).eval()
    model.set_attn_implementation(hf.register())
    ids = torch.randint(0, config.vocab_size, (1, 1024), device="cuda")
    new = 5                        # one prefill, then new - 1 decoding forwards
    with recording() as calls, torch.no_grad():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    built = calls_from_config(config, prefill=1024, decode_steps=new - 1, preset=preset)
    got = [(c.layer, c.step, c.problem, c.algorithm, c.tiling, c.num_splits) for c in calls]
    want = [(c.layer, c.step, c.problem, c.algorithm, c.tiling, c.num_splits) for c in built]
    assert got == want
    assert [r.hbm_bytes for r in traffic_table(calls, preset).rows] == \
        [r.hbm_bytes for r in traffic_table(built, preset).rows]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_gpu_calls_take_the_tilings_and_splits_gpu_takes(dtype):
    """On a GPU: the tiling of each prefill and training call (forward and backward) is
    the one gpu.attention / attention_backward take by default on this device, and each
    decode call's num_splits is gpu.decode's own (auto_num_splits)."""
    from numba import cuda
    from gpu._choose import default_tiling
    from gpu.backward.flash import default_backward_tiling
    from gpu.decode.api import auto_num_splits
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name   # str in numba-cuda 0.30
    preset = "H200" if "H200" in name else "H100-SXM" if "H100" in name else None
    if preset is None:
        pytest.skip(f"no preset for {name}")
    for d in (64, 128, 256):
        cfg = {"num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": d}
        built = calls_from_config(cfg, prefill=4096, decode_steps=3, dtype=dtype,
                                  preset=preset)
        if d <= 128 or dtype == "fp32":    # above 128, fp16 / bf16 training is refused
            built += calls_from_config(cfg, prefill=4096, decode_steps=0, dtype=dtype,
                                       preset=preset, train=True)
        for c in built:
            if c.step == "decode":
                assert c.num_splits == auto_num_splits(c.problem, c.kv_reads).num_splits
                continue
            t = (default_backward_tiling(d, dtype, "fa2", causal=True) if c.backward
                 else default_tiling("fa2", d, dtype, True))
            assert c.tiling == (t.B_r, t.B_c), (d, dtype, c.pass_)
