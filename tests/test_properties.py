"""Property-based checks (issue 19, item 7).

1. Random problems and tilings (causal, grouped heads, block masks, ragged blocks):
   executed schedule = closed form (forward and backward), the vectorised closed form
   agrees, and outputs are within tolerance of float64.
2. The same chain through the kernels in the simulator, at tiny sizes: kernel self-count
   = closed form, forward and backward, outputs within tolerance of float64.
3. A fuzz of the command line: every argument list either exits 0 (with valid JSON for
   --json) or exits 2 with exactly one line on stderr, never a traceback.
"""
import json

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import iosim
from _cli import run_cli as _run_cli
from iosim.backward import (backward_closed_form, execute_backward,
                            reference_attention_backward)

ALGS = ("standard", "fa1", "fa2")


@st.composite
def problems(draw, N_max=64, d_choices=(1, 3, 8, 16), B_max=24, masks=True):
    N = draw(st.integers(1, N_max))
    d = draw(st.sampled_from(d_choices))
    kv = draw(st.sampled_from([1, 2]))
    heads = kv * draw(st.sampled_from([1, 2]))
    B_r, B_c = draw(st.integers(1, B_max)), draw(st.integers(1, B_max))
    mask = None
    if masks and draw(st.booleans()):
        T_r, T_c = -(-N // B_r), -(-N // B_c)
        bits = draw(st.lists(st.booleans(), min_size=T_r * T_c, max_size=T_r * T_c))
        mask = np.array(bits, dtype=bool).reshape(T_r, T_c)
    p = iosim.Problem(N=N, d=d, batch=draw(st.integers(1, 2)), heads=heads, kv_heads=kv,
                      dtype=draw(st.sampled_from(["fp32", "fp16"])), causal=draw(st.booleans()),
                      block_mask=mask)
    return p, iosim.Tiling(B_r, B_c), draw(st.sampled_from(ALGS)), draw(st.integers(0, 10**6))


def _err(a, b):
    """Max error relative to max |b|, floored at 1 (inputs are O(1))."""
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1.0))


def _tol(p):
    return 1e-4 if p.dtype == "fp32" else 2e-2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_executed_equals_closed_form_forward_and_backward(case):
    p, t, alg, seed = case
    q, k, v = iosim.random_inputs(p, seed)
    ex = iosim.execute(alg, p, t, q, k, v)
    assert ex.ledger.counts() == iosim.closed_form(alg, p, t).counts()
    if p.block_mask is None:
        arr = iosim.closed_form_arrays(alg, p.N, p.d, t.B_r, t.B_c, causal=p.causal,
                                       itemsize=p.itemsize, instances=p.instances)
        assert int(arr["hbm_bytes"]) == iosim.closed_form(alg, p, t).hbm_bytes
    ref = iosim.reference_attention(q, k, v, causal=p.causal, block_mask=p.block_mask,
                                    B_r=t.B_r, B_c=t.B_c)
    assert _err(ex.O, ref) < _tol(p)
    do = np.random.default_rng(seed + 1).standard_normal(q.shape).astype(p.np_dtype)
    bw = execute_backward(alg, p, t, q, k, v, do)
    assert bw.ledger.counts() == backward_closed_form(alg, p, t).counts()
    if p.dtype == "fp32":
        dref = reference_attention_backward(q, k, v, do, causal=p.causal,
                                            block_mask=p.block_mask, B_r=t.B_r, B_c=t.B_c)
        for got, want in zip((bw.dq, bw.dk, bw.dv), dref):
            assert _err(got, want) < 1e-3


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(N_max=24, d_choices=(16,), B_max=16))
def test_kernels_count_like_the_model_forward_and_backward(case):
    """In the simulator (or on a GPU): kernel self-count = closed form = executed schedule."""
    import gpu
    from gpu.backward import attention_backward
    p, t, alg, seed = case
    B_r, B_c = max(8, t.B_r), max(8, t.B_c)          # a few blocks keep the simulator quick
    mask = None
    if p.block_mask is not None:
        mask = np.random.default_rng(seed).random((-(-p.N // B_r), -(-p.N // B_c))) < 0.7
    p = iosim.Problem(N=p.N, d=16, batch=1, heads=p.heads, kv_heads=p.kv_heads,
                      dtype="fp32", causal=p.causal, block_mask=mask)
    t = iosim.Tiling(B_r, B_c)
    q, k, v = iosim.random_inputs(p, seed)
    kw = dict(causal=p.causal, block_mask=mask, block_rows=B_r, block_cols=B_c)
    stats_kw = {} if alg == "standard" else {"return_stats": True}
    out = gpu.attention(q, k, v, algorithm=alg, count_traffic=True, **stats_kw, **kw)
    O, ledger = np.asarray(out[0]), out[-1]
    assert ledger.counts() == iosim.closed_form(alg, p, t).counts() == \
        iosim.execute(alg, p, t, q, k, v).ledger.counts()
    ref = iosim.reference_attention(q, k, v, causal=p.causal, block_mask=mask, B_r=B_r, B_c=B_c)
    assert _err(O, ref) < 1e-5
    # backward, from the executed forward's statistics
    do = np.random.default_rng(seed + 1).standard_normal(q.shape).astype(np.float32)
    if alg == "fa2":
        stats = out[1]
    elif alg == "fa1":
        ex = iosim.execute("fa1", p, t, q, k, v)
        stats = (ex.stats["l"], ex.stats["m"])
    else:
        from iosim.reference import element_mask
        allowed = element_mask(p.N, p.causal, mask, B_r, B_c)
        G = p.heads // p.kv_heads
        s = (q.astype(np.float64) @ np.swapaxes(np.repeat(k, G, axis=1), -1, -2)) / 4.0
        s = np.where(allowed, s, -np.inf)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - np.where(allowed.any(1)[:, None], s.max(-1, keepdims=True), 0))
            stats = np.where(allowed.any(1)[:, None], e / e.sum(-1, keepdims=True), 0)
        stats = stats.astype(np.float32)
    grads, bled = attention_backward(q, k, v, O, do, stats, algorithm=alg, count_traffic=True, **kw)
    assert bled.counts() == backward_closed_form(alg, p, t).counts()
    dref = reference_attention_backward(q, k, v, do, causal=p.causal, block_mask=mask,
                                        B_r=B_r, B_c=B_c)
    for got, want in zip(grads, dref):
        assert _err(got, want) < 1e-4


# ---------------------------------------------------------------------------------------
# CLI fuzz
# ---------------------------------------------------------------------------------------
INTS = st.sampled_from(["1", "7", "64", "100", "1000", "16384", "0", "-3", "x", "1e3", "",
                        "4000000000", "10000000000000", "64,128", "3,x"])
NAMES = st.sampled_from(["standard", "fa1", "fa2", "fa3", "", "FA2", "standard,fa2"])
DTYPES = st.sampled_from(["fp16", "fp32", "half", "float16", "bf16", "", "fp16,fp32"])


def _opt(flag, values):
    return st.one_of(st.just([]), values.map(lambda v: [flag, v]))


@st.composite
def argvs(draw, out_dir):
    cmd = draw(st.sampled_from(["traffic", "reproduce", "sweep", "figure", "bench"]))
    argv = [cmd]
    if cmd == "traffic":
        for flag, vals in (("--algorithm", NAMES), ("--seq-len", INTS), ("--head-dim", INTS),
                           ("--sram-bytes", INTS), ("--block-rows", INTS), ("--block-cols", INTS),
                           ("--dtype", DTYPES), ("--batch", INTS), ("--heads", INTS),
                           ("--kv-heads", INTS), ("--gpu", st.sampled_from(["H100-SXM", "x"]))):
            argv += draw(_opt(flag, vals))
        argv += draw(st.sampled_from([[], ["--causal"], ["--json"], ["--causal", "--json"]]))
    elif cmd == "reproduce":
        argv += [draw(st.sampled_from(["gpt2-table", "gpt3-table"]))]
        argv += draw(_opt("--sram-bytes", INTS))
        argv += draw(st.sampled_from([[], ["--json"], ["--broadcast", "per_element"]]))
    elif cmd == "sweep":
        argv += ["--out", draw(st.sampled_from([f"{out_dir}/s{draw(st.integers(0, 9))}.jsonl",
                                                out_dir, f"{out_dir}/notes.txt",
                                                f"{out_dir}/notes.txt/x.jsonl"]))]
        for flag, vals in (("--algorithm", NAMES), ("--seq-len", INTS), ("--head-dim", INTS),
                           ("--sram-bytes", INTS), ("--block-rows", INTS), ("--block-cols", INTS),
                           ("--dtype", DTYPES), ("--causal", st.sampled_from(["true", "false",
                                                                             "yes", "true,false"])),
                           ("--sparsity", st.sampled_from(["1.0", "0.5", "0", "2", "x"]))):
            argv += draw(_opt(flag, vals))
        argv += draw(st.sampled_from([[], ["--no-retry"]]))
        # a random block mask over billions of tiles is only slow, not wrong: keep it small
        huge = any(v in argv for v in ("4000000000", "10000000000000"))
        assume(not (huge and "--sparsity" in argv))
    elif cmd == "figure":
        argv += [draw(st.sampled_from(["fig6", "fig9", "", "fig6_memory_footprint"])),
                 "--out", draw(st.sampled_from([out_dir, f"{out_dir}/notes.txt"]))]
    else:
        argv += draw(_opt("--reps", INTS)) + draw(_opt("--seq-lens", INTS))
        argv += draw(_opt("--dtypes", DTYPES)) + draw(_opt("--batch-heads", INTS))
        argv += ["--out", draw(st.sampled_from([f"{out_dir}/b.json", out_dir,
                                                f"{out_dir}/notes.txt/b.json"]))]
    return argv




def test_cli_fuzz(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("fuzz"))
    with open(f"{out_dir}/notes.txt", "w") as f:
        f.write("not a sweep file")

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(argvs(out_dir))
    def check(argv):
        rc, out, err = _run_cli(argv)
        assert "Traceback" not in err, (argv, err)
        if rc == 0:
            if "--json" in argv:
                json.loads(out)
        else:
            assert rc == 2, (argv, rc, err)
            assert len(err.strip().splitlines()) == 1, (argv, err)
        with open(f"{out_dir}/notes.txt") as f:
            assert f.read() == "not a sweep file"

    check()
