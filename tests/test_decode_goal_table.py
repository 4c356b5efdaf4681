"""The decode goal table (analysis.tables.table_decode_goal, issue 37's goal) on synthetic
decode_bench rows made here: two devices, the flat kernel's run beside an older tiled run,
torch SDPA, the tiled kernel (flashsim_tiled), paged and ragged points. The expected
numbers are computed in this file from the rows, with the HBM peaks written out."""
import statistics

import pytest

from analysis import results as R
from analysis import tables as T

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
#: HBM peaks in bytes/s (the iosim presets H100-SXM and H200), written out
PEAK = {H100: 3.35e12, H200: 4.8e12}
HEADS = {"MHA": (32, 32), "GQA": (32, 8), "MQA": (8, 1)}
FLAT_H100 = "decode_bench-flat-h100"
FLAT_H200 = "decode_bench-flat-h200"
OLD_H100 = "decode_bench-old-h100"


def dec_row(run, device, impl, attn, batch, N_kv, ms, paged=None, lens=None, date=None,
            main=None, **kw):
    """One decode_bench row; dram_bytes: K and V once + Q, O, L (fp16, d = 128)."""
    H, Hk = HEADS[attn]
    lens = lens or [N_kv] * batch
    dram = 2 * Hk * sum(lens) * 128 * 2 + 2 * batch * H * 128 * 2 + 4 * batch * H
    r = R.make_row("decode_bench", run_id=run, device=device,
                   date=date or {FLAT_H100: "2026-12-07T03:00:00+00:00",
                                 FLAT_H200: "2026-12-07T03:10:00+00:00"}.get(
                                     run, "2026-11-25T10:12:38+00:00"),
                   commit={FLAT_H100: "abc1234", FLAT_H200: "def5678"}.get(run, "e5d20a2"),
                   versions={}, impl=impl, dtype="fp16", batch=batch, heads=H, kv_heads=Hk,
                   seq_len_q=1, seq_len_kv=N_kv, d=128, paged=paged, attn=attn.lower(),
                   kv_reads="per_group" if H != Hk else "per_query_head",
                   status="ok", ms_median=ms, dram_bytes=dram, num_splits=1, **kw)
    if lens != [N_kv] * batch:
        r.update(ragged=True, cache_seqlens=list(lens), cache_seqlens_sum=sum(lens),
                 cache_seqlens_max=max(lens))
    if impl == "flashsim" and main:
        r.update(main_kernel=main, schedule="split_kv")
    if impl == "flashsim_tiled":
        r.update(main_kernel="tiled", schedule="split_kv")
    return r


def ms_at(row, frac):
    """The time (ms) at which `row` moves its dram_bytes at `frac` of its device's peak."""
    return row["dram_bytes"] / (frac * PEAK[row["device"]]) * 1e3


def timed(run, device, impl, attn, batch, N_kv, frac, **kw):
    r = dec_row(run, device, impl, attn, batch, N_kv, 1.0, **kw)
    r["ms_median"] = ms_at(r, frac)
    return r


RAGGED = [16384, 5000, 9000, 2100, 16000, 12000, 7000, 3000]


def synthetic_rows():
    """Rows of three runs: an old tiled run on the H100 (no main_kernel), the flat kernel's
    run on the H100 and on the H200, in the order they were recorded."""
    rows = []
    # the old run: the tiled kernel (no main_kernel) and SDPA at points the new runs have
    for attn in ("MHA", "GQA"):
        rows.append(timed(OLD_H100, H100, "flashsim", attn, 8, 16384, 0.12))
        rows.append(timed(OLD_H100, H100, "torch_sdpa", attn, 8, 16384, 0.9))
    rows.append(timed(OLD_H100, H100, "torch_sdpa", "MQA", 8, 65536, 0.9))   # not in the new run
    rows.append(timed(OLD_H100, H100, "flashsim", "MHA", 1, 65536, 0.10))
    # the H100's flat run: every heads x layout at batch 8 and 64, 16K and 64K
    i = 0
    for attn in ("MHA", "GQA", "MQA"):
        for paged in (None, 16, 256):
            for batch, N_kv in ((8, 16384), (8, 65536), (64, 16384)):
                i += 1
                frac = 0.70 + 0.013 * i     # 0.713 .. 1.05: some under the 80 % goal
                kw = dict(paged=paged, main="flat")
                if (attn, paged, batch, N_kv) == ("GQA", None, 8, 16384):
                    # an earlier row of the same point: the later one counts
                    rows.append(timed(FLAT_H100, H100, "flashsim", attn, batch, N_kv, 0.3, **kw))
                rows.append(timed(FLAT_H100, H100, "flashsim", attn, batch, N_kv, frac, **kw))
                if paged is None and not (attn == "MQA" and N_kv == 65536):
                    rows.append(timed(FLAT_H100, H100, "torch_sdpa", attn, batch, N_kv,
                                      0.95 - 0.02 * i))
                if paged is None and batch == 8:
                    rows.append(timed(FLAT_H100, H100, "flashsim_tiled", attn, batch, N_kv,
                                      0.25 + 0.01 * i))
    # ragged batches: contiguous (with SDPA over a padding mask) and paged 16
    for paged, frac in ((None, 0.83), (16, 0.78)):
        rows.append(timed(FLAT_H100, H100, "flashsim", "GQA", 8, 16384, frac, paged=paged,
                          lens=RAGGED, main="flat"))
    rows.append(timed(FLAT_H100, H100, "torch_sdpa", "GQA", 8, 16384, 0.6, lens=RAGGED))
    # batch 1: 64K and 128K (the 70 % goal) and 16K (in no goal group)
    for attn, N_kv, frac, sdpa in (("MHA", 65536, 0.72, 0.8), ("GQA", 131072, 0.65, 0.7),
                                   ("MHA", 16384, 0.40, 0.5)):
        rows.append(timed(FLAT_H100, H100, "flashsim", attn, 1, N_kv, frac, main="flat"))
        rows.append(timed(FLAT_H100, H100, "torch_sdpa", attn, 1, N_kv, sdpa))
    # a point the run could not time, a failed row, a sweep row
    rows.append(dict(dec_row(FLAT_H100, H100, "flashsim", "MHA", 64, 131072, None),
                     status="skipped", reason="memory"))
    rows.append(dict(dec_row(FLAT_H100, H100, "flashsim", "MHA", 8, 131072, None),
                     status="error", error="out of memory"))
    rows.append(timed(FLAT_H100, H100, "flashsim", "MHA", 8, 16384, 0.01, main="flat",
                      sweep="num_splits", shape="b8"))
    # the H200's flat run: two points, one of them paged
    rows.append(timed(FLAT_H200, H200, "flashsim", "GQA", 8, 16384, 0.85, main="flat"))
    rows.append(timed(FLAT_H200, H200, "torch_sdpa", "GQA", 8, 16384, 0.80))
    rows.append(timed(FLAT_H200, H200, "flashsim", "GQA", 8, 16384, 0.75, paged=256,
                      main="flat"))
    return rows


def _sections(text):
    """{device: {(group, heads, cache): [cells after the first three]}} of the table."""
    out, dev = {}, None
    for line in text.splitlines():
        if line.startswith("**"):
            dev = line[2:line.index("**", 2)]
            out[dev] = {}
        elif line.startswith("| ") and dev and not line.startswith("| goal group"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[dev][tuple(cells[:3])] = cells[3:]
    return out


def _expect(rows, run, keep, goal):
    """The cells of one goal group, computed from the rows by hand."""
    mine = [r for r in rows if r["run_id"] == run and r["status"] == "ok" and not r.get("sweep")]
    point = lambda r: (r["attn"], r["batch"], r["seq_len_kv"], r["paged"],
                       tuple(r.get("cache_seqlens", ())))
    last = {}
    for r in mine:
        last[(r["impl"], point(r))] = r
    fl = [r for (impl, _), r in last.items() if impl == "flashsim" and keep(r)]
    frac = [r["dram_bytes"] / (r["ms_median"] / 1e3) / PEAK[r["device"]] for r in fl]
    sdpa = [last[("torch_sdpa", point(r))]["ms_median"] / r["ms_median"] for r in fl
            if ("torch_sdpa", point(r)) in last]
    tiled = [last[("flashsim_tiled", point(r))]["ms_median"] / r["ms_median"] for r in fl
             if ("flashsim_tiled", point(r)) in last]
    p = lambda v: f"{100 * v:.1f} %"
    x = lambda v: f"{v:.2f}x"
    return [str(len(fl)), p(min(frac)), p(statistics.median(frac)), f"{100 * goal:.0f} %",
            f"{sum(f >= goal for f in frac)}/{len(fl)}",
            x(min(sdpa)) if sdpa else "–", x(statistics.median(sdpa)) if sdpa else "–",
            f"{sum(s > 1 for s in sdpa)}/{len(sdpa)}" if sdpa else "–",
            str(len(tiled)), x(min(tiled)) if tiled else "–",
            x(statistics.median(tiled)) if tiled else "–"]


def test_decode_goal_table_numbers(tmp_path):
    rows = synthetic_rows()
    R.append(rows, data=tmp_path)
    text = T.table_decode_goal(tmp_path)
    assert "No run of the current" not in text
    got = _sections(text)
    assert set(got) == {H100, H200}
    big = lambda r: r["batch"] >= 8 and r["seq_len_kv"] >= 16384
    for attn in ("MHA", "GQA", "MQA"):
        for cache, paged in (("contiguous", None), ("paged 16", 16), ("paged 256", 256)):
            keep = (lambda r, a=attn, p=paged: big(r) and r["attn"] == a.lower()
                    and r["paged"] == p and not r.get("ragged"))
            assert got[H100][("B ≥ 8, N_kv ≥ 16K", attn, cache)] == \
                _expect(rows, FLAT_H100, keep, 0.80), (attn, cache)
    for cache, paged in (("contiguous", None), ("paged 16", 16)):
        keep = lambda r, p=paged: big(r) and r.get("ragged") and r["paged"] == p
        assert got[H100][("B ≥ 8, N_kv ≥ 16K, ragged", "all", cache)] == \
            _expect(rows, FLAT_H100, keep, 0.80)
    assert got[H100][("B ≥ 8, N_kv ≥ 16K, ragged", "all", "paged 256")][:1] == ["0"]
    assert got[H100][("B ≥ 8, N_kv ≥ 16K, all", "all", "all")] == \
        _expect(rows, FLAT_H100, big, 0.80)
    one = lambda r: r["batch"] == 1 and r["seq_len_kv"] >= 65536
    assert got[H100][("B = 1, N_kv ≥ 64K", "all", "all")] == _expect(rows, FLAT_H100, one, 0.70)
    # the H200 against its own peak; its paged point has no SDPA row
    assert got[H200][("B ≥ 8, N_kv ≥ 16K", "GQA", "contiguous")] == \
        ["1", "85.0 %", "85.0 %", "80 %", "1/1", "1.06x", "1.06x", "1/1", "0", "–", "–"]
    assert got[H200][("B ≥ 8, N_kv ≥ 16K", "GQA", "paged 256")][:8] == \
        ["1", "75.0 %", "75.0 %", "80 %", "0/1", "–", "–", "–"]
    # run, date, commit under each table; the points the run could not time
    assert f"Run `{FLAT_H100}` on {H100}, 2026-12-07, commit `abc1234`; 2 points" in text
    assert f"Run `{FLAT_H200}` on {H200}, 2026-12-07, commit `def5678`._" in text
    assert OLD_H100 not in text
    assert "HBM peak 3.35 TB/s (iosim preset H100-SXM)" in text
    assert "HBM peak 4.80 TB/s (iosim preset H200)" in text


def test_newest_run_passes_over_cut_and_superseded_runs(tmp_path, monkeypatch):
    """A newer run cut by its time budget, or listed in DECODE_RUNS_SUPERSEDED, does not hide
    the newest whole run of the current kernels (skips for memory do not cut a run)."""
    rows = synthetic_rows()
    late = "2026-12-08T00:00:00+00:00"
    cut = timed("decode_bench-cut", H100, "flashsim", "GQA", 8, 16384, 0.5, date=late,
                main="tc")
    skipped = dict(cut, status="skipped", reason="time budget", ms_median=None)
    memory = timed("decode_bench-mem", H100, "flashsim", "GQA", 8, 16384, 0.6, date=late,
                   main="tc")
    assert T.newest_decode_runs(rows + [cut, skipped])[H100] == FLAT_H100
    assert T.newest_decode_runs(rows + [memory, dict(memory, status="skipped",
                                                     reason="cache 90 GB > 80% of free")]
                                )[H100] == "decode_bench-mem"
    monkeypatch.setitem(T.DECODE_RUNS_SUPERSEDED, "decode_bench-mem", "a test")
    assert T.newest_decode_runs(rows + [memory])[H100] == FLAT_H100


def test_decode_goal_table_before_the_flat_kernel(tmp_path):
    """Only runs without main_kernel: one line saying so, then the old run's figures."""
    rows = [r for r in synthetic_rows() if r["run_id"] == OLD_H100]
    R.append(rows, data=tmp_path)
    text = T.table_decode_goal(tmp_path)
    assert text.startswith("_No run of the current decode kernels")
    assert "flashsim: the tiled kernel" in text and f"Run `{OLD_H100}`" in text
    got = _sections(text)
    big = lambda r: r["batch"] >= 8 and r["seq_len_kv"] >= 16384
    assert got[H100][("B ≥ 8, N_kv ≥ 16K", "MHA", "contiguous")] == _expect(
        rows, OLD_H100, lambda r: big(r) and r["attn"] == "mha", 0.80)
    assert got[H100][("B ≥ 8, N_kv ≥ 16K", "MHA", "contiguous")][:5] == \
        ["1", "12.0 %", "12.0 %", "80 %", "0/1"]
    one = lambda r: r["batch"] == 1 and r["seq_len_kv"] >= 65536
    assert got[H100][("B = 1, N_kv ≥ 64K", "all", "all")] == _expect(rows, OLD_H100, one, 0.70)


def test_decode_goal_table_without_rows(tmp_path):
    R.append([R.make_row("bench", run_id="x", device=H100, date="d", commit=None,
                         versions={})], data=tmp_path)
    assert T.table_decode_goal(tmp_path).startswith("_No decode_bench rows")


def test_decode_goal_table_is_on_the_results_page():
    assert "decode_goal" in T.TABLES
    text = (T.R.ROOT / T.TARGET).read_text()
    assert "<!-- results:decode_goal -->" in text and "<!-- /results:decode_goal -->" in text


@pytest.mark.parametrize("attn,heads,kv,want", [("gqa", 32, 8, "GQA"), (None, 32, 32, "MHA"),
                                                (None, 8, 1, "MQA"), (None, 32, 8, "GQA"),
                                                ("MQA", 8, 1, "MQA")])
def test_decode_attn(attn, heads, kv, want):
    assert T.decode_attn({"attn": attn, "heads": heads, "kv_heads": kv}) == want
