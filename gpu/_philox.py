"""Philox-4x32-10 as a Numba CUDA device function: the dropout keep mask on chip.

Bit-identical to iosim.dropout (its docstring has the layout): key = (seed mod 2^32,
seed >> 32), counter = (col // 4, row, z, offset) with z = b * heads + h the instance
(the kernels' blockIdx.y), word col % 4 of the output x; the entry is kept iff
x >= ceil(p 2^32) (= u >= p for u = x 2^-32). Arithmetic is on uint64 values holding
uint32s, masked after every operation (the product of two uint32s fits 64 bits), and
every constant is typed uint64 so that Numba never mixes in a signed integer (which
would promote to float64). The simulator runs the same Python code on NumPy scalars.

Kernels take the dropout as four uint64 scalars and one float32 (`kernel_args`):
    key0, key1, offset, thr (the keep threshold), rp = 1 / (1 - p)
and, compiled with their `dropout` flag on, call `keep(key0, key1, offset, z, row, col,
thr)` per entry of P (one Philox evaluation per entry: a thread recomputes the group of
4 it shares with its neighbours; the simulator's tests need correctness, not speed).
"""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import inspect

import numpy as np
from numba import cuda, uint64

from iosim.dropout import (PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, check_dropout_p,
                           check_seed, keep_threshold, seed_key)

M0 = np.uint64(PHILOX_M0)
M1 = np.uint64(PHILOX_M1)
W0 = np.uint64(PHILOX_W0)
W1 = np.uint64(PHILOX_W1)
MASK32 = np.uint64(0xFFFFFFFF)
SH32 = np.uint64(32)
TWO = np.uint64(2)
THREE = np.uint64(3)
#: What a kernel factory's build without dropout passes for key0, key1, offset, thr to
#: the body it shares with its dropout build (never read there: the flag is off).
U64_0 = np.uint64(0)
U64_1 = np.uint64(1)


@cuda.jit(device=True, inline=True)
def philox_word(c0, c1, c2, c3, k0, k1, w):
    """Word w (0..3) of Philox-4x32-10 of counter (c0, c1, c2, c3), key (k0, k1): all
    uint64 holding uint32 values; returns a uint64 holding the uint32 output."""
    for _ in range(10):
        p0 = M0 * c0
        p1 = M1 * c2
        n0 = (p1 >> SH32) ^ c1 ^ k0
        n2 = (p0 >> SH32) ^ c3 ^ k1
        c1 = p1 & MASK32
        c3 = p0 & MASK32
        c0 = n0
        c2 = n2
        k0 = (k0 + W0) & MASK32
        k1 = (k1 + W1) & MASK32
    if w == 0:
        return c0
    if w == 1:
        return c1
    if w == 2:
        return c2
    return c3


@cuda.jit(device=True, inline=True)
def keep(key0, key1, offset, z, row, col, thr):
    """Whether dropout keeps entry (row, col) of instance z (int64 indices >= 0): the
    Philox word col % 4 of counter (col // 4, row, z, offset) is >= thr."""
    uc = uint64(col)
    x = philox_word(uc >> TWO, uint64(row), uint64(z), offset, key0, key1, uc & THREE)
    return x >= thr


@cuda.jit(device=True, inline=True)
def row_bits(key0, key1, offset, z, row, col0, step, n, thr):
    """The keep bits of entries (row, col0 + step b), b < n (n <= 64), of instance z as one
    uint64, bit b set iff kept: a register tile's Z for one row, drawn before the tile's
    unrolled loops (which then test bits and stay free of Philox calls)."""
    bits = U64_0
    for b in range(n):
        if keep(key0, key1, offset, z, row, col0 + step * b, thr):
            bits |= U64_1 << uint64(b)
    return bits


#: the dropout arguments a kernel body takes last (`kernel_args`' order)
DROPOUT_ARGS = ("key0", "key1", "offset", "thr", "rp")


def without_dropout(body):
    """The kernel of a build without dropout, from the `body` it shares with the dropout
    build: `body`'s own arguments less the last five (`DROPOUT_ARGS`), which it passes on
    as zeros and rp = 1 (never read there: the build's `dropout` flag is off), so the build
    keeps the arguments and the code it had before dropout existed. The wrapper's source
    is written out because a Numba CUDA kernel takes no *args."""
    names = list(inspect.signature(body).parameters)
    if tuple(names[-5:]) != DROPOUT_ARGS:
        raise ValueError(f"without_dropout: {body.__name__}'s last arguments are "
                         f"{names[-5:]}, not {list(DROPOUT_ARGS)}")
    args = ", ".join(names[:-5])
    # __name__: the wrapper belongs to body's module, so the kernel's mangled name keeps
    # the gpu package's namespace (gpu::forward::fa2_fast::...); without it Numba names the
    # module "<dynamic>" and CUPTI's trace shows _3cdynamic_3e::..., which
    # analysis.hwmeasure once left out of a pass's time
    ns = {"__name__": body.__module__, "inner": cuda.jit(device=True, inline=True)(body),
          "U64_0": U64_0, "ONE": np.float32(1.0)}
    exec(f"def kernel({args}):\n    inner({args}, U64_0, U64_0, U64_0, U64_0, ONE)\n", ns)
    return ns["kernel"]


def with_args(kernel, extra):
    """The dropout build of a kernel written once for both builds: `kernel`'s own code with
    the parameters `extra` (e.g. ("zm", "rp")) appended, as a new function with the same
    closure values, globals, module and qualified name (so its mangled name keeps the gpu
    package's namespace). `kernel` itself, the build without dropout, reads those names
    only under its factory's `dropout` flag (a closure constant, False there: Numba prunes
    the branches before typing, so they need no definition), and so compiles to the code it
    had before dropout existed: no inlined body and wrapper, whose renamed variables
    reordered the loop-carried registers of the tensor-core kernels' PTX. The source is
    read with inspect and run with exec: the kernel's `def` line must fit one line."""
    import textwrap
    src = textwrap.dedent(inspect.getsource(kernel))
    head, sep, rest = src.partition("):\n")
    if not sep or not head.startswith(f"def {kernel.__name__}(") or "\n" in head:
        raise ValueError(f"with_args: {kernel.__qualname__}'s def line must be one line "
                         f"ending in '):'")
    free = kernel.__code__.co_freevars
    src = (f"def _make({', '.join(free)}):\n"
           + textwrap.indent(f"{head}, {', '.join(extra)}{sep}{rest}", "    ")
           + f"\n    return {kernel.__name__}\n")
    ns = dict(kernel.__globals__)
    exec(compile(src, inspect.getsourcefile(kernel) or "<with_args>", "exec"), ns)
    made = ns["_make"](*[c.cell_contents for c in (kernel.__closure__ or ())])
    made.__qualname__ = kernel.__qualname__
    made.__module__ = kernel.__module__
    return made


def kernel_args(dropout_p: float = 0.0, seed: int = 0, offset: int = 0) -> tuple:
    """(key0, key1, offset, thr, rp): the kernels' dropout arguments (NumPy scalars;
    uint64 x 4, float32). p = 0 gives thr = 0 (keep all) and rp = 1."""
    p = check_dropout_p(dropout_p)
    seed, offset = check_seed(seed, offset)
    k0, k1 = seed_key(seed)
    return (np.uint64(k0), np.uint64(k1), np.uint64(offset), np.uint64(keep_threshold(p)),
            np.float32(1.0 / (1.0 - p)))


__all__ = ["DROPOUT_ARGS", "U64_0", "U64_1", "keep", "kernel_args", "philox_word", "row_bits",
           "with_args", "without_dropout"]
