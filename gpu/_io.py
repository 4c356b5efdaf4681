"""Arrays in and out of `gpu.attention` (and the backward, decoding): checking an input
(type, ndim, dtype, layout), moving it to the device in its storage dtype (bf16 as uint16
bits), allocating outputs (torch's caching allocator on its current stream, or Numba;
NaN-filled when poisoned) and returning them in the caller's kind."""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import numpy as np
from numba import cuda

from ._launch import HOST_DTYPE, NP_DTYPE, filled


BF16 = HOST_DTYPE["bf16"]


def _aligned16(x, kind) -> bool:
    """Whether a device input's data is 16-byte aligned (fa2_tc copies 16 bytes at a time);
    NumPy inputs are copied into fresh, aligned device arrays."""
    if kind == "numpy":
        return True
    if _torch_like(x) is not None:      # bfloat16 tensors have no __cuda_array_interface__
        return x.data_ptr() % 16 == 0
    return x.__cuda_array_interface__["data"][0] % 16 == 0


def _kind_of(name, x):
    """(shape, numpy dtype, kind, c-contiguous) of an input array: kind "numpy", "numba"
    (a Numba device array) or "cai" (torch, CuPy, ...: __cuda_array_interface__, and
    torch's bfloat16 tensors, which have none); ValueError naming `name` otherwise."""
    if isinstance(x, np.ndarray):
        return x.shape, x.dtype, "numpy", x.flags.c_contiguous
    if _torch_bf16(x):      # torch refuses __cuda_array_interface__ for bfloat16
        if not x.is_cuda:
            raise ValueError(f"{name} is a torch.bfloat16 tensor on {x.device}; allowed: "
                             f"CUDA tensors (or NumPy arrays)")
        return tuple(x.shape), BF16, "cai", x.is_contiguous()
    if hasattr(x, "copy_to_host") and hasattr(x, "is_c_contiguous"):  # numba device array
        return x.shape, np.dtype(x.dtype), "numba", x.is_c_contiguous()
    if hasattr(x, "__cuda_array_interface__"):                        # torch, CuPy, ...
        cai = x.__cuda_array_interface__
        shape = tuple(cai["shape"])
        # ml_dtypes' bfloat16 describes itself as the 2-byte void '<V2': taken as bf16
        dt = BF16 if cai["typestr"] == BF16.str else np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contig = strides is None or tuple(strides) == tuple(
            int(np.prod(shape[i + 1:])) * dt.itemsize for i in range(len(shape)))
        return shape, dt, "cai", contig
    raise ValueError(f"{name} must be a NumPy array or a CUDA device array "
                     f"(__cuda_array_interface__); got {type(x).__name__}")


def _check(name, x, dims=("batch", "heads", "N", "d"), layout=""):
    """(shape, numpy dtype, kind) of one input, with validation of ndim/dtype/layout.
    dims: the names of its axes (their number is the ndim required); layout: words
    added to the ndim error (e.g. whose layout it is)."""
    shape, dt, kind, contig = _kind_of(name, x)
    if len(shape) != len(dims):
        raise ValueError(f"{name} has shape {tuple(shape)} (ndim={len(shape)}); "
                         f"expected {len(dims)} dimensions ({', '.join(dims)}){layout}")
    if dt not in HOST_DTYPE.values():
        raise ValueError(f"{name} has dtype {dt}; allowed: float32, float16, bfloat16")
    if not contig:
        raise ValueError(f"{name} must be C-contiguous (row-major); make a contiguous copy")
    return tuple(int(s) for s in shape), dt, kind


def _torch_bf16(x) -> bool:
    """Whether x is a torch.bfloat16 tensor."""
    return _torch_like(x) is not None and str(getattr(x, "dtype", "")) == "torch.bfloat16"


def _bf16_bits(dev):
    """A Numba device array of bf16 (ml_dtypes.bfloat16 or '<V2') as the uint16 bits the
    kernels take (a view, no copy); other arrays unchanged."""
    if np.dtype(dev.dtype) == BF16 or np.dtype(dev.dtype) == np.dtype("V2"):
        return dev.view(NP_DTYPE["bf16"])
    return dev


def _to_device(x, kind):
    """The input as a Numba device array in its storage dtype (bf16: uint16 bits, a view
    of the caller's memory for device inputs)."""
    if kind == "numpy":
        h = x.view(NP_DTYPE["bf16"]) if x.dtype == BF16 else x
        # A C-contiguous array may carry any stride on a length-1 axis (x[None] has 0):
        # Numba copies the strides as they are, and its device reshape (the kernels take
        # (instances, N, d) views) then refuses with "operation requires copying". Copy
        # it flat and give it its shape on the device, with canonical strides.
        return cuda.to_device(np.ascontiguousarray(h).reshape(-1)).reshape(h.shape)
    if kind == "numba":
        return _bf16_bits(x)
    if _torch_bf16(x):
        # the int16 view has a __cuda_array_interface__ (bfloat16 has none); same stream
        # rule as below
        import torch
        return cuda.as_cuda_array(x.detach().view(torch.int16), sync=False).view(
            NP_DTYPE["bf16"])
    if _torch_like(x) is not None:
        # our kernels run on torch's current stream (`_torch_stream`), the stream torch
        # reports as the producer's: ordered after it without a host-blocking sync
        return cuda.as_cuda_array(x, sync=False)
    # Numba synchronises on the producer's stream before using a foreign array. Our
    # kernels run on the legacy default stream, which is already ordered after work on
    # that same stream (stream 1, or None = unspecified/legacy): skip the host-blocking
    # sync there, keep it for any other stream.
    stream = x.__cuda_array_interface__.get("stream")
    return _bf16_bits(cuda.as_cuda_array(x, sync=stream not in (None, 1)))


def _torch_like(like):
    """The torch module if `like` is a torch tensor, else None."""
    if type(like).__module__.split(".")[0] != "torch":
        return None
    import torch
    return torch


def _torch_stream(torch, device):
    """Raw handle of torch's current stream on `device` (0: the legacy default stream)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return int(get(device.index if device.index is not None else torch.cuda.current_device()))
    return int(torch.cuda.current_stream(device).cuda_stream)


def _output(shape, npdt, kind, like, poison=True):
    """(caller-kind object or None, numba device view) of a new output; filled with NaN
    when `poison` (so elements no kernel writes show), else left uninitialised.

    torch callers get a torch tensor from torch's caching allocator on the current stream
    (the one the kernels run on; no cuMemAlloc / cuMemFree per call: Numba's deferred
    frees synchronise the device, which put a host round trip inside every timed call);
    others a Numba device array."""
    torch = _torch_like(like) if kind == "cai" else None
    if torch is None:
        if poison:       # bf16 (uint16 storage): the bits of a bf16 NaN
            return None, filled(shape, npdt, np.nan)
        return None, cuda.device_array(shape, dtype=npdt)
    tdt = _torch_dtype(torch, npdt)
    t = (torch.full(shape, float("nan"), device=like.device, dtype=tdt) if poison
         else torch.empty(shape, device=like.device, dtype=tdt))
    if tdt == torch.bfloat16:
        return t, cuda.as_cuda_array(t.view(torch.int16), sync=False).view(npdt)
    return t, cuda.as_cuda_array(t, sync=False)


def _torch_dtype(torch, npdt):
    """The torch dtype of an output whose device storage dtype is npdt (uint16: bf16)."""
    return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
            NP_DTYPE["bf16"]: torch.bfloat16}[np.dtype(npdt)]


def _no_band(common: dict) -> dict:
    """The launch keywords without N_k and window (kernels that take neither)."""
    return {k: v for k, v in common.items() if k not in ("N_k", "window")}


def _return_like(dev, kind, like):
    """Convert a numba device array back to the caller's kind (uint16 storage is bf16:
    NumPy / Numba callers get ml_dtypes.bfloat16, torch callers torch.bfloat16)."""
    bf16 = np.dtype(dev.dtype) == NP_DTYPE["bf16"]
    if kind == "numpy":
        host = dev.copy_to_host()
        return host.view(BF16) if bf16 else host
    if kind == "numba" or (bf16 and _torch_like(like) is None):
        return dev.view(BF16) if bf16 else dev     # CuPy has no bfloat16: a Numba array
    mod = type(like).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if bf16:
            return torch.as_tensor(dev.view(np.int16), device=like.device).view(torch.bfloat16)
        return torch.as_tensor(dev, device=like.device)
    if mod == "cupy":
        import cupy
        return cupy.asarray(dev)
    return dev
