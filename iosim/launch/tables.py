"""The kernels' tile tables: which tiling `gpu.attention` runs by default for each kernel
family and head dim, the fallbacks it tries, the tuned options, as data the model reads
without importing `gpu`.

B_r: query rows per block, B_c: key rows per K/V tile, d: head dim (elements), threads:
threads per block, MT: m-tiles of 16 query rows per warp (tensor-core fa2). Shared
memory in bytes. The tables that tuning changes are `Tunable` dicts: `gpu` registers
(`on_change`) a callback that drops the launch plans built under the old values."""
from __future__ import annotations

from ..problem import MAX_HEAD_DIM, check_dtype
from ..tiling import Tiling, sram_footprint_bytes

#: callbacks run after any change of a `Tunable` table (gpu.api.clear_plans)
_LISTENERS: list = []


def on_change(callback):
    """Run `callback()` after every change of a `Tunable` table; returns callback."""
    _LISTENERS.append(callback)
    return callback


def clear_plans() -> None:
    """Tell the listeners (`on_change`) that a table changed."""
    for f in _LISTENERS:
        f()


def tc_dtypes(module) -> tuple:
    """The storage dtypes a tensor-core kernel module runs: its DTYPES (e.g. ("fp16",
    "bf16")), or ("fp16",) for a module that does not declare them."""
    return tuple(getattr(module, "DTYPES", ("fp16",)))


#: storage dtypes of the register-tiled (fast) kernels; bf16 runs on the plain kernels
#: (and the tensor-core ones whose module lists it in DTYPES)
FAST_DTYPES = ("fp32", "fp16")


class Tunable(dict):
    """A dict of tuning constants (tilings, MT, ...). Any change tells the `on_change`
    listeners: gpu's thin call path drops its launch plans, which were built under the old
    values (analysis.check sets FA2_TC_MT per configuration, for one)."""


def _clearing(name):
    base = getattr(dict, name)

    def method(self, *a, **kw):
        out = base(self, *a, **kw)
        clear_plans()
        return out
    method.__name__ = name
    return method


for _name in ("__setitem__", "__delitem__", "clear", "update", "pop", "popitem", "setdefault",
              "__ior__"):
    setattr(Tunable, _name, _clearing(_name))
del _name


#: Head dims d (elements) `attention` and `attention_backward` take: every integer in
#: 1..iosim.MAX_HEAD_DIM = 256. The plain kernels (fa2, fa1, standard and the plain
#: backward) loop over d and load exactly d elements per row, whatever d is; the fast fp32
#: kernels need d a multiple of 4 with room in their register tiles (`fa2_fast.plan`,
#: `gpu.backward.fa2_fast.plan_error`) and the tensor-core ones a multiple of 16 in
#: 16..128, so kernel='auto' runs the plain kernels for other d.
HEAD_DIMS = tuple(range(1, MAX_HEAD_DIM + 1))
#: square default tiles B tried in order (`plain_default_tiling`, gpu.api's docstring); 8
#: lets every d <= 256 fit 48 KB
DEFAULT_TILES = (64, 32, 16, 8)
#: fa2's default on a GPU: head dim -> (B_r, B_c, threads) of gpu.forward.fa2_fast, fastest fp32
#: variant measured on the H100 at N=4096 (gpu.api's docstring); head dims not
#: listed take the first of FA2_FAST_FALLBACK that the fast kernel supports. d=128 runs
#: 64 x 32 with 256 threads (TC = 16): ptxas -v reports 255 registers and no spills,
#: where 256 x 32 at d=128 (512 threads, 128 registers) spilled 500 bytes a thread
#: into local memory, which multiplied its L2 traffic (Nsight Compute: 6.7x its ledger).
FA2_FAST_TILES = Tunable({64: (256, 32, 512), 128: (64, 32, 256)})
FA2_FAST_FALLBACK = ((256, 32, 512), (128, 64, 256), (128, 64, 128), (64, 64, 256),
                     (64, 64, 128), (32, 32, 128))
#: tuning measured best on the H100 for (B_r, B_c, threads): TC (threads per query row)
#: and maxreg (register cap per thread); see `fa2_fast_options` for the rest
FA2_FAST_TUNED = Tunable({(256, 32, 512): dict(TC=8, maxreg=128, stage=1),
                           (128, 64, 256): dict(TC=8, maxreg=128)})
#: thread counts tried, in order, for the fast kernel when the caller gives a tiling
FA2_FAST_THREADS = (256, 128, 64)
#: standard's fast fp32 kernels (gpu.forward.standard_fast): head dim -> (B_r, B_c, threads)
#: of the default tiling on a GPU; other head dims take the first of
#: STANDARD_FAST_FALLBACK the kernels run. Not yet timed on a GPU
#: (scripts/fp32_fast_gpu.sh sweeps tilings).
STANDARD_FAST_TILES = Tunable({64: (128, 128, 256), 128: (64, 64, 128)})
STANDARD_FAST_FALLBACK = ((128, 128, 256), (128, 64, 256), (64, 64, 128), (64, 64, 64),
                          (32, 32, 64))
#: tuning keywords of gpu.forward.standard_fast.run (stage, maxreg) per (B_r, B_c, threads)
STANDARD_FAST_TUNED = Tunable({})
#: thread counts tried, in order, for the fast standard kernels when the caller gives a
#: tiling but no thread count
STANDARD_FAST_THREADS = (256, 128, 64)
#: fa1's fast fp32 kernel (gpu.forward.fa1_fast), as STANDARD_FAST_*: one block per
#: instance, so a block must fill an SM alone (512 threads, registers capped at 128:
#: `other_fast_options`). Not yet timed on a GPU (scripts/fp32_fast_gpu.sh).
FA1_FAST_TILES = Tunable({64: (128, 128, 512), 128: (64, 64, 256)})
FA1_FAST_FALLBACK = ((128, 128, 512), (128, 64, 512), (64, 64, 256), (64, 64, 128),
                     (32, 32, 128))
FA1_FAST_TUNED = Tunable({})
FA1_FAST_THREADS = (512, 256, 128)
#: fp16 fa2's default on a GPU: head dim -> (B_r, B_c) of gpu.forward.fa2_tc (tensor cores),
#: the fastest tiling without register spills measured on the H100 at N=4096 and 8192
#: (16 heads), without causal masking (FA2_TC_TILES) and with it (FA2_TC_TILES_CAUSAL):
#: the data set's tc_tilings rows (`flashsim results show tc_tilings`; kernel ms at N=4096: d=64
#: 128 x 64 0.284-0.287, causal 64 x 64 0.272-0.279; d=128 64 x 64 0.523-0.527, causal
#: 0.382-0.387). Other head dims take the first of FA2_TC_FALLBACK that fits (not
#: tuned). At d=128, 128 x 32 with MT=2 ran 5% faster (0.499 ms; 1.951 against 2.066
#: at N=8192) but needs 255 registers and spills 72 bytes a thread (104 causal; ptxas
#: -v): not the default; block_rows=128, block_cols=32 selects it.
FA2_TC_TILES = Tunable({64: (128, 64), 128: (64, 64)})
FA2_TC_TILES_CAUSAL = Tunable({64: (64, 64), 128: (64, 64)})
FA2_TC_FALLBACK = ((128, 64), (64, 64), (64, 32))
#: m-tiles of 16 query rows per warp (MT) of gpu.forward.fa2_tc for (B_r, B_c, d); tilings not
#: listed run MT=1. Each K/V fragment then feeds MT products, registers grow with MT and
#: threads = 2 B_r / MT. Listed: large-B_r tilings whose MT=2 build was the one timed
#: (same run: 128 x 32 at d=128 above; 256 x 64 at d=64, 0.290 ms).
FA2_TC_MT: dict = Tunable({(128, 32, 128): 2, (256, 64, 64): 2})


def fa2_tc_mt(B_r: int, B_c: int, d: int) -> int:
    """MT the tensor-core kernel runs (B_r, B_c, d) with: FA2_TC_MT's entry, else 1."""
    return FA2_TC_MT.get((B_r, B_c, d), 1)


#: the values of `gpu.attention`'s kernel= parameter
KERNELS = ("auto", "plain", "fast", "tc")
#: the algorithms with a fast (register-tiled, fp32 math) forward kernel
FAST_ALGORITHMS = ("fa2", "standard", "fa1")
#: dynamic shared memory every CUDA device gives a block without opt-in (bytes): the plain
#: kernels' default tiles fit it
DEFAULT_SMEM_BYTES = 48 * 1024


def plain_default_tiling(algorithm: str, d: int, dtype: str) -> Tiling:
    """The plain kernels' default tiling (`gpu.api.default_tiling` with kernel='plain', and
    where no faster kernel runs): the largest square B_r = B_c = B in `DEFAULT_TILES` whose
    shared-memory footprint (`iosim.sram_footprint_bytes`, bytes) fits DEFAULT_SMEM_BYTES;
    the smallest B when none does."""
    dtype = check_dtype(dtype)
    for B in DEFAULT_TILES:
        if sram_footprint_bytes(algorithm, B, B, d, dtype) <= DEFAULT_SMEM_BYTES:
            return Tiling(B, B)
    B = DEFAULT_TILES[-1]
    return Tiling(B, B)


def other_fast_tables(algorithm: str):
    """(tiles, fallback, tuned, threads) of standard's / fa1's fast fp32 forward kernels:
    STANDARD_FAST_* or FA1_FAST_*."""
    if algorithm == "standard":
        return (STANDARD_FAST_TILES, STANDARD_FAST_FALLBACK, STANDARD_FAST_TUNED,
                STANDARD_FAST_THREADS)
    return FA1_FAST_TILES, FA1_FAST_FALLBACK, FA1_FAST_TUNED, FA1_FAST_THREADS
