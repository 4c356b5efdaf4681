"""torch CPU tensors in gpu's torch glue (gpu.flash_attn, gpu.hf, gpu.autograd).

The kernels' entry points (gpu.attention, gpu.attention_varlen and its backward,
gpu.backward.attention_backward, gpu.decode) take NumPy arrays (run on the GPU through
host copies, or in Numba's CUDA simulator where there is none) and device arrays (torch
CUDA tensors). `call(fn, *args, **kwargs)` runs fn with every torch CPU tensor among its
arguments as the NumPy array that shares its memory (no copy; bfloat16 as ml_dtypes'
bfloat16 through an int16 view), and gives NumPy results back as torch CPU tensors (again
sharing memory), so a CPU tensor runs exactly as the NumPy path does: the same kernels, in
the simulator without a GPU; on a GPU, copied to the device and back. In-place updates
(gpu.decode's appends to a NumPy cache, copied back after the kernels) land in the
tensor. torch is imported only when a tensor is met: importing this module needs no torch.
"""
from __future__ import annotations

import functools

import numpy as np


def torch_of(x):
    """The torch module if x is a torch tensor (torch imported only then), else None."""
    if type(x).__module__.split(".")[0] != "torch":
        return None
    import torch
    return torch if isinstance(x, torch.Tensor) else None


def is_cpu_tensor(x) -> bool:
    """Whether x is a torch tensor on the CPU."""
    return torch_of(x) is not None and x.device.type == "cpu"


def to_numpy(x):
    """A torch CPU tensor as the NumPy array sharing its memory (detached; its strides
    kept, so a non-contiguous tensor gives a non-contiguous array, which the kernels'
    checks refuse as they refuse a non-contiguous CUDA tensor). bfloat16 -> ml_dtypes'
    bfloat16 (NumPy has none)."""
    torch = torch_of(x)
    x = x.detach()
    if x.dtype == torch.bfloat16:
        import ml_dtypes
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def from_numpy(a):
    """A NumPy result as a torch CPU tensor sharing its memory (ml_dtypes' bfloat16 ->
    torch.bfloat16; a read-only array is copied, as torch cannot share it)."""
    import torch
    if not a.flags.writeable:
        a = a.copy()
    if a.dtype.itemsize == 2 and a.dtype.kind == "V":       # ml_dtypes.bfloat16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _in(x):
    if is_cpu_tensor(x):
        return to_numpy(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_in(y) for y in x)
    return x


def _out(x):
    if isinstance(x, np.ndarray):
        return from_numpy(x)
    if isinstance(x, tuple):
        return tuple(_out(y) for y in x)
    return x


def _any_cpu(xs) -> bool:
    return any(is_cpu_tensor(x) or (isinstance(x, (tuple, list)) and _any_cpu(x))
               for x in xs)


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs), with torch CPU tensors in (also inside tuples / lists) run as
    NumPy arrays and NumPy results (also inside tuples) given back as torch CPU tensors;
    without a CPU tensor among the arguments, fn as it is."""
    if not _any_cpu(args) and not _any_cpu(kwargs.values()):
        return fn(*args, **kwargs)
    res = fn(*(_in(a) for a in args), **{k: _in(v) for k, v in kwargs.items()})
    return _out(res)


def takes_torch_cpu(fn):
    """Decorator: fn (a kernel entry point) also takes torch CPU tensors, through `call`:
    its NumPy path on the arrays sharing their memory, NumPy results back as CPU tensors."""
    @functools.wraps(fn)
    def entry(*args, **kwargs):
        return call(fn, *args, **kwargs)
    return entry


__all__ = ["call", "from_numpy", "is_cpu_tensor", "takes_torch_cpu", "to_numpy", "torch_of"]
