"""What every tensor-core kernel shares: its CUDA C++ source, its declaration to Numba, the
data pointers it hands to C++, and the linked PTX for inspection.

Numba has no API for the tensor cores (numba-cuda 0.30.4), so a tensor-core kernel is a
Numba kernel that calls CUDA C++ device functions (inline PTX `mma.sync`, `ldmatrix`,
`cp.async`). The shared warp-level templates are in `gpu/mma.cuh`; each kernel's own .cu
file (beside its Python module) instantiates the extern "C" entry points it needs, and
`source(...)` glues the two with the instantiation line. `declare(...)` declares those entry
points with `cuda.declare_device(..., link=...)`; link-time optimisation inlines them, so
fragment arrays passed by pointer stay in registers.

The CUDA simulator cannot run linked device functions: under NUMBA_ENABLE_CUDASIM=1 these
kernels are not run (`ptr`, `ptr32` are None); `linked_ptx` builds their PTX without a GPU.
"""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import os

from numba import cuda

from ._launch import SIM

#: The shared templates (gpu/mma.cuh).
MMA_PATH = os.path.join(os.path.dirname(__file__), "mma.cuh")
#: Element types of the tensor-core kernels: dtype name -> (gpu/mma.cuh's element type E,
#: the suffix of the extern "C" names; fp16's names keep their old form).
ELEMENTS = {"fp16": ("tc_fp16", ""), "bf16": ("tc_bf16", "_bf16")}
#: What the 16-bit data arrive as: fp16 as float16 arrays, bf16 as uint16 arrays of the
#: bfloat16 bits (Numba has no bfloat16 arrays to pass through the CUDA array interface).
ARRAY_DTYPES = {"fp16": "float16", "bf16": "uint16"}


def array_type(dt: str, ndim: int = 3):
    """The Numba array type (C layout) of a 16-bit tensor of dtype `dt` ("fp16", "bf16")."""
    from numba.cuda import types as nb
    return nb.Array(getattr(nb, ARRAY_DTYPES[dt]), ndim, "C")


def check_dtype(kernel: str, name: str, arr, dt: str) -> None:
    """A 16-bit input of a tensor-core kernel has the array dtype that `dt` arrives as
    (ARRAY_DTYPES): float16 for fp16, uint16 (the bits) for bf16. Numba / NumPy / CuPy
    arrays and torch tensors (torch.float16, torch.uint16) alike."""
    want = ARRAY_DTYPES[dt]
    got = str(getattr(arr, "dtype", "?")).replace("torch.", "")
    if got != want:
        raise ValueError(f"{name}: the tensor-core kernel {kernel} takes dt={dt!r} data as "
                         f"{want} arrays (got dtype {got})")


def source(cu_path: str, instantiate: str) -> str:
    """gpu/mma.cuh, then the kernel's .cu (`cu_path`), then the line `instantiate` (e.g.
    "FA2TC_INSTANTIATE(64, 64, 1)")."""
    with open(MMA_PATH) as f:
        common = f.read()
    with open(cu_path) as f:
        own = f.read()
    return f"{common}\n{own}\n{instantiate}\n"


def declare(src: str, src_name: str, prefix: str, suffix: str, sigs: dict) -> dict:
    """Declare the C ABI functions `prefix + name + suffix` (name, signature in `sigs`),
    all linked from the C++ source `src` (compiled by NVRTC when a kernel using one is
    first built). Returns {name: device function}."""
    from numba.cuda.cudadrv.linkable_code import CUSource
    cus = CUSource(src, name=src_name)
    return {name: cuda.declare_device(f"{prefix}{name}{suffix}", sig, link=cus, abi="c")
            for name, sig in sigs.items()}


def _data_ptr_intrinsics():
    """`ptr(arr)`: the data pointer of a Numba array (shared, local or global) as a
    CPointer of its dtype, to hand to the C++ functions (what cffi's ffi.from_buffer does,
    without needing cffi); `ptr32(arr)`: the same pointer as uint32* (pairs of 16-bit
    elements); `ptr16(arr)`: as uint16* (single fp16 / bf16 elements)."""
    from llvmlite import ir
    from numba.cuda import types as nb
    from numba.cuda.extending import intrinsic

    @intrinsic
    def ptr(typingctx, arr):
        sig = nb.CPointer(arr.dtype)(arr)

        def codegen(context, builder, signature, args):
            return context.make_array(signature.args[0])(context, builder, args[0]).data
        return sig, codegen

    def as_uint(bits, ty):
        @intrinsic
        def ptr_bits(typingctx, arr):
            sig = nb.CPointer(ty)(arr)

            def codegen(context, builder, signature, args):
                data = context.make_array(signature.args[0])(context, builder, args[0]).data
                return builder.bitcast(data, ir.PointerType(ir.IntType(bits)))
            return sig, codegen
        return ptr_bits
    return ptr, as_uint(32, nb.uint32), as_uint(16, nb.uint16)


ptr, ptr32, ptr16 = (None, None, None) if SIM else _data_ptr_intrinsics()


def check_aligned(kernel: str, name: str, arr) -> None:
    """cp.async copies 16 bytes at a time: the array's data must be 16-byte aligned."""
    addr = arr.__cuda_array_interface__["data"][0]
    if addr % 16:
        raise ValueError(f"{name}: the tensor-core kernel {kernel} needs 16-byte aligned data "
                         f"(address {addr:#x}); pass a fresh contiguous array")


def linked_ptx(kern, signature, cc=(9, 0)) -> str:
    """The PTX of the dispatcher `kern` compiled for `signature` after link-time
    optimisation with its C++ functions, built without a GPU (Numba's NVVM, NVRTC and
    nvJitLink only): what runs, for inspection. A correct build has the tile functions
    inlined (no `call`), its fragments in registers (no `.local`), mma.sync and ldmatrix;
    `ptxas -v` on it reports registers and spills. Uses numba-cuda's internal compile entry
    point (numba-cuda 0.30.4); the PTX .version is nvJitLink's."""
    if SIM:
        raise RuntimeError("linked_ptx needs NUMBA_ENABLE_CUDASIM unset (no GPU is needed)")
    from numba.cuda.compiler import _compile_pyfunc_with_fixup
    lib, _ = _compile_pyfunc_with_fixup(
        kern.py_func, signature, device=False, cc=cc, lto=False, abi="numba", debug=False,
        lineinfo=False, fastmath=False, opt=True, abi_info=None, forceinline=False,
        launch_bounds=None)
    lib._lto = True     # link the NVVM and NVRTC outputs as LTO-IR, as a launch does
    return lib.get_lto_ptx(cc=cc).rstrip("\x00")


def ptxas_registers(ptx: str, arch: str = "sm_90") -> tuple[int | None, int]:
    """(registers per thread, spill store bytes) of one kernel's PTX by `ptxas -v` (CUDA's,
    on the PATH; no GPU needed); registers None where ptxas printed no count. An older
    ptxas than the PTX's .version gets the version it takes (the same code)."""
    import re
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        for _ in range(2):
            with open(src, "w") as f:
                f.write(ptx)
            r = subprocess.run(["ptxas", f"-arch={arch}", "-v", src, "-o",
                                os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
            m = re.search(r"current version is '([\d.]+)'", r.stderr)
            if r.returncode == 0 or not m:
                break
            ptx = re.sub(r"^\.version \S+", f".version {m.group(1)}", ptx, flags=re.M)
    used = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return (int(used.group(1)) if used else None), (int(spill.group(1)) if spill else 0)


__all__ = ["MMA_PATH", "ELEMENTS", "ARRAY_DTYPES", "array_type", "check_dtype", "source",
           "declare", "ptr", "ptr32", "ptr16", "check_aligned", "linked_ptx", "ptxas_registers"]
