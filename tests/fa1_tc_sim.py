"""Run gpu.forward.fa1_tc's Numba kernel in the CUDA simulator, with its C++ pieces emulated.

The simulator cannot run the linked CUDA C++ (mma.sync, ldmatrix, cp.async) nor warp
shuffles, so without a GPU the kernel is only built. This module emulates, in Python, what
each C++ entry point of gpu/forward/fa1_tc.cu does for the calling lane (same fragment
layouts as gpu/mma.cuh: lane = 4 g + q; C fragment element e of column tile nt at row
g + 8 (e >> 1), column 8 nt + 2 q + (e & 1)), with cp.async timed adversarially (the
source read at the issue, the destination poisoned with NaN at the issue and written only
when a wait retires its group: a read before the wait, a copy into a buffer still being
read, or a copy that reads what an earlier tile has not yet written, all show as NaN or a
wrong result), and gives the simulator's fake `cuda` module `shfl_xor_sync` and
`syncwarp` (a barrier per warp). What is then checked in the simulator is the kernel's own
Python: the schedule (key blocks outer, the next tiles' copies issued during this one, the
waits, a tile held back while one in flight writes what it reads), the counts, the
masking, the online statistics and the non-finite rules. The tensor-core code itself is checked only on a GPU.

Use: `with emulated(): O, l, m, counters = run_sim(q, k, v, ...)` (simulator only).
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

_LOCK = threading.Lock()


def _warp():
    th = threading.current_thread()
    mgr = th._manager
    w = th.thread_id // 32
    with _LOCK:
        st = mgr.__dict__.setdefault("_fa1tc_warps", {})
        if w not in st:
            st[w] = (threading.Barrier(32), {})
    return th.thread_id % 32, st[w]


def _exchange(val):
    """Every lane of the warp gives `val`; each gets the list of all 32 (lane order)."""
    lane, (bar, box) = _warp()
    box[lane] = val
    bar.wait()
    vals = [box[x] for x in range(32)]
    bar.wait()
    return vals


def _shfl_xor_sync(self, mask, val, lanemask):
    lane = threading.current_thread().thread_id % 32
    return _exchange(val)[lane ^ lanemask]


def _syncwarp(self, mask=0xFFFFFFFF):
    _, (bar, _box) = _warp()
    bar.wait()


#: what a copy's destination holds between its issue and its wait (NaN as fp16 and fp32)
POISON = np.uint32(0xFFFFFFFF)


def _pending():
    """This thread's cp.async state: copies not yet committed, committed groups."""
    th = threading.current_thread()
    st = getattr(th, "_fa1tc_cp", None)
    if st is None:
        st = th._fa1tc_cp = {"open": [], "groups": []}
    return st


def _lane():
    lane = threading.current_thread().thread_id % 32
    return lane, lane >> 2, lane & 3


def _codec(dt):
    """(decode, encode) between the 16-bit bits of dt ("fp16", "bf16") held as uint16 and
    float32 (encode rounds to nearest even, as cvt.rn does)."""
    import _tc_direct
    if dt == "fp16":
        return (lambda u: np.asarray(u, np.uint16).view(np.float16).astype(np.float32),
                lambda x: np.asarray(x, np.float32).astype(np.float16).view(np.uint16))
    return (lambda u: (np.asarray(u, np.uint16).astype(np.uint32) << 16).view(np.float32),
            lambda x: _tc_direct.to_dtype(x, "bf16").reshape(np.shape(x)))


def make_externs(d, B_c, MT, dt="fp16"):
    """Python stand-ins for fa1_tc.externs(d, B_c, MT, dt) (same arguments, per lane; dt:
    the 16-bit element type the shared tiles hold and P, O are rounded to)."""
    D, BC = d, B_c
    dec, enc = _codec(dt)

    def qk(s, sm, aoff, astride, boff, bstride):
        _, g, q = _lane()
        h = sm.view(np.uint16)
        for mt in range(MT):
            for nt in range(BC // 8):
                for e in range(4):
                    r = 16 * mt + g + 8 * (e >> 1)
                    c = 8 * nt + 2 * q + (e & 1)
                    a = dec(h[2 * aoff + r * astride:2 * aoff + r * astride + D])
                    b = dec(h[2 * boff + c * bstride:2 * boff + c * bstride + D])
                    s[mt * (BC // 2) + 4 * nt + e] = np.float32(np.dot(a, b))
        return 0

    def pv(o, p, sm, off, stride):
        _, g, q = _lane()
        frags = _exchange(np.array(p[:MT * BC // 2], dtype=np.float32))
        P = np.zeros((16 * MT, BC), np.float32)
        for L, f in enumerate(frags):
            gL, qL = L >> 2, L & 3
            for mt in range(MT):
                for nt in range(BC // 8):
                    for e in range(4):
                        P[16 * mt + gL + 8 * (e >> 1), 8 * nt + 2 * qL + (e & 1)] = \
                            f[mt * (BC // 2) + 4 * nt + e]
        P = dec(enc(P))                                      # P enters in dt
        h = sm.view(np.uint16)
        V = dec(np.stack([h[2 * off + kk * stride:2 * off + kk * stride + D]
                          for kk in range(BC)]))
        for mt in range(MT):
            for nt in range(D // 8):
                for e in range(4):
                    r = 16 * mt + g + 8 * (e >> 1)
                    c = 8 * nt + 2 * q + (e & 1)
                    o[mt * (D // 2) + 4 * nt + e] += np.float32(np.dot(P[r], V[:, c]))
        return 0

    def load_o(o, sm, off, stride):
        _, g, q = _lane()
        h = sm.view(np.uint16)
        for mt in range(MT):
            for nt in range(D // 8):
                for e in range(4):
                    r = 16 * mt + g + 8 * (e >> 1)
                    c = 8 * nt + 2 * q + (e & 1)
                    o[mt * (D // 2) + 4 * nt + e] = dec(h[2 * off + r * stride + c])
        return 0

    def store_o(sm, off, stride, o):
        _, g, q = _lane()
        h = sm.view(np.uint16)
        for mt in range(MT):
            for nt in range(D // 8):
                for e in range(4):
                    r = 16 * mt + g + 8 * (e >> 1)
                    c = 8 * nt + 2 * q + (e & 1)
                    h[2 * off + r * stride + c] = enc(o[mt * (D // 2) + 4 * nt + e])
        return 0

    # cp.async, adversarially timed: the source is read when the copy is issued (the
    # earliest a real copy may read it), the destination is poisoned then (a copy may land
    # at any time after its issue: whoever still reads it sees NaN) and written only when a
    # cp.async.wait_group retires the copy's group (the latest it may land: whoever reads it
    # before waiting sees NaN).
    def _issue(sm, soff, words):
        st = _pending()
        sm[soff:soff + len(words)] = POISON
        st["open"].append((sm, soff, words))
        return 0

    def cp16(sm, soff, gp, goff, valid):
        words = np.array(gp[goff:goff + 4]) if valid else np.zeros(4, np.uint32)
        return _issue(sm, soff, words)

    def cp4(sm, soff, gp, goff, valid):
        words = np.array(gp[goff:goff + 1]) if valid else np.zeros(1, np.uint32)
        return _issue(sm, soff, words)

    def st16(gp, goff, sm, soff):
        gp[goff:goff + 4] = sm[soff:soff + 4]
        return 0

    def zero16(gp, goff):
        gp[goff:goff + 4] = 0
        return 0

    def commit():
        st = _pending()
        st["groups"].append(st["open"])
        st["open"] = []
        return 0

    def wait(n):
        def w():
            st = _pending()
            while len(st["groups"]) > n:
                for sm, soff, words in st["groups"].pop(0):
                    sm[soff:soff + len(words)] = words
            return 0
        return w

    return dict(qk=qk, pv=pv, load_o=load_o, store_o=store_o, cp16=cp16, cp4=cp4,
                st16=st16, zero16=zero16, cp_commit=commit, cp_wait0=wait(0),
                cp_wait1=wait(1), cp_wait2=wait(2))


def _ptr(a):
    return a


def _ptr32(a):
    ary = getattr(a, "_ary", a)
    return ary.reshape(-1).view(np.uint32)


@contextlib.contextmanager
def patched(attrs, caches, poison_shared=False):
    """Within: each (object, name, value) of `attrs` set (restored after), the simulator's
    fake `cuda` module given shfl_xor_sync and syncwarp, the kernel factories' `caches`
    cleared on entry and exit (their kernels rebuild with the stand-ins); poison_shared:
    dynamic shared memory starts as NaN bits (0xFF bytes) instead of zeros."""
    from numba.cuda.simulator import kernelapi
    fake = kernelapi.FakeCUDAModule
    attrs = list(attrs) + [(fake, "shfl_xor_sync", _shfl_xor_sync),
                           (fake, "syncwarp", _syncwarp)]
    if poison_shared:
        shared_init = kernelapi.FakeCUDAShared.__init__

        def poisoned(self, size):
            shared_init(self, size)
            self._dynshared[:] = -1
        attrs.append((kernelapi.FakeCUDAShared, "__init__", poisoned))
    missing = object()
    saved = [(o, n, o.__dict__.get(n, missing) if isinstance(o, type) else getattr(o, n))
             for o, n, _ in attrs]
    for o, n, v in attrs:
        setattr(o, n, v)
    for c in caches:
        c.cache_clear()
    try:
        yield
    finally:
        for o, n, v in saved:
            if v is missing:
                delattr(o, n)
            else:
                setattr(o, n, v)
        for c in caches:
            c.cache_clear()


def emulated():
    """Within: gpu.forward.fa1_tc's kernels build with the Python stand-ins (simulator)."""
    from gpu.forward import fa1_tc
    return patched([(fa1_tc, "externs", make_externs), (fa1_tc, "ptr", _ptr),
                    (fa1_tc, "ptr32", _ptr32)], [fa1_tc.fa1_tc_kernel])


def run_sim(q, k, v, *, B_r, B_c, MT=1, stages=2, causal=False, block_mask=None, count=True,
            scale=None, poison=True, dt="fp16", dropout=None):
    """fa1_tc on (batch, heads, N, d) 16-bit NumPy arrays (float16, or uint16 bits for
    dt="bf16") in the simulator (inside `emulated()`): returns O, l, m (NaN-poisoned before
    the launch) and the counters. dropout: None or (dropout_p, seed, offset): the dropout
    build (gpu._philox)."""
    from numba import cuda
    from gpu import _launch, _philox
    from gpu.forward import fa1_tc
    B, H, N, d = q.shape
    Hk = k.shape[1]
    q3 = cuda.to_device(np.ascontiguousarray(q).reshape(B * H, N, d))
    k3 = cuda.to_device(np.ascontiguousarray(k).reshape(B * Hk, N, d))
    v3 = cuda.to_device(np.ascontiguousarray(v).reshape(B * Hk, N, d))
    fill = np.nan if poison else 0
    if dt == "fp16":
        o3 = cuda.to_device(np.full((B * H, N, d), fill, np.float16))
    else:
        o3 = cuda.to_device(np.full((B * H, N, d), 0x7FC0 if poison else 0, np.uint16))
    l2 = cuda.to_device(np.full((B * H, N), fill, np.float32))
    m2 = cuda.to_device(np.full((B * H, N), fill, np.float32))
    counters = _launch.new_counters(count)
    mask = None
    if block_mask is not None:
        mask = cuda.to_device(np.ascontiguousarray(block_mask, dtype=np.uint8))
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    drop = bool(dropout and dropout[0] > 0)
    kern = fa1_tc.get_kernel(B_r, B_c, d, causal, mask is not None, count, MT, stages, dt,
                             drop)
    mk = mask if mask is not None else _launch.dummy_mask()
    _launch.launch(kern, (B * H,), fa1_tc.threads_per_block(B_r, MT),
                   fa1_tc.layout(B_r, B_c, d, stages)["bytes"], q3, k3, v3, o3, l2, m2,
                   np.float32(scale * fa1_tc.LOG2E), np.int64(N), np.int64(H),
                   np.int64(H // Hk), mk, counters,
                   *_philox.kernel_args(*(dropout if drop else ())))
    return (o3.copy_to_host().reshape(B, H, N, d), l2.copy_to_host().reshape(B, H, N),
            m2.copy_to_host().reshape(B, H, N), counters)
