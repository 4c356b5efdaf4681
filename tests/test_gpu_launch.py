"""gpu._launch's fast repeat launch (it skips Numba's dispatcher) against Numba's own path.

On a GPU, `launch` hands a repeat launch's flattened arguments straight to cuda.core; a
mistake in that flattening (a pointer, a shape, a stride or a scalar out of place) would
give wrong outputs or wrong counts. Every kernel family therefore runs here twice with
the fast path (the second call takes it) and once without (`_launch.fast_launch(False)`,
what FLASHSIM_FAST_LAUNCH=0 sets for a whole process), and the forward outputs, L and
the instrumented counts must be identical bit for bit (the backward's float32 atomics
make it agree to rounding only). Needs a real GPU (the simulator takes Numba's path).
"""
import numpy as np
import pytest

CASES = [  # (algorithm, dtype, extra kwargs)
    ("fa2", np.float32, {}),                         # register-tiled fa2_fast
    ("fa2", np.float32, {"kernel": "plain"}),        # plain fa2
    ("fa1", np.float32, {}),
    ("standard", np.float32, {}),
    ("fa2", np.float16, {}),                         # tensor-core fa2_tc
    ("fa2", np.float16, {"causal": True, "block_rows": 128, "block_cols": 32}),
]


def _inputs(dtype, N=333, d=64, H=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, H, N, d)).astype(dtype) for _ in range(3)]


def _run(alg, dtype, kw, fast):
    import gpu
    from gpu import _launch
    from numba import cuda
    with _launch.fast_launch(fast):
        q, k, v = (cuda.to_device(x) for x in _inputs(dtype))
        outs = []
        for _ in range(2):       # the second call repeats the first's launches
            res = gpu.attention(q, k, v, algorithm=alg, count_traffic=True,
                                return_stats=alg != "standard", **kw)
            O = res[0].copy_to_host()
            L = res[1].copy_to_host() if alg != "standard" else None
            outs.append((O, L, res[-1]))
        return outs


@pytest.mark.gpu
@pytest.mark.parametrize("alg,dtype,kw", CASES)
def test_fast_launch_matches_numba_launch(alg, dtype, kw):
    from gpu import _launch
    n0 = _launch.fast_launches
    slow = _run(alg, dtype, kw, fast=False)
    assert _launch.fast_launches == n0          # switched off: Numba's path only
    fast = _run(alg, dtype, kw, fast=True)
    assert _launch.fast_launches > n0           # the second call repeated the first's
    for (O, L, led), (O2, L2, led2) in zip(fast, slow + slow[-1:]):
        assert np.isfinite(O).all()
        np.testing.assert_array_equal(O, O2)
        if L is not None:
            np.testing.assert_array_equal(L, L2)
        assert led == led2


@pytest.mark.gpu
def test_fast_launch_backward_matches():
    import gpu
    from gpu import _launch
    from gpu.backward import attention_backward
    from numba import cuda
    q, k, v = (cuda.to_device(x) for x in _inputs(np.float32, N=200))
    do = cuda.to_device(_inputs(np.float32, N=200, seed=1)[0])
    O, L = gpu.attention(q, k, v, return_stats=True)
    got = {}
    n0 = _launch.fast_launches
    for fast in (False, True, True):
        with _launch.fast_launch(fast):
            grads = attention_backward(q, k, v, O, do, L, algorithm="fa2")
        got.setdefault(fast, []).append([g.copy_to_host() for g in grads[:3]])
    assert _launch.fast_launches > n0
    # dQ is summed with float32 atomics in whatever order the blocks run, so two runs
    # differ in the last bits on either path; a misplaced argument would not be close
    for a in got[True]:
        for x, y in zip(a, got[False][0]):
            assert np.isfinite(x).all()
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6 * np.abs(y).max())


def test_packer_types():
    """The parameter packers the fast path builds from Numba's argument types (no GPU)."""
    import ctypes

    from gpu._launch import _pack_array, _packer
    from numba.core import types
    assert _packer(types.Array(types.float16, 3, "C")) is _pack_array
    (c,) = _packer(types.int64)(7)
    assert isinstance(c, ctypes.c_int64) and c.value == 7
    (f,) = _packer(types.float32)(np.float32(0.5))
    assert isinstance(f, ctypes.c_float) and f.value == 0.5
    assert _packer(types.boolean) is None      # unknown: that kernel keeps Numba's path


def test_fast_launch_switch_restores():
    """`fast_launch(enabled)` sets the switch inside its block and restores it after,
    also when the block raises (no GPU)."""
    from gpu import _launch
    before = _launch.FAST_LAUNCH
    with _launch.fast_launch(not before):
        assert _launch.FAST_LAUNCH is (not before)
    assert _launch.FAST_LAUNCH is before
    with pytest.raises(RuntimeError):
        with _launch.fast_launch(not before):
            raise RuntimeError("inside")
    assert _launch.FAST_LAUNCH is before
