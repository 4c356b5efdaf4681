"""`gpu.decode`: decoding attention against a KV cache on the GPU (or in Numba's simulator).

Layout (flashsim's, as iosim.decode and gpu.attention; not flash-attn's
(batch, seqlen, heads, d)):
    q          (batch, heads, N_q, d)           N_q = 1..16 new query rows per sequence
    contiguous k_cache, v_cache (batch, kv_heads, N_alloc, d); rows [0, N_kv) are the cache
    paged      k_cache, v_cache (num_pages, page_size, kv_heads, d) (flash-attn's paged
               layout) and block_table (batch, pages) int32: logical page p of sequence
               b is physical page block_table[b, p]
    k, v       (batch, kv_heads, N_q, d), optional: rows appended to the cache first
    cache_seqlens  an int, or one length per sequence (host, or an int32 device array)
O (batch, heads, N_q, d) in q's dtype; L (batch, heads, N_q) float32 (log-sum-exp).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

import iosim
from iosim.decode import KV_READS, DecodeLedger, DecodeProblem
from iosim.launch import decode as _geometry
from iosim.problem import ConfigError

from .._launch import HOST_DTYPE, NP_DTYPE, READ, SIM, WRITE, check_fits, dtype_name, filled, launch
from .. import _tc
from .._torch_cpu import takes_torch_cpu
from .._io import _kind_of, _output, _return_like, _to_device, _torch_bf16
from . import append as A
from . import flat as Fl
from . import split_kv as K
from . import tc as Tc

#: GPU preset whose SM count the "auto" rule uses where no GPU is present (the simulator)
SIM_PRESET = "H100-SXM"
_DUMMIES: dict = {}
MAIN_KERNELS = _geometry.MAIN_KERNELS


def _check_float(name, x, ndim, dims):
    shape, dt, kind, contig = _kind_of(name, x)
    if len(shape) != ndim:
        raise ValueError(f"{name} has shape {tuple(shape)} (ndim={len(shape)}); expected "
                         f"{ndim} dimensions {dims}")
    if dt not in HOST_DTYPE.values():
        raise ValueError(f"{name} has dtype {dt}; allowed: float16, float32, bfloat16")
    if not contig:
        raise ValueError(f"{name} must be C-contiguous (row-major); make a contiguous copy")
    return tuple(int(s) for s in shape), dt, kind


def _aligned16(x, kind) -> bool:
    if kind == "numpy":
        return True
    if _torch_bf16(x):
        return x.data_ptr() % 16 == 0
    return x.__cuda_array_interface__["data"][0] % 16 == 0


def _dummy(shape, dtype):
    key = (0 if SIM else cuda.get_current_device().id, shape, np.dtype(dtype).str)
    if key not in _DUMMIES:
        _DUMMIES[key] = cuda.to_device(np.zeros(shape, dtype=dtype))
    return _DUMMIES[key]


def _lengths(cache_seqlens, batch, capacity, what, append, N_q, kind):
    """(N_kv or None, per-sequence lengths or None, device int32 array or None) from
    cache_seqlens: None -> the capacity (one N_kv; not with an append); an int without
    an append -> one N_kv, 1..capacity; an int with an append, or batch ints (a list,
    NumPy or device int32 array) -> per-sequence lengths 0..capacity (before the append;
    cache_seqlens[b] + N_q <= capacity when appending). A device array is copied to the
    host once (the model needs the values) and handed to the kernels as it is."""
    allowed = (f"None, an int, or {batch} ints >= 0 (a list, NumPy or device int32 array "
               f"of length batch)")
    if cache_seqlens is None:
        if append:
            raise ValueError("k, v (the rows to append) need cache_seqlens (where they go); "
                             f"allowed: {allowed}")
        return capacity, None, None
    dev = None
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        n = int(cache_seqlens)
        if not append:
            if not 1 <= n <= capacity:
                raise ValueError(f"cache_seqlens={n} is not allowed; allowed: 1..{capacity} "
                                 f"({what}), or per-sequence lengths 0..{capacity}")
            return n, None, None
        vals = np.full(batch, n, dtype=np.int64)
    elif isinstance(cache_seqlens, (list, tuple, np.ndarray)):
        vals = np.asarray(cache_seqlens)
        if vals.ndim != 1 or vals.shape[0] != batch or (
                vals.size and not np.issubdtype(vals.dtype, np.integer)):
            raise ValueError(f"cache_seqlens={cache_seqlens!r} is not allowed; allowed: {allowed}")
    else:
        shape, dt, dkind, contig = _kind_of("cache_seqlens", cache_seqlens)
        if tuple(shape) != (batch,) or dt != np.dtype(np.int32) or not contig:
            raise ValueError(f"cache_seqlens has shape {tuple(shape)} and dtype {dt}; allowed: "
                             f"a C-contiguous int32 device array (batch={batch},)")
        if kind == "numpy":
            raise ValueError("cache_seqlens must be a NumPy array (or an int / list) when q "
                             "is, a device array or host values when q is a device array")
        dev = _to_device(cache_seqlens, dkind)
        vals = dev.copy_to_host().astype(np.int64)      # once: the model needs the values
    add = N_q if append else 0
    for b, n in enumerate(vals.tolist()):
        if n < 0 or n + add > capacity:
            if append and n >= 0:
                raise ValueError(f"cache_seqlens[{b}]={n} + N_q={N_q} new rows overflow the "
                                 f"cache ({what}); allowed: cache_seqlens[b] + N_q <= {capacity}")
            raise ValueError(f"cache_seqlens[{b}]={n} is not allowed; allowed: 0..{capacity} "
                             f"({what})")
    return None, tuple(int(n) for n in vals.tolist()), dev


def main_kernel(problem: DecodeProblem, kv_reads: str, main: str = "auto",
                vec: bool = True) -> str:
    """iosim.launch.decode.main_kernel for this build (the simulator's or a GPU's)."""
    return _geometry.main_kernel(problem, kv_reads, main, vec, sim=SIM)


def choose_kv_reads(problem: DecodeProblem, kv_reads: str = "auto", main: str = "auto") -> str:
    """iosim.launch.decode.choose_kv_reads for this build."""
    return _geometry.choose_kv_reads(problem, kv_reads, main, sim=SIM)


def auto_num_splits(problem: DecodeProblem, kv_reads: str, main: str = "flat"):
    """iosim.choose_num_splits for this GPU's SM count (the SIM_PRESET's in the simulator)
    and the main kernel's target blocks an SM (iosim.launch.decode.ctas_per_sm)."""
    if SIM:
        sms = iosim.get_hardware(SIM_PRESET).sm_count
    else:
        sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return _geometry.auto_num_splits(problem, sms, kv_reads, main)


@takes_torch_cpu
def decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, k=None, v=None,
           num_splits="auto", kv_reads="auto", scale=None, causal=True,
           count_traffic=False, return_stats=False, main="auto"):
    """Decoding attention O = softmax(scale Q K^T + mask) V against a KV cache.

    q: (batch, heads, N_q, d), N_q in 1..16. k_cache, v_cache: (batch, kv_heads, N_alloc,
    d), or with block_table (batch, pages) int32: (num_pages, page_size, kv_heads, d)
    pages (a NumPy block_table is range-checked over the pages each sequence uses; a
    device one is used as given). kv_heads divides heads (query head h reads K/V head
    h // (heads // kv_heads)).
    float16, float32 or bfloat16 (ml_dtypes / torch; K/V loaded element by element, not
    16 bytes at a time), all the same, C-contiguous; d / (16 / itemsize) a power of two
    on a GPU (16, 32, 64, 128, 256). NumPy in -> NumPy out; device arrays (numba, or
    __cuda_array_interface__ such as torch; not in the simulator) -> the same kind out.
    cache_seqlens: the cache length(s) before any append. None: every sequence holds
        N_alloc rows (pages x page_size when paged). An int: the same length N_kv for
        every sequence (1..capacity; the model's one N_kv). batch ints (a list, a NumPy
        array, or an int32 device array (batch,) when q is a device array): one length
        per sequence, 0..capacity (a ragged batch: iosim.decode's cache_seqlens). A
        device array is read by the kernels on the device; it is also copied to the host
        once per call, since the model (the ledger, num_splits) needs the values.
    k, v: optional new K/V rows (batch, kv_heads, N_q, d), flash_attn_with_kvcache's
        k= / v=: written into the cache at rows [cache_seqlens[b], cache_seqlens[b] + N_q)
        (contiguous, or the pages the block table names) by a separate append kernel
        launched first (flash-attn fuses it), then the attention runs over
        cache_seqlens[b] + N_q rows. Needs cache_seqlens; an append past the capacity is
        refused. The cache is updated in place (a NumPy cache is copied back after the
        call); cache_seqlens is left as it is.
    num_splits: S, "auto" / None (iosim.choose_num_splits for this GPU's SM count), or an
        int (one N_kv: every split non-empty; per-sequence lengths: any S >= 1, a block
        with an empty chunk reads nothing). S = 1 runs the fa2_decode schedule (one
        kernel, writes O and L); S > 1 the split_kv schedule (main kernel writes Opart,
        Lpart in float32, then the combine kernel).
    kv_reads: "per_query_head" (a block per query head, each reading its group's K/V),
        "per_group" (a block per K/V head serving its G query heads, K/V read once), or
        "auto" (default; `choose_kv_reads`): per_group on grouped heads where the
        tensor-core or the flat kernel takes the group's rows, else per_query_head. The
        ledger names the one run.
    scale: default 1 / sqrt(d), finite in float32. causal: True (default) masks
        bottom-right (new row r of sequence b sees cache rows c <= n_b - N_q + r, n_b its
        length after any append); False: every new row sees the whole cache. Counts do
        not depend on it (no K/V block is skipped). A row that sees no key gets O = 0,
        L = -inf.
    count_traffic: run the instrumented build and return its own counts as an
        iosim.decode.DecodeLedger (equal to decode_closed_form(schedule, problem,
        num_splits=S, kv_reads=...)).
    main: the main kernel, "auto" (default: tc where it applies, else flat, else tiled;
        iosim.launch.decode.main_kernel), "flat", "tiled" or "tc"
        (DecodeLauncher's `main`): the same schedule and counts, arranged differently
        inside a block.
    Returns O; (O, L) with return_stats; (O, ledger) with count_traffic; (O, L, ledger).
    """
    (B, H, N_q, d), dt, kind = _check_float("q", q, 4, "(batch, heads, N_q, d)")
    _geometry.check_main(main)
    paged = block_table is not None
    dims = "(num_pages, page_size, kv_heads, d)" if paged else "(batch, kv_heads, N_alloc, d)"
    ks, dtk, kindk = _check_float("k_cache", k_cache, 4, dims)
    vs, dtv, kindv = _check_float("v_cache", v_cache, 4, dims)
    if vs != ks:
        raise ValueError(f"v_cache has shape {vs}; it must equal k_cache's {ks}")
    if dtk != dt or dtv != dt:
        raise ValueError(f"q, k_cache, v_cache dtypes are {dt}, {dtk}, {dtv}; they must be "
                         f"the same")
    if len({kind == "numpy", kindk == "numpy", kindv == "numpy"}) != 1:
        raise ValueError("q, k_cache, v_cache must all be NumPy arrays or all device arrays")
    Hk, dk = (ks[2], ks[3]) if paged else (ks[1], ks[3])
    append = k is not None or v is not None
    if append:
        if k is None or v is None:
            raise ValueError(f"{'k' if k is None else 'v'}=None with "
                             f"{'v' if k is None else 'k'} given; allowed: both (the rows to "
                             f"append) or neither")
        for name, x in (("k", k), ("v", v)):
            xs, xdt, xkind = _check_float(name, x, 4, "(batch, kv_heads, N_q, d)")
            if xs != (B, Hk, N_q, dk) or xdt != dt or (xkind == "numpy") != (kind == "numpy"):
                raise ValueError(f"{name} has shape {xs} and dtype {xdt}; allowed: "
                                 f"{(B, Hk, N_q, dk)} (batch, kv_heads, N_q, d) in {dt}, the "
                                 f"same kind of array as q")
    if paged:
        n_pages, P = ks[0], ks[1]
        tshape, tdt, tkind, tcontig = _kind_of("block_table", block_table)
        if len(tshape) != 2 or tshape[0] != B or tdt != np.dtype(np.int32) or not tcontig:
            raise ValueError(f"block_table has shape {tuple(tshape)} and dtype {tdt}; allowed: "
                             f"a C-contiguous int32 array (batch={B}, pages)")
        if (tkind == "numpy") != (kind == "numpy"):
            raise ValueError("block_table must be a NumPy array when q is, a device array "
                             "when q is")
        capacity = int(tshape[1]) * P
        what = f"block_table's {tshape[1]} pages x page_size {P}"
    else:
        Bk, _, N_alloc, _ = ks
        if Bk != B:
            raise ValueError(f"k_cache has batch {Bk}; it must equal q's batch {B}")
        capacity, what, P = N_alloc, f"k_cache holds {N_alloc} rows", None
    N_kv, lens, dev_lens = _lengths(cache_seqlens, B, capacity, what, append, N_q, kind)
    if paged and tkind == "numpy":
        seen = [N_kv] * B if lens is None else [n + (N_q if append else 0) for n in lens]
        table = np.asarray(block_table)
        for b, n in enumerate(seen):
            used = table[b, :-(-n // P)]
            if used.size and (used.min() < 0 or used.max() >= n_pages):
                bad = int(used.min()) if used.min() < 0 else int(used.max())
                raise ValueError(f"block_table holds page {bad}; allowed: 0..{n_pages - 1} "
                                 f"(k_cache has {n_pages} pages)")
    if dk != d:
        raise ValueError(f"k_cache has head dim {dk}; it must equal q's d={d}")
    if H % Hk:
        raise ValueError(f"k_cache has kv_heads={Hk}, which must divide q's heads={H}")
    if not isinstance(kv_reads, str) or kv_reads not in KV_READS + ("auto",):
        raise ValueError(f"kv_reads={kv_reads!r} is not known; allowed: auto, "
                         f"{', '.join(KV_READS)}")
    if causal not in (True, False):
        raise ValueError(f"causal={causal!r} is not allowed; allowed: True, False")
    dname = dtype_name(dt)
    try:
        problem = DecodeProblem(N_kv=N_kv, d=d, batch=B, heads=H, kv_heads=Hk, N_q=N_q,
                                dtype=dname, page_size=P, cache_seqlens=lens, append=append)
    except ConfigError as e:
        raise ValueError(f"q has N_q={N_q} new rows: {e}") from None
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: a number") from None
    if not np.isfinite(scale) or abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"scale={scale!r} is not allowed; allowed: numbers finite in float32")
    kv_reads = choose_kv_reads(problem, kv_reads, main)
    if num_splits is None or (isinstance(num_splits, str) and num_splits == "auto"):
        S = auto_num_splits(problem, kv_reads, main_kernel(problem, kv_reads, main)).num_splits
    elif isinstance(num_splits, str):
        raise ValueError(f"num_splits={num_splits!r} is not allowed; allowed: 'auto', None, "
                         f"or a positive integer leaving no split empty")
    else:
        S = problem.splits(num_splits)
    vec_ok = all(_aligned16(x, kd) for x, kd in ((k_cache, kindk), (v_cache, kindv)))
    run = DecodeLauncher(problem, S, kv_reads=kv_reads, causal=causal,
                         count=bool(count_traffic), vec=vec_ok, main=main)
    qd, kd, vd = (_to_device(x, kind) for x in (q, k_cache, v_cache))
    if paged:
        td = cuda.to_device(np.ascontiguousarray(block_table)) if kind == "numpy" else \
            _to_device(block_table, "numba" if hasattr(block_table, "copy_to_host") else "cai")
    else:
        td = None
    news = tuple(_to_device(x, kind) for x in (k, v)) if append else (None, None)
    npdt = NP_DTYPE[dname]
    o_obj, o4 = _output((B, H, N_q, d), npdt, kind, q)
    L_obj, L3 = _output((B, H, N_q), np.dtype(np.float32), kind, q)
    opart, lpart = run.partials()     # NaN-poisoned: an unwritten partial shows in O
    counters = run.new_counters()
    run(qd, kd, vd, td, o4, L3, opart, lpart, counters, scale, cache_seqlens=dev_lens,
        k_new=news[0], v_new=news[1])
    if append and kind == "numpy":    # the cache is updated in place: copy it back
        for dev, host in ((kd, k_cache), (vd, v_cache)):
            dev.copy_to_host(host.view(NP_DTYPE["bf16"]) if dname == "bf16" else host)
    O = o_obj if o_obj is not None else _return_like(o4, kind, q)
    out = [O]
    if return_stats:
        out.append(L_obj if L_obj is not None else _return_like(L3, kind, q))
    if count_traffic:
        out.append(run.ledger(counters))
    return out[0] if len(out) == 1 else tuple(out)


class DecodeLauncher:
    """The launches of one decode configuration, checked once, repeatable on preallocated
    arrays (what `decode` runs; benchmarks time `__call__` alone).

    problem: iosim.decode.DecodeProblem (one N_kv, or per-sequence cache_seqlens, with or
    without an append); num_splits: S (1: fa2_decode, one kernel; > 1: split_kv, main
    kernel + combine); kv_reads, causal as in `decode`; count: the instrumented build;
    vec: 16-byte K/V loads (the caches must be 16-byte aligned); lanes_per_row: the
    simulator only, split_kv.plan's test of the GPU lane layout (the tiled kernel).
    main: the main kernel: "flat" (gpu.decode.flat: each lane group streams its own key
    rows, the fast one), "tiled" (split_kv.decode_kernel: the block's tile loop with
    three barriers a tile), "tc" (gpu.decode.tc: the group's rows as one mma tile, K/V
    through each warp's cp.async pipeline; a GPU, fp16 / bf16, d a multiple of 16 up to
    128, at most 16 rows a block), or "auto": flat wherever its plan applies (every head
    dim the tiled kernel takes, up to flat.MAX_ROW_REGS query rows x lane columns), else
    tiled. All move the same bytes: the same ledger, counted the same way.
    tc_layout: the tensor-core kernel's warps / block_keys / stages (benchmarks;
    iosim.launch.decode.tc_plan).
    Attributes: main ("flat", "tiled" or "tc"), plan (its layout), schedule, grid, threads,
    smem_bytes,
    kernel (the main kernel, called as kernel[grid, threads, 0, smem_bytes](q, k, v,
    block_table, seqlens, o, L, opart, lpart, scale, H, G, P, counters) with seqlens the
    int32 lengths the attention sees and H, G, P int64: another main kernel with that
    argument order can take its place), combine, append (the append kernel or None),
    seqlens / cache_seqlens (the problem's lengths on the device, int32: the attention's,
    and before the append).
    """

    def __init__(self, problem: DecodeProblem, num_splits: int, *, kv_reads="per_query_head",
                 causal=True, count=False, vec=True, lanes_per_row=None, main="auto",
                 tc_layout=None):
        p = self.problem = problem
        self.S = p.splits(num_splits)
        if kv_reads not in KV_READS:
            raise ValueError(f"kv_reads={kv_reads!r} is not known; allowed: "
                             f"{', '.join(KV_READS)}")
        self.kv_reads, self.causal, self.count = kv_reads, bool(causal), bool(count)
        self.split = self.S > 1
        self.schedule = "split_kv" if self.split else "fa2_decode"
        self.NG = 1 if kv_reads == "per_query_head" else p.group
        NR = self.NG * p.N_q
        _geometry.check_main(main)
        if lanes_per_row is None:
            K.plan(p.d, p.dtype, NR, vec_ok=vec)       # a head dim gpu.decode refuses: its error
            self.main = main_kernel(p, kv_reads, main, vec)
        else:                                          # the tiled kernel's lane-layout test
            self.main = "tiled"
        if self.main == "tc":
            lay = Tc.plan(p.d, p.dtype, NR, vec_ok=vec, **(tc_layout or {}))
        elif self.main == "flat":
            lay = Fl.plan(p.d, p.dtype, NR, vec_ok=vec)
        else:
            lay = K.plan(p.d, p.dtype, NR, vec_ok=vec, lanes_per_row=lanes_per_row)
        self.plan = lay
        check_fits(lay["smem_bytes"], f"gpu.decode with d={p.d}, {NR} query rows a block")
        if self.split:
            self.combine_plan = _geometry.combine_plan(self.S, p.N_q, p.d, sim=SIM)
            check_fits(self.combine_plan["smem_bytes"],
                       f"the combine of num_splits={self.S} x N_q={p.N_q}")
        if self.main == "tc":
            self.kernel = Tc.tc_kernel(p.d, p.dtype, p.N_q, self.NG, self.split, p.paged,
                                       self.causal, self.count, lay["NW"], lay["BC"],
                                       lay["STG"])
        elif self.main == "flat":
            self.kernel = Fl.flat_kernel(p.d, p.dtype, p.N_q, self.NG, self.split, p.paged,
                                         self.causal, self.count, lay["NT"], lay["VW"],
                                         lay["LPR"], lay["KPG"], lay["vec"])
        else:
            self.kernel = K.decode_kernel(p.d, p.dtype, p.N_q, self.NG, self.split, p.paged,
                                          self.causal, self.count, lay["NT"], lay["VW"],
                                          lay["LPR"], lay["KPG"], lay["shfl"], lay["vec"],
                                          lay["red"])
        self.grid = (self.S, p.batch * p.heads // self.NG)
        self.threads, self.smem_bytes = lay["NT"], lay["smem_bytes"]
        self.combine = (K.combine_kernel(p.d, p.dtype, p.N_q, self.count,
                                         self.combine_plan["NT"]) if self.split else None)
        self.seqlens = cuda.to_device(np.asarray(p.seqlens, dtype=np.int32))
        self.append = None
        self.cache_seqlens = self.seqlens
        if p.append:
            self.append_threads = 32 if SIM else 128
            self.append = A.append_kernel(p.d, p.N_q, p.paged, self.count, self.append_threads)
            self.cache_seqlens = cuda.to_device(np.asarray(p.cache_seqlens, dtype=np.int32))
            self._seen = cuda.device_array(p.batch, dtype=np.int32)

    def partials(self):
        """(Opart, Lpart): NaN-filled float32 device arrays (batch, heads, S, N_q[, d]), or
        1-element dummies when S = 1."""
        p = self.problem
        if not self.split:
            return _dummy((1, 1, 1, 1, 1), np.float32), _dummy((1, 1, 1, 1), np.float32)
        return (filled((p.batch, p.heads, self.S, p.N_q, p.d), np.float32, np.nan),
                filled((p.batch, p.heads, self.S, p.N_q), np.float32, np.nan))

    def new_counters(self):
        """Zeroed int64 counters (len(split_kv.COUNTED), 2) when counting, else a dummy."""
        if self.count:
            return cuda.to_device(np.zeros((len(K.COUNTED), 2), dtype=np.int64))
        return _dummy((1, 1), np.int64)

    def __call__(self, q, k, v, block_table, o, L, opart, lpart, counters, scale, *,
                 cache_seqlens=None, k_new=None, v_new=None):
        """Launch on device arrays: q, o (batch, heads, N_q, d); k, v the cache (contiguous
        or pages); block_table int32 (None when contiguous); L (batch, heads, N_q).
        cache_seqlens: int32 device lengths (batch,) before any append (default: the
        problem's, uploaded once); they must hold the values the problem was built with.
        k_new, v_new (batch, kv_heads, N_q, d): the rows to append (appending problems):
        the append kernel writes them into the cache and the lengths the attention sees
        (cache_seqlens + N_q) into a scratch array, then the attention runs."""
        p = self.problem
        if self.main == "tc":     # cp.async moves 16 bytes at a time
            for name, arr in (("q", q), ("k_cache", k), ("v_cache", v)):
                _tc.check_aligned("gpu.decode.tc", name, arr)
        td = block_table if block_table is not None else _dummy((1, 1), np.int32)
        lens = self.cache_seqlens if cache_seqlens is None else cache_seqlens
        if self.append is not None:
            if k_new is None or v_new is None:
                raise ValueError("this launcher appends: k_new and v_new are required")
            launch(self.append, p.batch, self.append_threads, 0, k_new, v_new, k, v, td, lens,
                   self._seen, np.int64(p.page_size or 1), counters)
            lens = self._seen
        launch(self.kernel, self.grid, self.threads, self.smem_bytes, q, k, v, td, lens, o, L,
               opart, lpart, np.float32(scale), np.int64(p.heads), np.int64(p.group),
               np.int64(p.page_size or 1), counters)
        if self.split:
            launch(self.combine, p.batch * p.heads, self.combine_plan["NT"],
                   self.combine_plan["smem_bytes"], opart, lpart, o, L,
                   np.int64(self.S), np.int64(p.heads), counters)

    def ledger(self, counters) -> DecodeLedger:
        """The counts the instrumented launches made, as a DecodeLedger."""
        return counters_to_decode_ledger(counters, self.schedule, self.problem, self.S,
                                         self.kv_reads)


def counters_to_decode_ledger(counters, schedule, problem, num_splits, kv_reads) -> DecodeLedger:
    """The kernels' own counts (problem totals, elements) as an iosim.decode.DecodeLedger."""
    host = counters.copy_to_host() if hasattr(counters, "copy_to_host") else np.asarray(counters)
    reads = {t: int(host[i, READ]) for t, i in K.C.items() if host[i, READ]}
    writes = {t: int(host[i, WRITE]) for t, i in K.C.items() if host[i, WRITE]}
    return DecodeLedger(schedule, problem, num_splits, kv_reads, reads, writes)


__all__ = ["decode", "DecodeLauncher", "auto_num_splits", "counters_to_decode_ledger"]
