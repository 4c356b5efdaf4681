"""Which forward kernel and tiling `gpu.attention` runs on this device: the default
tilings of the fast and tensor-core kernels (from `iosim.launch`'s tables, checked against
the device's shared memory and the simulator), their tuning options and thread counts,
the kernel= choice and the dropout check. B_r: query rows per block, B_c: key rows per
K/V tile, d: head dim (elements); shared memory in bytes."""
from __future__ import annotations

import warnings

import iosim
from iosim.launch.tables import (FA2_FAST_FALLBACK, FA2_FAST_THREADS, FA2_FAST_TILES,
                                 FA2_FAST_TUNED, FA2_TC_FALLBACK, FA2_TC_TILES,
                                 FA2_TC_TILES_CAUSAL, FAST_ALGORITHMS, FAST_DTYPES, KERNELS,
                                 fa2_tc_mt, other_fast_tables, plain_default_tiling, tc_dtypes)
from iosim.tiling import Tiling

from ._launch import SIM, default_threads, device_smem_limit
from .forward import fa1_fast, fa1_tc, fa2_fast, fa2_tc, standard_fast, standard_tc


def fa2_fast_default(d: int) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of the fast fa2 kernel's default tiling for head dim d, or None
    where it has none (the simulator: its warps are OS threads, so tiny blocks rule)."""
    if SIM:
        return None
    limit = device_smem_limit()
    for B_r, B_c, threads in ((FA2_FAST_TILES[d],) if d in FA2_FAST_TILES else ()) + \
            FA2_FAST_FALLBACK:
        if _fast_fits(B_r, B_c, d, threads, limit):
            return B_r, B_c, threads
    return None


def fa2_tc_default(d: int, causal: bool = False, dtype: str = "fp16") -> tuple[int, int] | None:
    """(B_r, B_c) of the tensor-core fa2 kernel's default tiling for fp16 (or bf16, where
    gpu.forward.fa2_tc runs it) at head dim d, or None where it cannot run (the simulator;
    a dtype it does not take). Head dims without a tuned entry take the first of
    FA2_TC_FALLBACK that fits (not timed: d=40..256 all get 128 x 64; d=256 uses 203 KB
    of shared memory and 249 registers, no spills)."""
    if SIM or dtype not in tc_dtypes(fa2_tc):
        return None
    limit = device_smem_limit()
    tuned = (FA2_TC_TILES_CAUSAL if causal else FA2_TC_TILES).get(d)
    for B_r, B_c in ((tuned,) if tuned else ()) + FA2_TC_FALLBACK:
        if fa2_tc.supports(B_r, B_c, d, dtype, smem_limit=limit, MT=fa2_tc_mt(B_r, B_c, d)):
            return B_r, B_c
    return None


def _fast_fits(B_r: int, B_c: int, d: int, threads: int, limit: int) -> bool:
    """Whether the fast kernel runs this tiling as `attention` would launch it: with its
    tuned TC (fa2_fast_options) and, on hardware, warp-shuffle reductions (no RED
    region in shared memory)."""
    if fa2_fast.plan(B_r, B_c, d, threads) is None:
        return False
    opts = fa2_fast_options(B_r, B_c, d, threads)
    return fa2_fast.supports(B_r, B_c, d, threads, TC=opts.get("TC"), shfl=not SIM,
                             stage=opts.get("stage", 0), smem_limit=limit)


def fa2_fast_options(B_r: int, B_c: int, d: int, threads: int) -> dict:
    """Tuning keywords (TC, maxreg, stage) for gpu.forward.fa2_fast.run: the measured ones of
    FA2_FAST_TUNED where the kernel can use them at this d; otherwise TC from
    `fa2_fast.plan` and a register cap only above 256 threads, the one that lets a block
    be resident (65,536 registers per SM: 128 at 512 threads). The simulator takes no
    register cap."""
    opts = dict(FA2_FAST_TUNED.get((B_r, B_c, threads), {}))
    if "TC" in opts and fa2_fast.plan(B_r, B_c, d, threads, opts["TC"]) is None:
        del opts["TC"]
    if SIM:
        opts.pop("maxreg", None)
    elif "maxreg" not in opts and threads > 256:
        opts["maxreg"] = 65536 // threads
    return opts


def fa2_fast_threads(B_r: int, B_c: int, d: int, threads: int | None) -> int | None:
    """Thread count at which the fast fa2 kernel runs (B_r, B_c, d), or None if none
    of `threads` (given) or FA2_FAST_THREADS (not given) works on this device."""
    limit = device_smem_limit()
    if threads is not None:
        candidates = (threads,)
    elif SIM:   # the simulator runs one OS thread per CUDA thread: keep its default
        candidates = (default_threads(),)
    else:       # the measured thread count of this tiling first (FA2_FAST_TILES), then the rest
        tuned = [t for (br, bc, t) in list(FA2_FAST_TILES.values()) + list(FA2_FAST_FALLBACK)
                 if (br, bc) == (B_r, B_c)]
        candidates = tuple(dict.fromkeys(tuned + list(FA2_FAST_THREADS)))
    for t in candidates:
        if _fast_fits(B_r, B_c, d, t, limit):
            return t
    return None


def _other_fast(algorithm: str):
    """(module, tiles, fallback, tuned, threads) of standard's / fa1's fast kernels."""
    return ((standard_fast if algorithm == "standard" else fa1_fast),) + \
        other_fast_tables(algorithm)


def _other_fast_fits(algorithm, B_r, B_c, d, threads, dtype, N_k, limit) -> bool:
    if algorithm == "standard":
        return standard_fast.supports(B_r, B_c, d, threads, dtype, N_k=N_k, smem_limit=limit)
    return fa1_fast.supports(B_r, B_c, d, threads, dtype, shfl=not SIM, smem_limit=limit)


def _other_fast_candidates(algorithm: str, B_r: int, B_c: int, threads: int | None) -> tuple:
    """Thread counts to try for standard's / fa1's fast kernels at (B_r, B_c)."""
    if threads is not None:
        return (threads,)
    if SIM:     # the simulator runs one OS thread per CUDA thread: keep its default
        return (default_threads(),)
    _, tiles, fallback, _, tlist = _other_fast(algorithm)
    tuned = [t for (br, bc, t) in list(tiles.values()) + list(fallback) if (br, bc) == (B_r, B_c)]
    return tuple(dict.fromkeys(tuned + list(tlist)))


def other_fast_threads(algorithm: str, B_r: int, B_c: int, d: int, dtype: str,
                       threads: int | None, N_k: int | None = None) -> int | None:
    """Thread count at which gpu.forward.standard_fast / fa1_fast runs (B_r, B_c, d,
    dtype) on this device (shared memory included; standard: also the softmax row of
    N_k float32), or None."""
    limit = device_smem_limit()
    for t in _other_fast_candidates(algorithm, B_r, B_c, threads):
        if _other_fast_fits(algorithm, B_r, B_c, d, t, dtype, N_k, limit):
            return t
    return None


def other_fast_default(algorithm: str, d: int) -> tuple[int, int, int] | None:
    """(B_r, B_c, threads) of standard's / fa1's fast kernels' default tiling for head dim
    d (fp32 on a GPU: STANDARD_FAST_TILES / FA1_FAST_TILES, then their FALLBACK), or None
    (the simulator, or no tiling fits)."""
    if SIM:
        return None
    limit = device_smem_limit()
    _, tiles, fallback, _, _ = _other_fast(algorithm)
    for B_r, B_c, t in ((tiles[d],) if d in tiles else ()) + fallback:
        if _other_fast_fits(algorithm, B_r, B_c, d, t, "fp32", None, limit):
            return B_r, B_c, t
    return None


def other_fast_options(algorithm: str, B_r: int, B_c: int, threads: int) -> dict:
    """Tuning keywords of gpu.forward.standard_fast.run (stage, maxreg) / fa1_fast.run
    (maxreg): STANDARD_FAST_TUNED / FA1_FAST_TUNED's entry; else a register cap only above
    256 threads, the one that lets a block be resident (65,536 registers per SM). The
    simulator takes no register cap."""
    opts = dict(_other_fast(algorithm)[3].get((B_r, B_c, threads), {}))
    if SIM:
        opts.pop("maxreg", None)
    elif "maxreg" not in opts and threads > 256:
        opts["maxreg"] = 65536 // threads
    return opts


def other_tc_module(algorithm: str):
    """The tensor-core kernel module of fa1 / standard (fp16): gpu.forward.fa1_tc or
    gpu.forward.standard_tc."""
    return {"fa1": fa1_tc, "standard": standard_tc}[algorithm]


def other_tc_default(algorithm: str, d: int, causal: bool = False,
                     dtype: str = "fp16") -> dict | None:
    """dict(B_r, B_c[, MT, stages]) the fa1 / standard tensor-core kernels run by default
    (fp16, or bf16 where the module lists it in DTYPES; on a GPU where the tiling fits),
    else None (the simulator; no fit; a dtype it does not take)."""
    if SIM or algorithm not in ("fa1", "standard"):
        return None
    mod = other_tc_module(algorithm)
    if dtype not in tc_dtypes(mod):
        return None
    t = mod.default_tiling(d, causal)
    if algorithm == "fa1":
        ok = mod.supports(t["B_r"], t["B_c"], d, dtype, MT=t["MT"], stages=t["stages"])
    else:
        ok = mod.supports(t["B_r"], t["B_c"], d, dtype)
    return t if ok else None


def default_tiling(algorithm: str, d: int, dtype: str, causal: bool = False,
                   kernel: str = "auto") -> Tiling:
    """The tiling `attention` uses when none is given (see the module docstring): for fp16
    on a GPU the tensor-core kernels' defaults (fa2, fa1, standard; they may depend on
    `causal`), unless kernel='plain' (or 'fast'); for fp32 (or kernel='fast') fa2's and
    standard's fast kernels' defaults (FA2_FAST_TILES, STANDARD_FAST_TILES). bf16: the
    tensor-core defaults where the module takes bf16 (`tc_dtypes`), else the plain
    kernels' square tiles (the fast kernels take fp32 and fp16 only)."""
    dtype = iosim.check_dtype(dtype)
    if algorithm in ("fa1", "standard") and dtype != "fp32" and kernel in ("auto", "tc"):
        t = other_tc_default(algorithm, d, causal, dtype)
        if t is not None:
            return Tiling(t["B_r"], t["B_c"])
    if algorithm == "fa2" and dtype != "fp32" and kernel in ("auto", "tc"):
        tc = fa2_tc_default(d, causal, dtype)
        if tc is not None:
            return Tiling(*tc)
    if dtype not in FAST_DTYPES:
        kernel = "plain"
    if algorithm == "fa2" and kernel != "plain":
        fast = fa2_fast_default(d)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    if algorithm in ("standard", "fa1") and (
            kernel == "fast" or (kernel == "auto" and dtype == "fp32")):
        fast = other_fast_default(algorithm, d)
        if fast is not None:
            return Tiling(fast[0], fast[1])
    return plain_default_tiling(algorithm, d, dtype)


def _pick_kernel(kernel, fast, tensor_cores, algorithm, dname):
    """(kernel, allow_tc) from `attention`'s kernel= and the deprecated fast= and
    tensor_cores=; ValueError for a choice that cannot run whatever the tiling."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not allowed; allowed: "
                         f"{', '.join(repr(x) for x in KERNELS)}")
    if fast not in (None, True, False):
        raise ValueError(f"fast={fast!r} is not allowed; allowed: None, True, False "
                         f"(deprecated: use kernel='fast' or kernel='plain')")
    if tensor_cores not in (None, True, False):
        raise ValueError(f"tensor_cores={tensor_cores!r} is not allowed; allowed: None, True, "
                         f"False (deprecated: use kernel='tc')")
    allow_tc = True
    if fast is not None or tensor_cores is not None:
        given = ", ".join(f"{n}={x!r}" for n, x in (("fast", fast), ("tensor_cores", tensor_cores))
                          if x is not None)
        if kernel != "auto":
            raise ValueError(f"kernel={kernel!r} and the deprecated {given} were both given; "
                             f"give kernel= only")
        if fast is not None and tensor_cores:
            raise ValueError(f"{given}: contradictory (deprecated) choices; give kernel= only: "
                             f"'plain', 'fast' or 'tc'")
        if tensor_cores:
            kernel = "tc"
        elif fast is not None:
            kernel = "fast" if fast else "plain"
        allow_tc = tensor_cores is not False
        warnings.warn(f"gpu.attention: {given} is deprecated and will be removed in the next "
                      f"release; use kernel={kernel!r}"
                      + (" (tensor_cores=False: kernel='fast' or 'plain')"
                         if kernel == "auto" else ""), DeprecationWarning, stacklevel=4)
    if kernel == "fast" and algorithm not in FAST_ALGORITHMS:
        raise ValueError(f"kernel='fast' is not allowed for algorithm={algorithm!r}; allowed "
                         f"for: {', '.join(FAST_ALGORITHMS)}; {algorithm!r} has "
                         f"kernel='auto', 'plain' or (fp16) 'tc'")
    if kernel == "fast" and dname not in FAST_DTYPES:
        raise ValueError(f"kernel='fast' is not allowed for {dname}: the fast kernels take "
                         f"{', '.join(FAST_DTYPES)}; use kernel='auto' or 'plain'")
    dts = tc_dtypes(fa2_tc if algorithm == "fa2" else other_tc_module(algorithm))
    if kernel == "tc" and dname not in dts:
        names = " or ".join({"fp16": "float16", "bf16": "bfloat16"}.get(x, x) for x in dts)
        raise ValueError(f"kernel='tc' needs {names} inputs: the tensor-core {algorithm} "
                         f"kernels multiply {' or '.join(dts)} tiles (got {dname}); use "
                         f"kernel='auto'"
                         + (" or 'fast'" if algorithm == "fa2" and dname in FAST_DTYPES
                            else " or 'plain'"))
    return kernel, allow_tc


#: The kernel= choices that apply dropout, per algorithm: fa2's plain, fast (fp32 math,
#: CUDA cores) and tensor-core kernels, forward and backward; fa1's plain, fast and
#: tensor-core forward kernels and its (one, plain) backward; standard's plain, fast and
#: tensor-core forward kernels (the unfused graph's dropout: the softmax kernel stores the
#: keep mask Z in HBM, uint8, the PV kernel reads it) and its plain and tensor-core
#: backward (lines 1 and 2 read Z; standard has no fast backward: kernel='fast' there is
#: refused for every p). 'auto' picks among them as it would without dropout.
DROPOUT_KERNELS = {"fa2": ("auto", "plain", "fast", "tc"),
                   "fa1": ("auto", "plain", "fast", "tc"),
                   "standard": ("auto", "plain", "fast", "tc")}


def _check_dropout(dropout_p, dropout_seed, dropout_offset, algorithm, kernel):
    """(p, seed, offset) for dropout_p > 0, None for 0; ValueError (iosim ConfigError)
    for a bad p, seed or offset, or for a kernel without dropout (`DROPOUT_KERNELS`
    lists those with it), naming dropout_p, the algorithm and kernel, and what is
    allowed."""
    from iosim.dropout import check_dropout_p, check_seed
    p = check_dropout_p(dropout_p)
    seed, offset = check_seed(dropout_seed, dropout_offset)
    if not p:
        return None
    allowed = DROPOUT_KERNELS.get(algorithm)
    if allowed is None:
        raise ValueError(f"dropout_p={p} is not supported by algorithm={algorithm!r}; "
                         f"allowed: algorithm=" + " or ".join(map(repr, DROPOUT_KERNELS)))
    if kernel not in allowed:
        raise ValueError(f"dropout_p={p} is not supported by the {algorithm} "
                         f"kernel={kernel!r}: it has no dropout; allowed with dropout: "
                         f"kernel=" + ", ".join(map(repr, allowed)))
    return p, seed, offset
