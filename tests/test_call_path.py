"""gpu.attention's thin call path (gpu.api: Call path) against its full path.

A repeat call whose plan key has a plan skips the checks and launches the recorded
kernels with the new data pointers. These tests check, in the simulator (tiny sizes) and,
marked `gpu`, on hardware: thin and full paths give identical outputs (and a counting
call still takes the full path and counts exactly); the plan key separates what it
must; poison mode still shows elements no kernel writes; bad input on a repeat call
meets the full path's errors; outputs are new on every call.
"""
import numpy as np
import pytest

import iosim

N, D, H = 32, 16, 2
TILES = dict(block_rows=16, block_cols=16)


def _dev(*shape, dtype=np.float32, seed=0):
    from numba import cuda
    rng = np.random.default_rng(seed)
    return cuda.to_device(rng.standard_normal(shape).astype(dtype))


def _qkv(seed=0, n=N, h=H, dtype=np.float32):
    return tuple(_dev(1, h, n, D, dtype=dtype, seed=seed + i) for i in range(3))


def _host(x):
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


@pytest.fixture
def api():
    from gpu import api
    api.clear_plans()
    yield api
    api.clear_plans()


def _full(api, q, k, v, **kw):
    with api.thin_path(False):
        return api.attention(q, k, v, **kw)


@pytest.mark.parametrize("alg,kw", [
    ("fa2", dict(causal=True, return_stats=True)),
    ("fa1", dict(block_mask=np.array([[True, False], [False, False]]))),
])
def test_thin_path_matches_full_path(api, alg, kw):
    """Second and third calls take the thin path; their O (and L) equal the full path's
    bit for bit, also on other inputs of the same key; a counting call takes the full
    path and its ledger is iosim's."""
    q, k, v = _qkv()
    kw = dict(algorithm=alg, **TILES, **kw)
    ref = _full(api, q, k, v, **kw)
    q2, k2, v2 = _qkv(seed=10)
    ref2 = _full(api, q2, k2, v2, **kw)
    n0 = api.thin_calls
    first = api.attention(q, k, v, **kw)           # full path: builds the plan
    assert api.thin_calls == n0
    again = api.attention(q, k, v, **kw)           # thin
    other = api.attention(q2, k2, v2, **kw)        # thin, other data pointers
    assert api.thin_calls == n0 + 2
    as_tuple = (lambda r: r if isinstance(r, tuple) else (r,))
    for got, want in ((first, ref), (again, ref), (other, ref2)):
        for g, w in zip(as_tuple(got), as_tuple(want)):
            assert g.shape == w.shape
            np.testing.assert_array_equal(_host(g), _host(w))
    assert not np.isnan(_host(as_tuple(again)[0])).any()
    assert as_tuple(again)[0] is not as_tuple(first)[0]          # a new output per call
    # the plan launches what the full path launches: same kernels, grids, blocks, bytes
    from gpu import _launch
    with _launch.recording() as rec:
        _full(api, q, k, v, **kw)
    plan = api._PLANS[api._plan_key(q, k, v, api._call_options(**kw))[0]]
    assert [(t.kernel, t.grid, t.block, t.shmem) for t in plan.launches] == \
        [r[:4] for r in rec] and rec
    res = api.attention(q, k, v, count_traffic=True, **kw)
    O, led = res[0], res[-1]
    assert api.thin_calls == n0 + 2
    np.testing.assert_array_equal(_host(O), _host(as_tuple(ref)[0]))
    mask = kw.get("block_mask")
    prob = iosim.Problem(N=N, d=D, heads=H, dtype="fp32", causal=kw.get("causal", False),
                         block_mask=mask)
    assert led.counts() == iosim.closed_form(alg, prob, iosim.Tiling(16, 16)).counts()


def test_thin_path_standard_and_grouped_kv(api):
    """standard (three launches, S and P scratch) and grouped K/V through the thin path."""
    q = _dev(1, 2, 16, D, seed=1)
    k, v = _dev(1, 1, 16, D, seed=2), _dev(1, 1, 16, D, seed=3)
    kw = dict(algorithm="standard", **TILES)
    ref = _host(_full(api, q, k, v, **kw))
    api.attention(q, k, v, **kw)
    n0 = api.thin_calls
    got = _host(api.attention(q, k, v, **kw))
    assert api.thin_calls == n0 + 1
    np.testing.assert_array_equal(got, ref)


def test_plan_key_separates_what_it_must(api):
    """Shape, dtype, strides (layout), every option (causal, tiling, mask presence and
    content, scale, kernel, poison, return_stats) and the torch device are in the key;
    the data pointers are not (except 16-byte alignment)."""
    q, k, v = _qkv()
    base = dict(algorithm="fa2", causal=False, scale=None, block_rows=16, block_cols=16,
                sram_bytes=None, block_mask=None, return_stats=False, threads=None,
                kernel="auto", poison=False)

    def key(q=q, k=k, v=v, **kw):
        o = dict(base, **kw)
        return api._plan_key(q, k, v, api._call_options(**o))[0]
    import inspect
    # every parameter of attention is in the key, by name (a new one joins by itself)
    assert list(api._call_options()) == list(inspect.signature(api.attention).parameters)[3:]
    k0 = key()
    assert k0 == key(*_qkv(seed=5)) and hash(k0) == hash(key(*_qkv(seed=5)))
    m1 = np.ones((2, 2), bool)
    m2 = m1.copy()
    m2[1, 0] = False
    variants = [key(*_qkv(n=48)), key(*_qkv(h=1)), key(*_qkv(dtype=np.float16)),
                key(causal=True), key(block_rows=32), key(block_cols=32), key(block_mask=m1),
                key(block_mask=m2), key(scale=0.5), key(kernel="plain"), key(poison=True),
                key(return_stats=True), key(algorithm="fa1"), key(threads=32),
                key(sram_bytes=4096, block_rows=None, block_cols=None)]
    assert len({k0, *variants}) == len(variants) + 1
    assert key(block_mask=m1) == key(block_mask=m1.copy())
    # layout: a transposed (non-contiguous) view differs from the contiguous array
    t = _dev(1, H, D, N).transpose((0, 1, 3, 2))
    assert t.shape == q.shape and key(q=t) != k0
    # NumPy inputs always take the full path (they are copied anyway)
    assert api._plan_key(*(x.copy_to_host() for x in (q, k, v)),
                         api._call_options(**base)) == (None, None)

    class FakeTorch:       # what _describe_torch reads from a torch tensor
        def __init__(self, device, ptr=4096):
            self.shape, self.dtype, self.device, self.requires_grad = (1, H, N, D), "f32", device, False
            self.ptr = ptr

        def stride(self):
            return (H * N * D, N * D, D, 1)

        def data_ptr(self):
            return self.ptr
    d0 = api._describe_torch(FakeTorch("cuda:0"))
    assert d0 != api._describe_torch(FakeTorch("cuda:1"))
    assert d0[0] == api._describe_torch(FakeTorch("cuda:0", ptr=8192))[0]


def test_alignment_is_in_the_key(api):
    """The tensor-core kernel needs 16-byte aligned inputs: 'auto' may pick another kernel
    for a misaligned one, so alignment is part of the key (pointers are not)."""
    from numba import cuda
    base = np.zeros((1, H, N + 1, D), np.float32)
    a = cuda.to_device(base)
    q, k, v = _qkv()
    opts = api._call_options(algorithm="fa2", block_rows=16, block_cols=16)
    key, ptrs = api._plan_key(q, k, v, opts)
    assert key[6] is True and set(ptrs) == {"q", "k", "v"}
    if not api.SIM:     # the simulator has no device pointers (all 0)
        mis = a.reshape(-1)[4:4 + H * N * D].reshape(1, H, N, D)   # 16 bytes off
        assert api._plan_key(mis, k, v, opts)[0][6] is False


def test_poison_mode_shows_unwritten_elements(api, monkeypatch):
    """poison=True NaN-fills outputs on both paths: with the kernels taken out of a plan
    (thin) or of fa2.run (full), every element stays NaN. Without poison the thin path's
    outputs are exactly what the kernels write (nothing here)."""
    from gpu.forward import fa2
    q, k, v = _qkv()
    kw = dict(algorithm="fa2", return_stats=True, **TILES)
    for poison in (True, False):
        api.attention(q, k, v, poison=poison, **kw)              # builds the plan
    for plan in api._PLANS.values():
        plan.launches = ()                                       # no kernel runs
    O, L = api.attention(q, k, v, poison=True, **kw)
    assert np.isnan(_host(O)).all() and np.isnan(_host(L)).all()
    with api.poison_outputs(False):
        assert api.POISON is False
        O2 = api.attention(q, k, v, **kw)[0]                     # thin, no fill
    assert O2.shape == O.shape
    monkeypatch.setattr(fa2, "run", lambda *a, **kw: None)
    with api.poison_outputs(True):
        O3, L3 = _full(api, q, k, v, kernel="plain", **kw)
    assert np.isnan(_host(O3)).all() and np.isnan(_host(L3)).all()


def test_bad_input_on_a_repeat_call_gets_the_full_checks(api):
    """After a plan exists, a call that differs in any checked way takes the full path
    and raises the same error a first call gets."""
    from numba import cuda
    q, k, v = _qkv()
    kw = dict(algorithm="fa2", **TILES)
    api.attention(q, k, v, **kw)
    api.attention(q, k, v, **kw)               # thin
    n0 = api.thin_calls
    bad = [
        ((q, _dev(1, H, N, D, dtype=np.float16), v), {}, "dtypes"),
        ((q, _dev(1, H, N + 16, D), v), {}, "must be"),
        (tuple(_dev(1, H, N, 257, seed=i) for i in range(3)), {}, "head dimension d=257"),
        ((_dev(H, N, D), k, v), {}, "expected 4 dimensions"),
        ((q, k.copy_to_host(), v), {}, "all be NumPy arrays or all be device arrays"),
        ((q, k, v), dict(scale=float("inf")), "scale=inf"),
        ((q, k, v), dict(kernel="tc"), "kernel='tc' needs float16"),
        ((q, k, v), dict(threads=4096), "threads=4096"),
        ((q, k, v), dict(block_mask=np.ones((3, 3), bool)), "block_mask"),
        ((q, k, v), dict(algorithm="standard", return_stats=True), "return_stats"),
        (("not an array", k, v), {}, "q must be a NumPy array"),
    ]
    for (a, b, c), extra, msg in bad:
        with pytest.raises(ValueError, match=msg):
            api.attention(a, b, c, **{**kw, **extra})
        with pytest.raises(ValueError, match=msg):   # and again: no plan was made for it
            api.attention(a, b, c, **{**kw, **extra})
    assert api.thin_calls == n0
    # a non-contiguous device input (a transposed view)
    t = cuda.to_device(np.zeros((1, H, D, N), np.float32))
    tv = t.transpose((0, 1, 3, 2))
    for _ in range(2):
        with pytest.raises(ValueError, match="C-contiguous"):
            api.attention(tv, k, v, **kw)


def test_tuning_change_drops_plans(api):
    q, k, v = _qkv()
    api.attention(q, k, v, algorithm="fa2", **TILES)
    assert api._PLANS
    api.FA2_TC_MT[(16, 16, D)] = 1
    assert not api._PLANS
    del api.FA2_TC_MT[(16, 16, D)]


def test_deprecated_options_and_counting_never_take_the_thin_path(api):
    q, k, v = _qkv()
    kw = dict(algorithm="fa2", **TILES)
    api.attention(q, k, v, **kw)
    n0 = api.thin_calls
    for _ in range(2):
        with pytest.warns(DeprecationWarning):
            api.attention(q, k, v, fast=False, **kw)
    api.attention(q, k, v, count_traffic=True, **kw)
    assert api.thin_calls == n0


def test_kernel_launcher_matches_attention(api):
    """bench's fa2_kernel: the plan's kernels on preallocated outputs (the same array on
    every launch), other inputs of the same key accepted."""
    q, k, v = _qkv()
    q2, k2, v2 = _qkv(seed=20)
    kw = dict(algorithm="fa2", **TILES)
    launch = api.kernel_launcher(q, k, v, **kw)
    o1 = launch(q, k, v)
    np.testing.assert_array_equal(_host(o1), _host(_full(api, q, k, v, **kw)))
    o2 = launch(q2, k2, v2)
    assert o2 is o1
    np.testing.assert_array_equal(_host(o2), _host(_full(api, q2, k2, v2, **kw)))
    with pytest.raises(ValueError, match="full path"):
        api.kernel_launcher(*(x.copy_to_host() for x in (q, k, v)), **kw)


# ---------------------------------------------------------------------------------------
# On a GPU: every kernel family, torch tensors (current stream), the recorded parameters
# ---------------------------------------------------------------------------------------
GPU_CASES = [  # (algorithm, dtype, extra kwargs)
    ("fa2", np.float16, {}),                                   # tensor cores
    ("fa2", np.float16, {"causal": True, "return_stats": True}),
    ("fa2", np.float32, {}),                                   # fa2_fast
    ("fa2", np.float32, {"kernel": "plain", "causal": True}),
    ("fa1", np.float32, {}),
    ("standard", np.float16, {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("alg,dtype,kw", GPU_CASES)
def test_gpu_thin_path_matches_full_path(alg, dtype, kw):
    from gpu import api
    api.clear_plans()
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((2, 3, 333, 64)).astype(dtype) for _ in range(6)]
    torch = pytest.importorskip("torch")
    sets = [tuple(torch.from_numpy(x).cuda() for x in host[i:i + 3]) for i in (0, 3)]
    from numba import cuda
    nsets = [tuple(cuda.to_device(x) for x in host[i:i + 3]) for i in (0, 3)]
    kw = dict(algorithm=alg, **kw)
    for group, conv in ((sets, lambda t: t.cpu().numpy()), (nsets, lambda a: a.copy_to_host())):
        want = []
        with api.thin_path(False):
            for s in group:
                r = api.attention(*s, **kw)
                want.append([conv(x) for x in (r if isinstance(r, tuple) else (r,))])
        n0 = api.thin_calls
        for rep in range(3):
            for s, w in zip(group, want):
                r = api.attention(*s, **kw)
                got = [conv(x) for x in (r if isinstance(r, tuple) else (r,))]
                for g, ww in zip(got, w):
                    np.testing.assert_array_equal(g, ww)
                    assert np.isfinite(g[..., 0]).any()
        assert api.thin_calls > n0


@pytest.mark.gpu
def test_gpu_thin_path_on_a_torch_side_stream():
    """Kernels and outputs follow torch's current stream: a side stream's result equals
    the default stream's without any synchronisation in between."""
    torch = pytest.importorskip("torch")
    from gpu import api
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, 4, 1024, 64), device="cuda", generator=g, dtype=torch.float16)
               for _ in range(3))
    ref = api.attention(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        outs = [api.attention(q, k, v) for _ in range(3)]
        sums = [o.float().sum() for o in outs]
    torch.cuda.synchronize()
    for o in outs:
        assert torch.equal(o, ref)
    assert all(torch.isfinite(x) for x in sums)


def test_thin_launch_writes_pointers_where_numba_puts_them(monkeypatch):
    """The GPU branch of _launch.ThinLaunch without a GPU: parameters flattened once as
    `launch`'s fast path does (_pack_array per array), then each call's data pointers
    written over the recorded ones, constants (scalars, other arrays) unchanged."""
    import ctypes

    from gpu import _launch

    class Ptr:
        def __init__(self, v):
            self.value = v

    class Arr:        # what _pack_array reads from a Numba device array
        def __init__(self, ptr, shape=(4, 8, 16), dt=np.float16):
            self.shape, self.dtype = shape, np.dtype(dt)
            self.size = int(np.prod(shape))
            self.strides = tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                                 for i in range(len(shape)))
            self.device_ctypes_pointer = Ptr(ptr)

    class Prepared:
        config, kernel = "config", "kernel"

        def __init__(self):
            self.launched = []
            self.core_launch = lambda stream, config, kernel, *flat: self.launched.append(
                (stream, config, kernel, flat))

    from numba.core import types
    p = Prepared()
    p.packers = [_launch._pack_array, _launch._pack_array, _launch._packer(types.float32),
                 _launch._pack_array]
    monkeypatch.setattr(_launch, "SIM", False)
    monkeypatch.setattr(_launch, "_prepare", lambda *a: p)
    q, o, mask = Arr(0x1000), Arr(0x2000), Arr(0x3000, (2, 2), np.uint8)
    args = (q, o, np.float32(0.5), mask)
    t = _launch.thin_launch("kern", (2, 4), 128, 4096, args, ["q", "o", None, None])
    assert t.args[:2] == (None, None) and t.args[3] is mask     # the call's arrays not kept
    t.go("stream", {}, {"q": 0x5000, "o": 0x6000})
    stream, config, kernel, flat = p.launched[-1]
    assert (stream, config, kernel) == ("stream", "config", "kernel")
    want = (*_launch._pack_array(Arr(0x5000)), *_launch._pack_array(Arr(0x6000)), None,
            *_launch._pack_array(mask))
    assert len(flat) == len(want)
    for i, (g, w) in enumerate(zip(flat, want)):
        if w is None:
            assert isinstance(g, ctypes.c_float) and g.value == 0.5
        else:
            assert g == w, i
    # the next call writes its own pointers; the template is not changed by a call
    t.go("stream", {}, {"q": 0x7000, "o": 0x8000})
    assert p.launched[-1][3][_launch._PTR_AT] == 0x7000
    assert t.flat[_launch._PTR_AT] == 0x1000


def test_plan_torch_branch_with_a_stand_in_torch(api, monkeypatch):
    """_Plan's torch branch without torch: outputs from torch.empty (torch.full with NaN
    when poisoning) in the caller's shapes on q's device, their pointers and the inputs'
    handed to every launch, on torch's current stream."""
    from gpu import _launch
    q, k, v = _qkv()
    kw = dict(algorithm="fa2", return_stats=True, **TILES)
    api.attention(q, k, v, **kw)
    (plan,) = [p for p in api._PLANS.values() if p is not api._NO_PLAN]
    made, seen = [], []

    class T:                      # a torch tensor as the plan uses it
        def __init__(self, shape, dtype, device, fill=None):
            self.shape, self.dtype, self.device, self.fill = shape, dtype, device, fill
            self.ptr = 0x10000 * (len(made) + 1)
            made.append(self)

        def data_ptr(self):
            return self.ptr

    class FakeC:
        @staticmethod
        def _cuda_getCurrentRawStream(index):
            return 77 + index

    class FakeTorch:
        float16, float32, _C = "f16", "f32", FakeC

        @staticmethod
        def empty(shape, dtype, device):
            return T(shape, dtype, device)

        @staticmethod
        def full(shape, value, dtype, device):
            return T(shape, dtype, device, fill=value)

    class Dev:
        index = 1

    class Launch:
        def go(self, stream, arrays, ptrs):
            seen.append((stream, dict(ptrs)))
    monkeypatch.setattr(_launch, "core_stream", lambda h: f"stream{h}")
    plan.torch, plan.tdt = FakeTorch, {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
    plan.launches = (Launch(),)
    tq = type("Q", (), {"device": Dev()})()
    for poison in (False, True):
        plan.poison = poison
        made.clear()
        O, L = plan(tq, None, None, {"q": 1, "k": 2, "v": 3})
        assert (O.shape, O.dtype, L.shape, L.dtype) == ((1, H, N, D), "f32", (1, H, N), "f32")
        assert O.device is tq.device and L.device is tq.device
        assert all(np.isnan(t.fill) for t in (O, L)) if poison else O.fill is None
        stream, ptrs = seen[-1]
        assert stream == "stream78"
        assert ptrs == {"q": 1, "k": 2, "v": 3, "o": O.ptr, "L": L.ptr}


def test_no_plan_when_a_run_passes_its_own_view_of_the_call_arrays(api, monkeypatch):
    """A kernel family whose `run` hands the kernel its own view of q (not the object
    gpu.api made) would be replayed with the first call's pointer: the plan is refused
    (the memory overlaps the call's arrays) and repeat calls take the full path."""
    from gpu.forward import fa2
    real = fa2.run

    def run(q3, *a, **kw):
        return real(q3.reshape(q3.shape), *a, **kw)
    monkeypatch.setattr(fa2, "run", run)
    q, k, v = _qkv()
    q2, k2, v2 = _qkv(seed=10)
    kw = dict(algorithm="fa2", kernel="plain", **TILES)
    api.attention(q, k, v, **kw)
    assert list(api._PLANS.values()) == [api._NO_PLAN]
    n0 = api.thin_calls
    got = _host(api.attention(q2, k2, v2, **kw))
    assert api.thin_calls == n0
    monkeypatch.setattr(fa2, "run", real)
    np.testing.assert_array_equal(got, _host(_full(api, q2, k2, v2, **kw)))


def test_numpy_inputs_reach_the_device_with_canonical_strides():
    """A C-contiguous NumPy array may carry any stride on a length-1 axis (x[None, None]
    has 0); Numba's device reshape to the kernels' (instances, N, d) views refused such
    copies on hardware ("operation requires copying"; the simulator's reshape does not
    check). _to_device gives every NumPy input canonical strides."""
    from gpu.api import _to_device
    x = np.arange(24 * 16, dtype=np.float32).reshape(24, 16)[None, None]
    assert x.flags.c_contiguous and x.strides[:2] == (0, 0)
    dev = _to_device(x, "numpy")
    assert dev.shape == x.shape
    assert dev.strides == (24 * 16 * 4, 24 * 16 * 4, 16 * 4, 4)
    np.testing.assert_array_equal(dev.copy_to_host(), x)
