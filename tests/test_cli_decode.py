"""`flashsim traffic --decode`: the decode model on the command line.

--seq-len-kv alone now gives the forward schedule's ledger for N_q != N_k (issue 18);
the decode model is selected by --decode or implied by a decode-only option
(--num-splits, --page-size, --kv-reads). The tests that relied on --seq-len-kv alone
meaning decoding pass --decode."""
import json

import pytest

import iosim
from analysis.cli import main


def test_decode_json_equals_the_closed_form(capsys):
    rc = main(["traffic", "--algorithm", "fa2", "--seq-len", "2", "--seq-len-kv", "4096",
               "--head-dim", "64", "--heads", "8", "--kv-heads", "2", "--num-splits", "4",
               "--page-size", "256", "--kv-reads", "per_group", "--json"])
    out = json.loads(capsys.readouterr().out)
    led = iosim.decode_closed_form("split_kv", iosim.DecodeProblem(
        N_kv=4096, d=64, heads=8, kv_heads=2, N_q=2, page_size=256), num_splits=4,
        kv_reads="per_group")
    assert rc == 0 and out["schedule"] == "split_kv"
    assert out["hbm_bytes"] == led.hbm_bytes and out["hbm_read_bytes"] == led.hbm_read_bytes


@pytest.mark.parametrize("main_arg, kernel, fill", [(None, "tc", "floor"), ("tc", "tc", "floor"),
                                                   ("flat", "flat", "ceil"),
                                                   ("tiled", "tiled", "ceil")])
def test_decode_num_splits_from_the_rule(capsys, main_arg, kernel, fill):
    """S from iosim.choose_num_splits on the preset's 132 SMs with the main kernel's
    blocks an SM (the default main kernel in fp16 is the tensor-core one: one wave)."""
    from iosim.launch.decode import ctas_per_sm
    argv = ["traffic", "--algorithm", "fa2", "--seq-len", "1", "--seq-len-kv", "32768",
            "--head-dim", "128", "--heads", "32", "--gpu", "H100-SXM", "--decode", "--json"]
    rc = main(argv + (["--main", main_arg] if main_arg else []))
    out = json.loads(capsys.readouterr().out)
    p = iosim.DecodeProblem(N_kv=32768, d=128, heads=32)
    want = iosim.choose_num_splits(p, 132, ctas_per_sm(p, "per_query_head", kernel),
                                   fill=fill)
    assert rc == 0 and out["num_splits"] == want.num_splits > 1
    assert out["num_splits_choice"]["binding"] == want.binding


@pytest.mark.parametrize("argv, word", [
    (["--seq-len", "64", "--seq-len-kv", "4096", "--decode"], "N_q=64"),
    (["--seq-len", "1024", "--num-splits", "2"], "--seq-len-kv"),
    (["--seq-len", "1", "--seq-len-kv", "4096", "--decode", "--levels", "--pass", "bwd"], "--pass"),
    (["--seq-len", "1", "--seq-len-kv", "4096", "--decode", "--levels", "--dtype", "bf16"], "fp16"),
    # N_k != N: --levels models the fa2 forward (with a trust statement), not the backward
    (["--seq-len", "64", "--seq-len-kv", "4096", "--levels", "--pass", "bwd"], "--levels"),
    (["--seq-len", "1", "--seq-len-kv", "4096", "--decode", "--window", "8,0"], "--window"),
    (["--seq-len", "1", "--seq-len-kv", "100", "--num-splits", "0"], "num_splits"),
])
def test_decode_bad_input_one_line(argv, word, capsys):
    rc = main(["traffic", "--algorithm", "fa2", "--head-dim", "64"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and word in err[0]
