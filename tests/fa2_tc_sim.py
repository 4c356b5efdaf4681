"""Run gpu.forward.fa2_tc's Numba kernel in the CUDA simulator, with its C++ pieces emulated.

The same emulation as tests/fa1_tc_sim.py (whose stand-ins this module reuses: per-lane
fragment layouts of gpu/mma.cuh, cp.async timed adversarially, warp shuffles and
syncwarp given to the simulator's fake `cuda` module), plus what the fa2 kernel calls
beyond fa1's: load_q (records where Q_w's rows are; qk then reads them from shared memory,
the same products as holding the fragments), qk (S = Q_w K_j^T with those rows), and the
element copies cp2 / st2 of head dims d % 8 != 0 (plain synchronous loads and stores, as on
the GPU); dynamic shared memory starts as NaN bits (0xFF bytes) instead of the
simulator's zeros, so a padded column left unzeroed shows. fp16 and bf16 (roundings of P
and O to the element type included). What is checked in the simulator is the kernel's own Python: the
padded head dims (the zeroed columns, which columns are loaded and stored, the element
copies), the schedule, the counts, the masking and the online softmax; the tensor-core
code itself only on a GPU.

Use: `with emulated(): O, L, counters = run_sim(q, k, v, ...)` (simulator only).
"""
from __future__ import annotations

import numpy as np

import fa1_tc_sim as fa1sim


def make_externs(d, B_c, MT=1, dt="fp16"):
    """Python stand-ins for fa2_tc.externs(d, B_c, MT, dt) (d: the padded head dim)."""
    X = fa1sim.make_externs(d, B_c, MT, dt)
    qk_smem = X["qk"]

    def load_q(qf, sm, off, stride):
        qf[0] = off                 # where this warp's Q rows start (4-byte words)
        return 0

    def qk(s, qf, sm, off, stride):
        return qk_smem(s, sm, int(qf[0]), stride, off, stride)

    def cp2(smh, soff, gh, goff, valid):
        smh[soff] = gh[goff] if valid else 0
        return 0

    def st2(gh, goff, smh, soff):
        gh[goff] = smh[soff]
        return 0

    return dict(load_q=load_q, qk=qk, qk_smem=qk_smem, pv=X["pv"], store_o=X["store_o"],
                cp16=X["cp16"], st16=X["st16"], cp2=cp2, st2=st2,
                cp_commit=X["cp_commit"], cp_wait1=X["cp_wait1"], cp_wait0=X["cp_wait0"])


def _ptr32(a):
    """As fa1_tc_sim's (4-byte words), for arrays of an odd element count too (odd d: the
    kernel moves them element-wise and never uses these words; the view drops the last)."""
    ary = getattr(a, "_ary", a).reshape(-1)
    return ary[:ary.size - ary.size % 2].view(np.uint32) if ary.itemsize == 2 else \
        fa1sim._ptr32(a)


def _ptr16(a):
    ary = getattr(a, "_ary", a)
    return ary.reshape(-1).view(np.uint16)


def emulated():
    """Within: gpu.forward.fa2_tc's kernels build with the Python stand-ins (simulator),
    dynamic shared memory starting as NaN bits."""
    from gpu.forward import fa2_tc
    return fa1sim.patched([(fa2_tc, "externs", make_externs), (fa2_tc, "ptr", fa1sim._ptr),
                           (fa2_tc, "ptr32", _ptr32), (fa2_tc, "ptr16", _ptr16)],
                          [fa2_tc.fa2_tc_kernel], poison_shared=True)


def run_sim(q, k, v, *, B_r, B_c, MT=1, causal=False, window=(-1, -1), count=True,
            dt="fp16", dropout=None):
    """fa2_tc on 16-bit NumPy q (I, N, d), k, v (I_k, N_k, d) (float16, or uint16 bits for
    dt="bf16") in the simulator (inside `emulated()`): O (NaN-poisoned before the launch),
    L, the counts {tensor: (reads, writes)} (None when not counting). dropout: None or
    (dropout_p, seed, offset), as fa2_tc.run."""
    import _tc_direct as tcd
    from numba import cuda
    from gpu import _launch, _philox
    from gpu.forward import fa2_tc
    from gpu.forward._band import band_args
    I, N, d = q.shape
    N_k = k.shape[1]
    q3, k3, v3 = (cuda.to_device(np.ascontiguousarray(x)) for x in (q, k, v))
    o3 = cuda.to_device(np.full(q.shape, tcd.NAN_BITS[dt], np.uint16).view(q.dtype))
    L2 = cuda.to_device(np.full((I, N), np.nan, np.float32))
    counters = _launch.new_counters(count)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    kern = fa2_tc.get_kernel(B_r, B_c, d, causal, False, count, MT, windowed, dt,
                             bool(dropout and dropout[0] > 0))
    _launch.launch(kern, (-(-N // B_r), I), fa2_tc.threads_per_block(B_r, MT),
                   fa2_tc.layout(B_r, B_c, d)["bytes"], q3, k3, v3, o3, L2,
                   np.float32(fa2_tc.LOG2E / np.sqrt(d)), np.int64(N), np.int64(N_k), lo, hi,
                   np.int64(I), np.int64(I // k.shape[0]), _launch.dummy_mask(), counters,
                   *_philox.kernel_args(*(dropout or ())))
    counts = None
    if count:
        r, w = _launch.counters_to_dicts(counters)
        counts = {t: (r.get(t, 0), w.get(t, 0)) for t in set(r) | set(w)}
    return o3.copy_to_host(), L2.copy_to_host(), counts


# ---------------------------------------------------------------------------------------
# The backward main kernel (gpu.backward.fa2_tc)
# ---------------------------------------------------------------------------------------
_RED_LOCK = __import__("threading").Lock()


def make_bwd_externs(d, B_c, B_r, MT, DN, dt="fp16"):
    """Python stand-ins for gpu.backward.fa2_tc.externs(d, B_c, B_r, MT, DN, dt) (d: the
    padded head dim): the products over B_r query columns are fa1_tc_sim's with B_c = B_r;
    dq is tc_ab_smem_t<TA=true, ACC=false, K=B_c, N=DN, MT=1> (dS^T stored transposed)."""
    F = make_externs(d, B_r, MT, dt)              # qk / qk_smem / pv over B_r columns
    S = fa1sim.make_externs(B_r, B_r, MT, dt)      # store_s: rows of B_r columns

    dec, _enc = fa1sim._codec(dt)

    def dq(c, sm, aoff, astride, boff, bstride, n0):
        _, g, q = fa1sim._lane()
        h = sm.view(np.uint16)
        A = dec(np.stack([h[2 * aoff + kk * astride:2 * aoff + kk * astride + 16]
                          for kk in range(B_c)]))                        # (keys, 16 rows)
        Bm = dec(np.stack([h[2 * boff + kk * bstride + n0:2 * boff + kk * bstride + n0 + DN]
                           for kk in range(B_c)]))                       # (keys, DN)
        for nt in range(DN // 8):
            for e in range(4):
                r = g + 8 * (e >> 1)
                col = 8 * nt + 2 * q + (e & 1)
                c[4 * nt + e] = np.float32(np.dot(A[:, r], Bm[:, col]))
        return 0

    def red2(gp, off, a, b):
        with _RED_LOCK:
            gp[off] += a
            gp[off + 1] += b
        return 0

    return dict(load_a=F["load_q"], qk=F["qk"], qk_smem=F["qk_smem"], pv=F["pv"],
                store_s=S["store_o"], store_o=F["store_o"], dq=dq, cp16=F["cp16"],
                st16=F["st16"], cp2=F["cp2"], st2=F["st2"], red2=red2,
                cp_commit=F["cp_commit"], cp_wait1=F["cp_wait1"], cp_wait0=F["cp_wait0"])


def _ptr_flat(a):
    """As fa1_tc_sim's `ptr`, but a global array (dQacc) flat, as the C++ sees it."""
    ary = getattr(a, "_ary", a)
    return ary.reshape(-1) if ary.ndim > 1 else a


def emulated_backward():
    """Within: gpu.backward.fa2_tc's kernels build with the Python stand-ins (simulator),
    dynamic shared memory starting as NaN bits."""
    from gpu import _tc
    from gpu.backward import fa2_tc
    return fa1sim.patched([(fa2_tc, "externs", make_bwd_externs), (_tc, "ptr", _ptr_flat),
                           (_tc, "ptr32", _ptr32), (_tc, "ptr16", _ptr16)],
                          [fa2_tc.fa2_bwd_tc_kernel], poison_shared=True)


def tc_backward_available(monkeypatch) -> list:
    """Let attention_backward take the tensor-core main kernel in the simulator (run it
    inside `emulated_backward()`): `supports` says yes, alignment (a device-address matter)
    is not checked, and each fa2_tc.run call's keywords are appended to the list returned."""
    from gpu import _tc
    from gpu.backward import fa2_tc
    calls = []
    real = fa2_tc.run
    monkeypatch.setattr(fa2_tc, "supports", lambda *a, **kw: True)
    monkeypatch.setattr(fa2_tc, "run", lambda *a, **kw: (calls.append(kw), real(*a, **kw)))
    monkeypatch.setattr(_tc, "check_aligned", lambda *a, **kw: None)
    return calls


def run_bwd_sim(q, k, v, do, L, D, *, B_r, B_c, causal=False, window=(-1, -1), MT=1,
                count=True, dt="fp16", DN=None, block_mask=None, dropout=None):
    """The backward main kernel on 16-bit NumPy q, do (I, N, d), k, v (I_k, N_k, d; I a
    multiple of I_k: consecutive query heads share a K/V head; float16, or uint16 bits for
    dt="bf16"), L, D (I, N) float32, in the simulator (inside `emulated_backward()`), with
    the band of causal / window (gpu.forward._band): (dQ (the float32 accumulator), dK, dV
    per query head (I, N_k, d), NaN-poisoned before the launch, counts or None).
    block_mask: bool (T_r, T_c) or None. dropout: None or the forward's (dropout_p, seed,
    offset)."""
    import _tc_direct as tcd
    from numba import cuda
    from gpu import _launch, _philox
    from gpu.backward import fa2_tc
    from gpu.forward._band import band_args
    I, N, d = q.shape
    N_k = k.shape[1]
    dev = lambda x: cuda.to_device(np.ascontiguousarray(x))
    acc = dev(np.zeros(q.shape, np.float32))
    poison = lambda: dev(np.full((I, N_k, d), tcd.NAN_BITS[dt], np.uint16).view(q.dtype))
    dk, dv = poison(), poison()
    counters = tcd.backward_counters(count)
    windowed, lo, hi = band_args(N, N_k, causal, window)
    kern = fa2_tc.get_kernel(B_r, B_c, d, causal, block_mask is not None, count, MT, DN=DN,
                             dt=dt, window=windowed, dropout=bool(dropout and dropout[0] > 0))
    mk = (_launch.dummy_mask() if block_mask is None else
          dev(np.asarray(block_mask, np.uint8)))
    scale = 1.0 / np.sqrt(d)
    _launch.launch(kern, (-(-N_k // B_c), I), 32 * fa2_tc.warps_of(B_c, MT),
                   fa2_tc.layout(B_r, B_c, d)["bytes"], dev(q), dev(k), dev(v), dev(do),
                   dev(L.astype(np.float32)), dev(D.astype(np.float32)), acc, dk, dv,
                   np.float32(scale), np.float32(scale * fa2_tc.LOG2E), np.int64(N),
                   np.int64(N_k), lo, hi, np.int64(I), np.int64(I // k.shape[0]), mk,
                   counters, *_philox.kernel_args(*(dropout or ())))
    return (acc.copy_to_host(), dk.copy_to_host(), dv.copy_to_host(),
            tcd.backward_counts(counters) if count else None)
