"""`flashsim bench --decode`: KV-cache decoding on a GPU: correctness, exact counts and
timings of gpu.decode's kernels against torch SDPA (and flash_attn where importable). One
run (about 5-6 minutes on an H100; --budget-s caps it), rows to a JSONL file.

On a CUDA GPU with torch (numpy < 2.5 first on the path: numba-cuda 0.30.4 cannot compile
kernels on numpy >= 2.5):
    flashsim bench --decode --out decode_bench.jsonl
then `flashsim results add decode_bench.jsonl` stores the rows in the results data set.
The commit recorded is $FLASHSIM_COMMIT, else the checkout's HEAD.

(a) checks (kind "decode_check", one row each): gpu.decode on NumPy inputs at a few
    sizes (fp16 / fp32, MHA / GQA with both kv_reads, contiguous / paged with a ragged last
    page and a shuffled block table, num_splits 1, a chosen S and "auto", N_q 1..16)
    against the dense float64 reference (iosim.reference_decode): rel_err of O, max |L -
    lse|; the instrumented build's own counts against iosim.decode_closed_form
    (counts_exact); the uncounted build's O equal to the counted one's.
(b) timings (kind "decode_bench"): batch in {1, 8, 64}, N_kv in {16K, 64K, 128K},
    d in {64, 128}, MHA (32 heads), GQA (32 query heads on 8 K/V heads) and MQA (8 on 1;
    flashsim with kv_reads="per_group" for both), contiguous and (d = 128) paged (pages
    of 16 and 256 rows), fp16, N_q = 1, num_splits "auto" (gpu.decode's rule for this GPU's SM
    count); then ragged batches at d = 128 (RAGGED: batch 8 and 64; lengths uniform in
    [N_kv / 8, N_kv], rows carry cache_seqlens, their sum and max; bandwidth counts each
    sequence's own bytes).
    impl "flashsim": DecodeLauncher (the kernels alone: main + combine when S > 1) on
    preallocated outputs, main kernel "auto" (`main_kernel` names the one that ran);
    "flashsim_tiled": the tiled main kernel, at the contiguous batch-8 points;
    "torch_sdpa": F.scaled_dot_product_attention(q, K, V, enable_gqa=GQA) on the
    contiguous cache (paged points: not timed, SDPA has no block table; ragged points:
    over the longest length with a boolean padding mask, `sdpa_mask`);
    "flash_attn": flash_attn_with_kvcache (uniform, contiguous and paged) if importable.
(c) num_splits sweep (kind "decode_bench", sweep "num_splits"): every S in 1..64 and a few
    larger for three shapes, with the rule's choice (rule_num_splits) in each row.

Timing method: per point, `kv_copies` independent (q, K, V[, block_table]) sets, rotated
call by call, as many as make the sets together exceed 200 MB (at least 2) where memory
allows (else 1: noted in `rotation`; such a cache is >= 0.4 x the GPU memory, far beyond
the 50 MB L2, so the L2 cannot flatter it). 3 warm-up calls (they compile), then a
torch.cuda._sleep holds the stream while the host enqueues `reps` (20) calls, each
between two CUDA events, so the events time the GPU work, not Python's launch overhead;
ms_median is the median, ms_min the fastest.

Bytes and bandwidth. `dram_bytes`: what a decoding step must move between HBM and the
chip at least, the same for every impl: K and V once (batch x kv_heads x N_kv x d x 2 x
itemsize), Q read and O written (batch x heads x N_q x d x itemsize each), L written
(4 bytes a row), the block-table entries when paged (batch x pages x 4). `gbps` =
dram_bytes / ms_median, to set against the HBM roofline (3.35 TB/s on the H100 SXM).
For flashsim rows also `ledger_bytes` (iosim.decode's DecodeLedger.hbm_bytes: every
element the kernels request, including K/V re-reads by the G query heads of a group
under per_query_head and the Opart / Lpart round trip of split_kv, which the L2 may
serve) and `gbps_ledger`.

Points whose cache (with its copies) does not fit in 80 % of the free memory are
recorded with status "skipped" and the reason; an error (e.g. out of memory) is recorded
with status "error" and the run goes on. Progress goes to stdout.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics

import time
import traceback

BATCHES = (1, 8, 64)
KV_LENS = (16384, 65536, 131072)
HEAD_DIMS = (64, 128)
#: cache layouts at d = 64 (d = 128 gets PAGES): contiguous only, to keep a run near 4 min
PAGES_D64 = (None,)
ATTN = {"mha": (32, 32), "gqa": (32, 8), "mqa": (8, 1)}
PAGE = 256
#: cache layouts timed: contiguous, and pages of 16 and 256 rows
PAGES = (None, 16, PAGE)
#: ragged batches (d = 128): (batch, longest N_kv); lengths drawn uniformly from
#: [N_kv / 8, N_kv] with a fixed seed, the longest set to N_kv
RAGGED = ((8, 16384), (64, 16384), (8, 131072))
ROTATE_BYTES = 200 * 10**6
SWEEP_S = tuple(range(1, 65)) + (80, 96, 128, 192, 256)
#: (name, batch, attn, d, N_kv, page_size) of the num_splits sweep
SWEEP_SHAPES = (("b1_mha_d128_16k", 1, "mha", 128, 16384, None),
                ("b1_gqa_d128_64k_paged", 1, "gqa", 128, 65536, PAGE),
                ("b8_mha_d64_4k", 8, "mha", 64, 4096, None))


#: smallest --reps (timed calls per point)
MIN_REPS = 20
#: default whole-run budget in seconds
BUDGET_S = 330.0


class Writer:
    """Appends validated rows to a JSONL file, one line per row, flushed at once."""

    def __init__(self, path, base: dict):
        from analysis import results as R
        self.R, self.path, self.base, self.n = R, path, base, 0
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)

    def row(self, kind: str, **payload) -> dict:
        r = self.R.make_row(kind, **self.base, **payload)
        self.R.validate(r)
        with open(self.path, "a") as f:
            f.write(json.dumps(r, default=str, allow_nan=False) + "\n")
            f.flush()
        self.n += 1
        return r


def _finite(x):
    return None if x is None or not math.isfinite(x) else float(x)


# ---------------------------------------------------------------------------------------
# (a) checks
# ---------------------------------------------------------------------------------------
CHECKS = (  # dtype, batch, heads, kv_heads, N_kv, d, N_q, page, num_splits, kv_reads
    ("fp16", 2, 32, 8, 4097, 128, 1, PAGE, "auto", "per_group"),
    ("fp16", 2, 32, 8, 4097, 128, 1, PAGE, 3, "per_query_head"),
    ("fp16", 3, 8, 8, 5000, 64, 16, None, 1, "per_query_head"),
    ("fp16", 1, 8, 2, 3001, 128, 4, 100, 7, "per_group"),
    ("fp32", 1, 8, 8, 20000, 64, 3, None, 7, "per_query_head"),
    ("fp32", 2, 16, 4, 3001, 128, 2, PAGE, "auto", "per_group"),
    ("fp32", 1, 4, 4, 1000, 128, 1, 16, 40, "per_query_head"),
)


def run_checks(w: Writer, quick: bool):
    import numpy as np
    import gpu
    from iosim.decode import (DecodeProblem, decode_closed_form, paged_cache,
                              random_decode_inputs, reference_decode)
    ok = True
    for c in CHECKS[:3] if quick else CHECKS:
        dt, B, H, Hk, N_kv, d, N_q, page, S, kv_reads = c
        t0 = time.perf_counter()
        cfg = dict(dtype=dt, batch=B, heads=H, kv_heads=Hk, seq_len_q=N_q, seq_len_kv=N_kv,
                   d=d, paged=page, num_splits_arg=S, kv_reads=kv_reads)
        try:
            p = DecodeProblem(N_kv=N_kv, d=d, batch=B, heads=H, kv_heads=Hk, N_q=N_q,
                              dtype=dt, page_size=page)
            q, k, v = random_decode_inputs(p, seed=N_kv + d)
            if page:
                kp, vp, tab = paged_cache(p, k, v, seed=1)
                args, kw = (q, kp, vp), dict(block_table=tab, cache_seqlens=N_kv)
            else:
                args, kw = (q, k, v), {}
            O, L, led = gpu.decode(*args, **kw, num_splits=S, kv_reads=kv_reads,
                                   return_stats=True, count_traffic=True)
            O2 = gpu.decode(*args, **kw, num_splits=led.num_splits, kv_reads=kv_reads)
            ref, lse = reference_decode(q, k, v, return_lse=True)
            rel = float(np.linalg.norm(O.astype(np.float64) - ref) / np.linalg.norm(ref))
            lerr = float(np.nanmax(np.abs(L - lse)))
            cf = decode_closed_form(led.algorithm, p, num_splits=led.num_splits,
                                    kv_reads=kv_reads)
            exact = led.counts() == cf.counts()
            same = bool(np.array_equal(O, O2, equal_nan=True))
            tol = 1e-5 if dt == "fp32" else 1e-3
            passed = exact and same and rel <= tol and not np.isnan(O).any()
            ok &= passed
            w.row("decode_check", impl="flashsim", **cfg, num_splits=led.num_splits,
                  schedule=led.algorithm, status="ok" if passed else "fail",
                  rel_err=_finite(rel), rel_err_tol=tol, L_max_abs_err=_finite(lerr),
                  counts_exact=exact, counted_equals_uncounted=same,
                  counts={t: list(v) for t, v in led.counts().items()},
                  model_counts={t: list(v) for t, v in cf.counts().items()},
                  seconds=round(time.perf_counter() - t0, 2))
            print(f"  check {c}: S={led.num_splits} rel_err={rel:.2e} L_err={lerr:.1e} "
                  f"counts_exact={exact} {'ok' if passed else 'FAIL'}", flush=True)
        except Exception as e:
            ok = False
            w.row("decode_check", impl="flashsim", **cfg, status="error",
                  error=f"{type(e).__name__}: {e}"[:500])
            print(f"  check {c}: ERROR {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    return ok


# ---------------------------------------------------------------------------------------
# (b), (c) timings
# ---------------------------------------------------------------------------------------
def dram_bytes(batch, H, Hk, N_q, N_kv, d, itemsize, page, lens=None) -> int:
    """The least a decoding step moves to or from HBM (see the module docstring); lens:
    per-sequence cache lengths (a ragged batch: each sequence's own K/V bytes)."""
    lens = [N_kv] * batch if lens is None else list(lens)
    kv = 2 * Hk * sum(lens) * d * itemsize
    qo = 2 * batch * H * N_q * d * itemsize + 4 * batch * H * N_q
    bt = 4 * sum(-(-n // page) for n in lens) if page else 0
    return kv + qo + bt


def ragged_lengths(batch: int, N_kv: int, seed: int = 0) -> tuple:
    """A ragged batch's cache lengths: uniform in [N_kv / 8, N_kv], the longest N_kv."""
    import numpy as np
    rng = np.random.default_rng(seed + batch + N_kv)
    lens = rng.integers(N_kv // 8, N_kv + 1, size=batch)
    lens[0] = N_kv
    return tuple(int(n) for n in lens)


class Timer:
    def __init__(self, torch, reps):
        self.torch, self.reps = torch, reps

    def __call__(self, fn, n_sets):
        torch = self.torch
        for i in range(3):
            fn(i % n_sets)
        torch.cuda.synchronize()
        # hold the stream while the host enqueues every timed call (about 100 us each; 5e5 cycles is about 250 us)
        torch.cuda._sleep(int(5e5 * self.reps))
        evs = []
        for r in range(self.reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn(r % n_sets)
            b.record()
            evs.append((a, b))
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in evs]
        return statistics.median(ms), min(ms)


class Bench:
    main = "auto"           # gpu.decode's main kernel for impl "flashsim"

    def __init__(self, w: Writer, reps: int, main: str = "auto"):
        import torch
        from numba import cuda
        self.w, self.torch, self.cuda = w, torch, cuda
        self.timer = Timer(torch, reps)
        self.reps = reps
        self.main = main
        try:
            from flash_attn import flash_attn_with_kvcache
            self.fa = flash_attn_with_kvcache
        except Exception:
            self.fa = None
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count

    def free_cap(self) -> int:
        """80 % of the free device memory, after handing torch's cached blocks back (the
        previous point's inputs are gone by then; cached, they would look used)."""
        self.torch.cuda.empty_cache()
        free, _total = self.torch.cuda.mem_get_info()
        return int(0.8 * free)

    def point(self, batch, attn, d, N_kv, page, *, num_splits="auto", sweep=None,
              impls=("flashsim", "torch_sdpa", "flash_attn"), name=None, lens=None):
        """Time one configuration for each impl; one row per impl (or one skipped row).
        lens: per-sequence cache lengths (a ragged batch; N_kv their maximum)."""
        import iosim
        from gpu.decode import DecodeLauncher
        from gpu.decode.api import auto_num_splits, main_kernel
        torch, cuda = self.torch, self.cuda
        H, Hk = ATTN[attn]
        N_q, dt, itemsize = 1, "fp16", 2
        kv_reads = "per_group" if Hk != H else "per_query_head"
        if lens is None:
            p = iosim.DecodeProblem(N_kv=N_kv, d=d, batch=batch, heads=H, kv_heads=Hk,
                                    N_q=N_q, dtype=dt, page_size=page)
        else:
            p = iosim.DecodeProblem.ragged(lens, d, heads=H, kv_heads=Hk, N_q=N_q, dtype=dt,
                                           page_size=page)
        rule = auto_num_splits(p, kv_reads, main_kernel(p, kv_reads, self.main))
        rule_tiled = auto_num_splits(p, kv_reads, "tiled")
        S = rule.num_splits if num_splits == "auto" else num_splits
        base = dict(dtype=dt, batch=batch, heads=H, kv_heads=Hk, seq_len_q=N_q,
                    seq_len_kv=N_kv, d=d, paged=page, attn=attn)
        if lens is not None:
            base.update(ragged=True, cache_seqlens=list(lens), cache_seqlens_sum=sum(lens),
                        cache_seqlens_max=max(lens))
        extra = dict(sweep=sweep, shape=name) if sweep else {}
        dbytes = dram_bytes(batch, H, Hk, N_q, N_kv, d, itemsize, page, lens)
        pages = -(-N_kv // page) if page else 0
        cache = 2 * batch * Hk * (pages * page if page else N_kv) * d * itemsize
        cap = self.free_cap()
        copies = max(2, -(-ROTATE_BYTES // cache))
        while copies > 1 and copies * cache > cap:
            copies -= 1
        if cache > cap:
            self.w.row("decode_bench", impl="flashsim", **base, **extra, num_splits=S,
                       status="skipped", reason=f"cache {cache / 1e9:.1f} GB > 80% of free "
                                                f"memory ({cap / 1e9:.1f} GB)")
            print(f"  skip {base}: memory", flush=True)
            return
        rotation = ("rotated" if copies * cache >= ROTATE_BYTES else
                    f"{copies} copies, {copies * cache / 1e6:.0f} MB < 200 MB")
        common = dict(kv_copies=copies, rotation=rotation, dram_bytes=dbytes,
                      reps=self.reps, kv_reads=kv_reads, rule_num_splits=rule.num_splits,
                      rule_binding=rule.binding)
        sets = []
        try:
            g = torch.Generator(device="cuda").manual_seed(N_kv + batch + d)
            for i in range(copies):
                q = torch.randn((batch, H, N_q, d), device="cuda", dtype=torch.float16,
                                generator=g)
                if page:
                    shape = (batch * pages, page, Hk, d)
                    tab = torch.randperm(batch * pages, device="cuda", generator=g).to(
                        torch.int32).reshape(batch, pages).contiguous()
                else:
                    shape, tab = (batch, Hk, N_kv, d), None
                k = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
                v = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
                sets.append((q, k, v, tab))
            torch.cuda.synchronize()
        except Exception as e:
            sets.clear()
            torch.cuda.empty_cache()
            self.w.row("decode_bench", impl="flashsim", **base, **extra, num_splits=S,
                       status="error", error=f"allocating inputs: {type(e).__name__}: {e}"[:400])
            print(f"  error {base}: {type(e).__name__}", flush=True)
            return
        scale = 1.0 / math.sqrt(d)
        o_flash = None
        for impl in impls:
            row = dict(impl=impl, **base, **extra, **common)
            try:
                if impl in ("flashsim", "flashsim_tiled"):
                    tiled = impl == "flashsim_tiled"
                    S_run = S
                    if tiled and num_splits == "auto":    # the tiled kernel's own rule
                        S_run = rule_tiled.num_splits
                        row["rule_num_splits"] = rule_tiled.num_splits
                        row["rule_binding"] = rule_tiled.binding
                    run = DecodeLauncher(p, S_run, kv_reads=kv_reads,
                                         main="tiled" if tiled else self.main)
                    o = torch.empty((batch, H, N_q, d), device="cuda", dtype=torch.float16)
                    L = torch.empty((batch, H, N_q), device="cuda", dtype=torch.float32)
                    od, Ld = (cuda.as_cuda_array(x, sync=False) for x in (o, L))
                    opart, lpart = run.partials()
                    ctr = run.new_counters()
                    dev = [tuple(None if x is None else cuda.as_cuda_array(x, sync=False)
                                 for x in s) for s in sets]

                    def fn(i):
                        qd, kd, vd, td = dev[i]
                        run(qd, kd, vd, td, od, Ld, opart, lpart, ctr, scale)
                    led = iosim.decode_closed_form(run.schedule, p, num_splits=S_run,
                                                   kv_reads=kv_reads)
                    ms, mn = self.timer(fn, copies)
                    fn(0)
                    torch.cuda.synchronize()
                    o_flash = o.float()
                    row.update(num_splits=S_run, schedule=run.schedule, main_kernel=run.main,
                               ledger_bytes=led.hbm_bytes,
                               gbps_ledger=led.hbm_bytes / ms / 1e6,
                               kernel_layout={k_: v_ for k_, v_ in run.plan.items() if k_ in
                                              ("NT", "VW", "LPR", "KPG", "TB", "vec", "NW",
                                               "BC", "STG")})
                elif impl == "torch_sdpa":
                    if page:
                        continue
                    F = torch.nn.functional
                    gqa = H != Hk
                    # a ragged batch: SDPA has no per-sequence lengths; it attends over the
                    # longest, with a boolean mask hiding each sequence's unused rows
                    mask = None if lens is None else (
                        torch.arange(N_kv, device="cuda")[None, None, None, :]
                        < torch.tensor(lens, device="cuda")[:, None, None, None])
                    if mask is not None:
                        row["sdpa_mask"] = "padding"

                    kw = dict(scale=scale, enable_gqa=gqa)
                    if mask is not None:
                        kw["attn_mask"] = mask

                    def fn(i):
                        q, k, v, _ = sets[i]
                        return F.scaled_dot_product_attention(q, k, v, **kw)
                    ms, mn = self.timer(fn, copies)
                    if o_flash is not None:
                        diff = (fn(0).float() - o_flash).abs().max().item()
                        row["max_abs_diff_vs_flashsim"] = _finite(diff)
                    row.update(num_splits=None)
                elif impl == "flash_attn":
                    if self.fa is None or lens is not None:
                        continue

                    def fn(i):
                        q, k, v, tab = sets[i]
                        qf = q.transpose(1, 2)
                        if tab is None:
                            return self.fa(qf, k.transpose(1, 2), v.transpose(1, 2),
                                           softmax_scale=scale)
                        seqlens = torch.full((batch,), N_kv, dtype=torch.int32, device="cuda")
                        return self.fa(qf, k, v, cache_seqlens=seqlens, block_table=tab,
                                       softmax_scale=scale)
                    ms, mn = self.timer(fn, copies)
                    row.update(num_splits=None)
                row.update(status="ok", ms_median=ms, ms_min=mn, gbps=dbytes / ms / 1e6)
                self.w.row("decode_bench", **row)
                print(f"  {impl:10s} b={batch:<3d} {attn} d={d:<3d} N_kv={N_kv:<6d} "
                      f"page={page} S={row.get('num_splits')}: {ms:.4f} ms "
                      f"{dbytes / ms / 1e6:7.0f} GB/s", flush=True)
            except Exception as e:
                self.w.row("decode_bench", **row, status="error",
                           error=f"{type(e).__name__}: {e}"[:400])
                print(f"  {impl} {base}: ERROR {type(e).__name__}: {e}", flush=True)
                torch.cuda.empty_cache()
        sets.clear()


def run(out, *, budget_s=BUDGET_S, reps=MIN_REPS, quick=False, checks=True,
        sweep=True, main="auto") -> int:
    """Parts (a) (unless not `checks`), (b), (c) (unless not `sweep`) into `out`, within
    `budget_s` seconds; impl "flashsim" runs gpu.decode's main kernel `main` (auto, flat,
    tiled or tc; its rows name the one that ran). Exit status: 0, or 1 when a check failed.
    Needs torch + a GPU (the caller checks: analysis.bench.gpu_problem)."""
    from analysis.bench import versions
    import torch
    from analysis import results as R
    t0 = time.monotonic()
    vers = versions()
    vers["numba-cuda"] = vers.get("numba_cuda")
    base = dict(run_id=R.new_run_id("decode_bench"), device=torch.cuda.get_device_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                commit=os.environ.get("FLASHSIM_COMMIT") or R.current_commit(),
                versions=vers)
    w = Writer(out, base)
    print(f"decode_bench: {base['device']}, run {base['run_id']}, rows -> {out}", flush=True)
    ok = True
    if checks:
        print("(a) checks", flush=True)
        ok = run_checks(w, quick)
    bench = Bench(w, reps, main)
    print(f"(b) timings ({time.monotonic() - t0:.0f} s so far)", flush=True)
    # (batch, attn, d, N_kv, page, lens): uniform batches, then ragged ones (d = 128)
    points = [(b, attn, d, n, page, None) for d in HEAD_DIMS for attn in ATTN
              for page in (PAGES if d != 64 else PAGES_D64) for b in BATCHES for n in KV_LENS]
    points += [(b, attn, 128, n, page, ragged_lengths(b, n)) for b, n in RAGGED
               for attn in ATTN for page in PAGES]
    if quick:   # one point of each kind the goal names (batch >= 8 at 16K; batch 1)
        points = [(8, a, 128, 16384, page, None) for a in ATTN for page in (None,)] + \
                 [(8, "gqa", 128, 16384, page, None) for page in (16, PAGE)] + \
                 [(1, "gqa", 128, 131072, None, None), (64, "mha", 64, 16384, None, None),
                  (8, "gqa", 128, 16384, 16, ragged_lengths(8, 16384))]
    # the smallest points first within the budget: sort by cache size so that a run cut
    # by the budget loses the largest points, not a whole series
    points.sort(key=lambda x: x[0] * ATTN[x[1]][1] * x[2] * x[3])
    for i, (b, attn, d, n, page, lens) in enumerate(points):
        if time.monotonic() - t0 > 0.7 * budget_s:
            for (b2, a2, d2, n2, p2, l2) in points[i:]:
                H, Hk = ATTN[a2]
                w.row("decode_bench", impl="flashsim", dtype="fp16", batch=b2, heads=H,
                      kv_heads=Hk, seq_len_q=1, seq_len_kv=n2, d=d2, paged=p2, attn=a2,
                      ragged=l2 is not None, num_splits=None, status="skipped",
                      reason="time budget")
            print(f"  budget: {len(points) - i} points skipped", flush=True)
            break
        # the tiled kernel (gpu.decode's main kernel before the flat one) beside it at the
        # contiguous batch-8 points, for the ratio in the same run
        impls = ("flashsim", "torch_sdpa", "flash_attn")
        if b == 8 and page is None and lens is None:
            impls += ("flashsim_tiled",)
        bench.point(b, attn, d, n, page, lens=lens, impls=impls)
    if sweep:
        print(f"(c) num_splits sweep ({time.monotonic() - t0:.0f} s so far)", flush=True)
        shapes = SWEEP_SHAPES[:1] if quick else SWEEP_SHAPES
        for name, b, attn, d, n, page in shapes:
            for S in (SWEEP_S[:8] if quick else SWEEP_S):
                if time.monotonic() - t0 > 0.95 * budget_s:
                    print("  budget: sweep stopped", flush=True)
                    break
                if (S - 1) * -(-n // S) >= n:
                    continue
                bench.point(b, attn, d, n, page, num_splits=S, sweep="num_splits",
                            impls=("flashsim",), name=name)
    print(f"done: {w.n} rows in {time.monotonic() - t0:.0f} s; checks "
          f"{'passed' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1

