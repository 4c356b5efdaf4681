"""Shared machinery of the gpu kernels: specialisation, dynamic shared memory, counters.

Everything here is reused by the forward kernels (standard.py, fa1.py, fa2.py) and by the
backward kernels. The pieces:

* `SIM`: True when Numba's CUDA simulator is active (NUMBA_ENABLE_CUDASIM=1).
* `specialisation(name)`: decorator for kernel factories. A factory takes hashable
  compile-time constants (B_r, B_c, d, dtype name, flags...) and returns a `cuda.jit`
  kernel; the decorator caches one kernel per argument tuple and gives its Python
  function a readable `__name__`/`__qualname__` (e.g. ``fa2_fwd_Br64_Bc64_d64_fp32``),
  which Numba puts into the PTX entry name, so `ncu -k regex:fa2_fwd` can find it.
* Dynamic shared memory, the paper's SRAM M: every kernel takes its tiles from ONE
  dynamic buffer whose size in bytes is `iosim.sram_footprint_bytes(...)`. All
  `cuda.shared.array(0, dtype)` declarations in a kernel alias the same bytes (on the
  device and in the simulator), so a kernel declares a float32 view and an input-dtype
  view and slices them. Layout convention: float32 tiles first (offset 0, so always
  4-byte aligned), input-dtype tiles after them (offset `f32_elems * 4 / itemsize`).
* `check_fits(footprint)`: ValueError if a tiling needs more shared memory per block
  than the device allows (naming both numbers).
* `launch(kernel, grid, block, shmem_bytes, *args)`: launches, first opting the kernel
  in to more than 48 KB of dynamic shared memory where needed (real GPU only; the
  simulator ignores shared-memory limits). numba-cuda 0.30.4 has no public API for the
  opt-in (issue 94): we set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES on the
  compiled kernel's CUfunction through the driver (cuFuncSetAttribute). On a GPU a
  launch that repeats an earlier one (same kernel, device, dimensions, argument types)
  skips Numba's dispatcher and passes the flattened arguments to cuda.core directly
  (`FAST_LAUNCH`; FLASHSIM_FAST_LAUNCH=0 turns it off).
* Streams and recording (gpu.api's thin call path): `on_stream(handle)` makes `launch`
  enqueue on a raw CUstream (torch's current stream); `recording()` collects the
  launches of a block; `thin_launch(...)` turns one recorded launch into a `ThinLaunch`
  whose flattened parameters are computed once, data pointers left as named slots.
* Traffic counters (the instrumented build): an int64 device array of shape
  (len(TENSORS), 2), indexed [tensor, READ|WRITE], in ELEMENTS. A kernel compiled with
  count=True keeps per-thread element counts in registers and adds each nonzero one
  with a single `cuda.atomic.add` at the end; compiled with count=False the counting
  code is constant-folded away (the counters argument is then a 1-element dummy).
  `counters_to_ledger` turns the summed counts into an `iosim.Ledger`.
"""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import contextlib
import functools
import math
import os
import threading

import numpy as np
from numba import config, cuda, float32  # noqa: F401  (float32 re-exported for kernels)
from numba import int32, int64, uint16
from numba.cuda import types as nbtypes

from iosim.ledger import TENSOR_ORDER, Ledger
from iosim.problem import BFLOAT16

SIM = bool(config.ENABLE_CUDASIM)

#: Tensor rows of the counters array (same names and order as iosim's ledger).
TENSORS = TENSOR_ORDER
T = {name: i for i, name in enumerate(TENSORS)}
READ, WRITE = 0, 1

#: Numba element types of the storage dtypes on the device (statistics are always
#: float32). bf16 travels as its bits, uint16: Numba has no bfloat16 arithmetic type that
#: the simulator runs too; kernels widen with `loader(dt)` and round with `storer(dt)`.
NB_DTYPE = {"fp32": nbtypes.float32, "fp16": nbtypes.float16, "bf16": nbtypes.uint16}
NP_DTYPE = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
            "bf16": np.dtype(np.uint16)}
#: The dtype callers see for each storage dtype (NumPy's bfloat16 is ml_dtypes').
HOST_DTYPE = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
              "bf16": BFLOAT16}
#: bf16 bits of the NaN the poison fill writes into bf16 outputs (a quiet NaN)
BF16_NAN_BITS = 0x7FC0

#: Default shared memory per block without opt-in, and in the simulator (bytes).
from iosim.launch.tables import DEFAULT_SMEM_BYTES  # noqa: E402

#: Constants for kernels: always float32 so no float64 creeps into the PTX.
NEG_INF = np.float32(-math.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
NAN = np.float32(math.nan)


def default_threads() -> int:
    """Threads per block of the tile kernels: 128 on a GPU; 16 in the simulator, where
    every thread is an OS thread (kernels stride over their work, so any count works)."""
    return 16 if SIM else 128


def dtype_name(dtype) -> str:
    """'fp32', 'fp16' or 'bf16' for a NumPy dtype (float32, float16, ml_dtypes.bfloat16;
    ValueError otherwise)."""
    dt = np.dtype(dtype)
    for name, npdt in HOST_DTYPE.items():
        if dt == npdt:
            return name
    raise ValueError(f"dtype={dt} is not supported; allowed: float32, float16, bfloat16")


# ---------------------------------------------------------------------------------------
# Storage dtype <-> float32 in kernels (bf16 as uint16 bits)
# ---------------------------------------------------------------------------------------
# Bit casts between 32 bits (held in an int64, 0..2^32-1) and float32. On a GPU
# libdevice's __nv_int_as_float / __nv_float_as_int (a register move); the simulator runs
# kernels as Python, where libdevice is a stub, so there NumPy views do it.
if SIM:
    def _u32_as_f32(u):
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)

    def _f32_as_u32(f):
        return int(np.float32(f).view(np.uint32))
else:
    from numba.cuda import libdevice as _libdevice

    def _u32_as_f32(u):             # u: int64 holding 32 bits; int32() keeps the low 32
        return _libdevice.int_as_float(int32(u))

    def _f32_as_u32(f):             # int64 0..2^32-1 (signed: no float64 in mixed sums)
        return int64(_libdevice.float_as_int(f)) & 0xFFFFFFFF
_u32_as_f32 = cuda.jit(device=True, inline=True)(_u32_as_f32)
_f32_as_u32 = cuda.jit(device=True, inline=True)(_f32_as_u32)


@cuda.jit(device=True, inline=True)
def bf16_to_f32(b):
    """float32 of bf16 bits b (uint16): the bits are float32's upper half, exactly."""
    return _u32_as_f32(int64(b) << 16)


@cuda.jit(device=True, inline=True)
def f32_to_bf16(x):
    """bf16 bits (uint16) of float32 x, rounded to nearest, ties to even (as PyTorch and
    ml_dtypes): add 0x7FFF plus the lowest kept bit, drop the low 16 bits; overflow
    rounds to +-inf by itself. NaN stays NaN (quiet, sign kept)."""
    u = _f32_as_u32(x)
    if x != x:
        return uint16(((u >> 16) | 0x40) & 0xFFFF)
    return uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


@cuda.jit(device=True, inline=True)
def _to_f32_float(x):
    return float32(x)


@cuda.jit(device=True, inline=True)
def _store_float(x):
    return x        # the store into an fp16 / fp32 array converts (round to nearest)


def loader(dt: str):
    """Device function ld(x) -> float32 of one stored element of dtype `dt` (a compile-time
    choice: float32(x) for fp32 / fp16, `bf16_to_f32` for bf16 bits)."""
    return bf16_to_f32 if dt == "bf16" else _to_f32_float


def storer(dt: str):
    """Device function st(x) giving what to store for float32 x in an array of dtype `dt`
    (x itself for fp32 / fp16, whose store rounds; `f32_to_bf16` bits for bf16)."""
    return f32_to_bf16 if dt == "bf16" else _store_float


def lane_group_reducer(n: int, op: str):
    """A device function reduce(x): x combined ('sum' or 'max') over an aligned group of n
    lanes of a warp (n a power of two, 1..32), by warp shuffles in an xor butterfly
    (offsets n/2, ..., 1); every lane of the group gets the result. The offsets are
    compile-time constants, so the steps unroll. Hardware only: the simulator has no
    shuffles (callers keep a shared-memory path for it)."""
    if op not in ("sum", "max"):
        raise ValueError(f"op={op!r} is not allowed; allowed: 'sum', 'max'")
    if n < 1 or n > 32 or n & (n - 1):
        raise ValueError(f"n={n} lanes is not allowed; allowed: a power of two in 1..32")
    offs = []
    o = n // 2
    while o >= 1:
        offs.append(o)
        o //= 2
    K = len(offs)
    O0, O1, O2, O3, O4 = (offs + [1] * 5)[:5]
    MAX = op == "max"
    FULL = 0xFFFFFFFF

    @cuda.jit(device=True, inline=True)
    def step(x, o):
        y = cuda.shfl_xor_sync(FULL, x, o)
        return max(x, y) if MAX else x + y

    @cuda.jit(device=True, inline=True)
    def reduce(x):
        if K > 0:
            x = step(x, O0)
        if K > 1:
            x = step(x, O1)
        if K > 2:
            x = step(x, O2)
        if K > 3:
            x = step(x, O3)
        if K > 4:
            x = step(x, O4)
        return x
    return reduce


def kernel_name(prefix: str, **consts) -> str:
    """Readable kernel name, e.g. kernel_name('fa2_fwd', Br=64, Bc=64, d=64, dt='fp32',
    causal=True, count=False) -> 'fa2_fwd_Br64_Bc64_d64_fp32_causal'. Boolean constants
    appear by name when True; other values as name+value, strings bare."""
    parts = [prefix]
    for key, val in consts.items():
        if isinstance(val, (bool, np.bool_)):
            if val:
                parts.append(key)
        elif isinstance(val, str):
            parts.append(val)
        else:
            parts.append(f"{key}{val}")
    return "_".join(parts)


def jit_options(maxreg=0) -> dict:
    """The cuda.jit options of a kernel factory's third return value (`specialisation`):
    a register cap per thread when maxreg > 0 (ptxas spills beyond it), else none."""
    return {"max_registers": maxreg} if maxreg else {}


def specialisation(factory):
    """Cache a kernel factory: one compiled dispatcher per tuple of constants.

    The factory must return ``(py_function, name)`` or ``(py_function, name, jit_options)``
    (e.g. ``{"max_registers": 168}``); we rename the function (so the PTX entry and ncu
    show `name`) and wrap it in `cuda.jit(**jit_options)`.
    """
    @functools.lru_cache(maxsize=None)
    def cached(*consts):
        fn, name, *opts = factory(*consts)
        fn.__name__ = name
        fn.__qualname__ = name
        return cuda.jit(fn, **(opts[0] if opts else {}))

    cached.__doc__ = factory.__doc__
    cached.__name__ = factory.__name__
    return cached


# ---------------------------------------------------------------------------------------
# Shared memory
# ---------------------------------------------------------------------------------------
def device_smem_limit() -> int:
    """Largest dynamic shared memory one block may use on the current device, in bytes
    (the opt-in maximum on a GPU; 48 KB in the simulator, which models none)."""
    if SIM:
        return DEFAULT_SMEM_BYTES
    dev = cuda.get_current_device()
    try:
        return int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    except Exception:  # attribute missing in this driver binding
        return int(dev.MAX_SHARED_MEMORY_PER_BLOCK)


def check_fits(footprint_bytes: int, what: str) -> None:
    """ValueError if `footprint_bytes` exceeds the device's per-block maximum."""
    limit = device_smem_limit()
    if footprint_bytes > limit:
        raise ValueError(
            f"{what} needs {footprint_bytes} bytes of shared memory per block, but this "
            f"device allows at most {limit} bytes per block; choose smaller block_rows/"
            f"block_cols (or a smaller sram_bytes)")


_opted_in: dict = {}
_seen_args: dict = {}


def _args_key(args) -> tuple:
    """A cheap key that determines Numba's argument types (hence which compiled kernel a
    launch picks): each argument's Python type, dtype, ndim and strides (strides fix
    the layout; keying on them is stricter than Numba, never looser)."""
    return tuple((type(a), getattr(a, "dtype", None), getattr(a, "strides", None))
                 for a in args)


def _opt_in(kernel, args, shmem: int) -> None:
    """Allow `kernel` (compiled for `args`) to use `shmem` bytes of dynamic shared memory.

    Finding the compiled kernel types every argument in Python (about 0.3 ms a call,
    measured with cProfile on the H100 machine); a launch with the same kernel, device,
    argument key and at most the bytes already granted skips it."""
    dev_id = cuda.get_current_device().id
    seen = (id(kernel), dev_id, _args_key(args))
    if _seen_args.get(seen, 0) >= shmem:
        return
    compiled = kernel._compile_for_args(*args)
    cufunc = compiled._codelibrary.get_cufunc()
    key = (id(cufunc), int(cufunc.device.id) if hasattr(cufunc, "device") else 0)
    if _opted_in.get(key, 0) >= shmem:
        _seen_args[seen] = _opted_in[key]
        return
    from numba.cuda.cudadrv import driver as drv
    d = drv.driver
    try:  # cuda-python bindings (numba-cuda's default)
        attr = drv.binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    except AttributeError:  # ctypes bindings
        from numba.cuda.cudadrv import enums
        attr = enums.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    errors = []
    # cuKernelSetAttribute first: numba-cuda loads kernels through the library API, and
    # that is what worked on the H100; cuFuncSetAttribute as the fallback
    try:
        dev = cuda.get_current_device().id
        d.cuKernelSetAttribute(attr, int(shmem), cufunc.handle, dev)
    except Exception as exc:
        errors.append(f"cuKernelSetAttribute: {exc!r}")
        try:
            d.cuFuncSetAttribute(cufunc.handle, attr, int(shmem))
        except Exception as exc2:
            errors.append(f"cuFuncSetAttribute: {exc2!r}")
            raise RuntimeError("could not opt in to %d bytes of dynamic shared memory: %s"
                               % (shmem, "; ".join(errors))) from exc2
    _opted_in[key] = int(shmem)
    _seen_args[seen] = int(shmem)


#: Repeat launches skip Numba's dispatcher (see `launch`). FLASHSIM_FAST_LAUNCH=0 turns
#: this off (every launch then goes through `kernel[grid, block, 0, shmem](*args)`).
FAST_LAUNCH = os.environ.get("FLASHSIM_FAST_LAUNCH", "1") != "0"
_prepared: dict = {}
_UNSEEN = object()
#: launches that took the fast path in this process (tests check it is taken)
fast_launches = 0


@contextlib.contextmanager
def fast_launch(enabled: bool):
    """`with fast_launch(False):` runs its body with every launch through Numba's
    dispatcher (True: with the fast repeat launch); FAST_LAUNCH is restored after."""
    global FAST_LAUNCH
    saved, FAST_LAUNCH = FAST_LAUNCH, bool(enabled)
    try:
        yield
    finally:
        FAST_LAUNCH = saved


class _Prepared:
    """What a repeat launch needs: the CUDA kernel, its launch configuration and stream,
    and one packer per argument that flattens it the way Numba's dispatcher does."""
    __slots__ = ("kernel", "config", "stream", "packers", "core_launch")


def _pack_array(a):
    # numba-cuda 0.30's _Kernel._prepare_args passes an Array argument as meminfo,
    # parent, nitems, itemsize, data pointer, shape..., strides in bytes...
    return (0, 0, a.size, a.dtype.itemsize, a.device_ctypes_pointer.value or 0,
            *a.shape, *a.strides)


#: where `_pack_array` puts the data pointer
_PTR_AT = 4


def _packer(ty):
    """A function value -> tuple of launch parameters for Numba type `ty`, or None when
    the fast path does not know the type (then every launch takes Numba's path)."""
    import ctypes
    from numba.core import types
    if isinstance(ty, types.Array):
        return _pack_array
    if isinstance(ty, types.Integer):
        c = getattr(ctypes, f"c_{ty}")
        return lambda v: (c(v),)
    if ty == types.float32:
        return lambda v: (ctypes.c_float(v),)
    if ty == types.float64:
        return lambda v: (ctypes.c_double(v),)
    return None


def _fast_key(kernel, grid, block, shmem_bytes, args):
    """Key of a launch that the fast path may repeat, or None. It holds what fixes the
    compiled overload: each array's dtype, strides and contiguity (Numba types an array
    'C', 'F' or 'A' from its flags and builds 'C' and 'F' kernels with those strides
    assumed) and each scalar's NumPy type (a Python int's Numba type could depend on its
    value: not taken). Other argument kinds, or unhashable dimensions: None."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    if not (isinstance(grid, (int, tuple)) and isinstance(block, (int, tuple))):
        return None
    parts = []
    for a in args:
        if isinstance(a, DeviceNDArray):
            f = a.flags
            parts.append((a.dtype, a.strides, f["C_CONTIGUOUS"], f["F_CONTIGUOUS"]))
        elif isinstance(a, (np.integer, np.floating)):
            parts.append(type(a))
        else:
            return None
    return (id(kernel), cuda.get_current_device().id, grid, block, shmem_bytes,
            tuple(parts))


def _prepare(kernel, grid, block, shmem_bytes, args):
    """A _Prepared for this launch, or None where the fast path cannot repeat it."""
    compiled = kernel._compile_for_args(*args)      # the overload the launch just used
    if getattr(compiled, "debug", False) or getattr(compiled, "cooperative", False):
        return None
    packers = [_packer(t) for t in compiled.argument_types]
    if any(p is None for p in packers):
        return None
    from cuda.core import LaunchConfig
    from cuda.core import launch as core_launch
    from numba.cuda.cudadrv import driver as drv
    conf = kernel[grid, block, 0, shmem_bytes]      # Numba's normalised dimensions
    if getattr(conf, "pre_launch_callbacks", None):
        return None
    p = _Prepared()
    p.kernel = compiled._codelibrary.get_cufunc().kernel
    p.config = LaunchConfig(grid=conf.griddim, block=conf.blockdim, shmem_size=shmem_bytes)
    p.stream = drv._to_core_stream(0)
    p.packers = packers
    p.core_launch = core_launch
    return p


def launch(kernel, grid, block, shmem_bytes: int, *args) -> None:
    """Launch `kernel[grid, block, 0, shmem_bytes](*args)`, opting in above 48 KB.

    On a GPU, a launch repeating an earlier one's kernel, device, dimensions and argument
    types (numba device arrays and NumPy scalars only) skips Numba's dispatcher, which
    types every argument in Python on every call, and hands the flattened arguments
    straight to cuda.core's `launch`, the call Numba's own `_Kernel.launch` ends in. This
    cut the host time of a `gpu.attention` call (results data set, kind `host_time`); tests/test_gpu_launch.py checks both paths give identical results."""
    record = getattr(_tls, "record", None)
    if record is not None:     # a gpu.attention call is building its launch plan
        record.append((kernel, grid, block, shmem_bytes, args))
    if SIM:
        kernel[grid, block, 0, shmem_bytes](*args)
        return
    handle = getattr(_tls, "stream", 0)
    key = _fast_key(kernel, grid, block, shmem_bytes, args) if FAST_LAUNCH else None
    p = _prepared.get(key, _UNSEEN) if key is not None else None
    if p is not None and p is not _UNSEEN:
        global fast_launches
        fast_launches += 1
        flat = []
        for pack, a in zip(p.packers, args):
            flat.extend(pack(a))
        p.core_launch(core_stream(handle) if handle else p.stream, p.config, p.kernel, *flat)
        return
    if shmem_bytes > DEFAULT_SMEM_BYTES:
        _opt_in(kernel, args, shmem_bytes)
    kernel[grid, block, numba_stream(handle) if handle else 0, shmem_bytes](*args)
    if p is _UNSEEN:   # None is stored too: a launch the fast path cannot repeat
        _prepared[key] = _prepare(kernel, grid, block, shmem_bytes, args)


# ---------------------------------------------------------------------------------------
# Streams, launch recording and prepared (thin) launches: what gpu.api's thin call path
# is built from
# ---------------------------------------------------------------------------------------
#: per thread: the stream `launch` enqueues on (`on_stream`) and the list a launch is
#: recorded into (`recording`)
_tls = threading.local()
_core_streams: dict = {}
_numba_streams: dict = {}


def core_stream(handle: int):
    """The cuda.core Stream for a raw CUstream handle (0: the legacy default stream);
    one wrapper per handle, cached (it does not own the stream)."""
    s = _core_streams.get(handle)
    if s is None:
        from numba.cuda.cudadrv import driver as drv
        s = drv.ExperimentalStream.from_handle(int(handle)) if handle else drv._to_core_stream(0)
        _core_streams[handle] = s
    return s


def numba_stream(handle: int):
    """A Numba Stream for a raw CUstream handle made outside Numba (e.g. torch's current
    stream); cached per handle."""
    s = _numba_streams.get(handle)
    if s is None:
        s = cuda.external_stream(int(handle))
        _numba_streams[handle] = s
    return s


@contextlib.contextmanager
def on_stream(handle: int):
    """`with on_stream(h):` every `launch` in this thread enqueues on the raw CUstream
    `h` (0, the default: the legacy default stream, Numba's own); restored after."""
    saved = getattr(_tls, "stream", 0)
    _tls.stream = int(handle or 0)
    try:
        yield
    finally:
        _tls.stream = saved


@contextlib.contextmanager
def recording():
    """`with recording() as rec:` each `launch` in this thread also appends (kernel, grid,
    block, shmem_bytes, args) to the list `rec` (the launches still run)."""
    saved = getattr(_tls, "record", None)
    rec: list = []
    _tls.record = rec
    try:
        yield rec
    finally:
        _tls.record = saved


class ThinLaunch:
    """One recorded launch, ready to repeat with other data pointers.

    slots[i] names the per-call array argument i stands for ('q', 'o', ...; None: a
    constant kept from the recorded launch, e.g. a scalar, the dummy mask or counters).
    On a GPU the flattened kernel parameters (the layout Numba's dispatcher builds, as
    in `launch`'s fast path) are computed once; a call copies that list, writes each
    slot's data pointer into it and hands it to cuda.core's `launch`. Shapes and
    strides are the recorded ones: the caller's plan key guarantees they repeat. In the
    simulator the launch goes through Numba with the slots' arrays substituted."""
    __slots__ = ("kernel", "grid", "block", "shmem", "args", "slots", "prepared", "flat",
                 "subs")

    def go(self, stream, arrays: dict, ptrs: dict) -> None:
        if self.prepared is None:            # the simulator: Numba's launch
            args = [a if s is None else arrays[s] for a, s in zip(self.args, self.slots)]
            self.kernel[self.grid, self.block, 0, self.shmem](*args)
            return
        flat = list(self.flat)
        for pos, slot in self.subs:
            flat[pos] = ptrs[slot]
        p = self.prepared
        p.core_launch(stream, p.config, p.kernel, *flat)


def thin_launch(kernel, grid, block, shmem_bytes, args, slots):
    """A ThinLaunch for a recorded launch, or None where it cannot be repeated this way
    (an argument type the fast path does not know, a debug or cooperative kernel)."""
    t = ThinLaunch()
    t.kernel, t.grid, t.block, t.shmem = kernel, grid, block, shmem_bytes
    # keep the constants only: the recorded call's own arrays must not stay alive
    t.args = tuple(None if s is not None else a for a, s in zip(args, slots))
    t.slots = tuple(slots)
    t.prepared, t.flat, t.subs = None, None, ()
    if SIM:
        return t
    p = _prepare(kernel, grid, block, shmem_bytes, args)
    if p is None:
        return None
    flat, subs = [], []
    for pack, a, slot in zip(p.packers, args, slots):
        part = pack(a)
        if slot is not None:
            if pack is not _pack_array:
                return None
            subs.append((len(flat) + _PTR_AT, slot))
        flat.extend(part)
    t.prepared, t.flat, t.subs = p, tuple(flat), tuple(subs)
    return t


# ---------------------------------------------------------------------------------------
# Device buffers
# ---------------------------------------------------------------------------------------
@cuda.jit
def _fill_kernel(flat, value):
    """flat[:] = value (cast to flat's dtype); grid-stride loop."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for e in range(start, flat.shape[0], step):
        flat[e] = value


def filled(shape, dtype, value):
    """A new device array of `shape`/`dtype` filled with `value` (e.g. NaN poison for
    outputs, so unwritten elements show). On a GPU the fill runs on the device (no host
    copy of N x N buffers); in the simulator a host array is copied. uint16 is bf16's
    storage (NP_DTYPE['bf16']): a uint16 array gets the bf16 bits of `value`."""
    if np.dtype(dtype) == NP_DTYPE["bf16"]:
        value = int(np.array(value, np.float32).astype(BFLOAT16).view(np.uint16))
    if SIM:
        return cuda.to_device(np.full(shape, value, dtype=dtype))
    arr = cuda.device_array(shape, dtype=dtype)
    n = int(np.prod(shape))
    if n:
        blocks = min(4096, -(-n // 256))
        _fill_kernel[blocks, 256](arr.reshape(n), np.float32(value))
    return arr


_DUMMY_COUNTERS: dict = {}


def new_counters(count: bool):
    """Zeroed int64 counters (len(TENSORS), 2) when counting, else a 1x1 dummy (one per
    device, reused: the uncounted kernels never touch it, and a per-call allocation
    would put a synchronous host-to-device copy inside every call)."""
    if count:
        return cuda.to_device(np.zeros((len(TENSORS), 2), dtype=np.int64))
    key = 0 if SIM else cuda.get_current_device().id
    if key not in _DUMMY_COUNTERS:
        _DUMMY_COUNTERS[key] = cuda.to_device(np.zeros((1, 1), dtype=np.int64))
    return _DUMMY_COUNTERS[key]


_DUMMY_MASKS: dict = {}


def dummy_mask():
    """A 1x1 uint8 stand-in for the `mask` argument of kernels compiled without a block
    mask (they never read it); one per device, reused, for the same reason as the
    counters dummy of `new_counters`."""
    key = 0 if SIM else cuda.get_current_device().id
    if key not in _DUMMY_MASKS:
        _DUMMY_MASKS[key] = cuda.to_device(np.ones((1, 1), dtype=np.uint8))
    return _DUMMY_MASKS[key]


def counters_to_dicts(counters) -> tuple[dict, dict]:
    """({tensor: elements read}, {tensor: elements written}) from a counters array."""
    host = counters.copy_to_host() if hasattr(counters, "copy_to_host") else np.asarray(counters)
    reads = {t: int(host[T[t], READ]) for t in TENSORS if host[T[t], READ]}
    writes = {t: int(host[T[t], WRITE]) for t in TENSORS if host[T[t], WRITE]}
    return reads, writes


def counters_to_ledger(counters, algorithm, problem, tiling) -> Ledger:
    """The kernels' own counts (totals over all instances) as an iosim Ledger."""
    reads, writes = counters_to_dicts(counters)
    return Ledger(algorithm, problem, tiling, reads, writes)


__all__ = ["SIM", "TENSORS", "T", "READ", "WRITE", "NB_DTYPE", "NP_DTYPE", "HOST_DTYPE",
           "loader", "storer", "bf16_to_f32", "f32_to_bf16", "NEG_INF", "ZERO",
           "ONE", "NAN", "sees_key", "DEFAULT_SMEM_BYTES", "default_threads", "dtype_name", "kernel_name",
           "jit_options", "specialisation", "device_smem_limit", "check_fits", "launch", "filled",
           "on_stream", "recording", "thin_launch", "core_stream", "numba_stream",
           "new_counters", "dummy_mask", "counters_to_dicts", "counters_to_ledger"]


@cuda.jit(device=True, inline=True)
def add_count(counters, tensor, direction, n):
    """Flush one per-thread element count into counters[tensor, direction] (one atomic)."""
    if n > 0:
        cuda.atomic.add(counters, (tensor, direction), n)


@cuda.jit(device=True, inline=True)
def sees_key(mask, i, row, T_c, B_c, causal, has_mask):
    """Whether query `row` (of query block i) may attend at least one key: True unless a
    block mask hides every tile that holds a key column <= row (causal) or every tile of
    block i. This is the structural test of "the row sees no key" (O = 0, L = -inf); it
    must not be read off the running sum l, which is NaN, not 0, when an input is NaN."""
    if not has_mask:
        return True                                 # causal: key 0 <= row is visible
    for j in range(T_c):
        if causal and j * B_c > row:
            return False
        if mask[i, j] != 0:
            return True
    return False
