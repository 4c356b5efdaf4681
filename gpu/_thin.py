"""The thin call path's pieces (gpu.api's docstring, "Call path"): how an input is
described for the plan key (`_describer`), the bytes an array spans (`_span`) and the
plan of a repeat call (`_Plan`: its recorded launches and the outputs to allocate)."""
from __future__ import annotations

from ._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads

import math

import numpy as np
from numba import cuda

from . import _launch
from ._io import _bf16_bits, _return_like, _torch_dtype, _torch_stream
from ._launch import SIM, filled

_NO_PLAN = object()     # a key whose calls always take the full path


def _describe_torch(x):
    return (x.shape, x.dtype, x.stride(), x.device, x.requires_grad), x.data_ptr()


def _describe_numba(x):
    return ((x.shape, x.dtype, x.strides),
            0 if SIM else (x.device_ctypes_pointer.value or 0))


def _describe_cai(x):
    c = x.__cuda_array_interface__
    if c.get("stream") not in (None, 1):
        # the full path synchronises with that producer stream on every call: no plan
        raise LookupError("producer stream")
    st = c.get("strides")
    return ((tuple(c["shape"]), c["typestr"], None if st is None else tuple(st)),
            c["data"][0])


_DESCRIBERS: dict = {}


def _describer(t):
    """How to describe an input of type t for the plan key: (hashable description,
    data pointer); None for types that always take the full path (NumPy arrays...)."""
    f = _DESCRIBERS.get(t, _NO_PLAN)
    if f is _NO_PLAN:
        if t.__module__.split(".")[0] == "torch" and hasattr(t, "data_ptr"):
            f = _describe_torch
        elif hasattr(t, "copy_to_host") and hasattr(t, "is_c_contiguous"):
            f = _describe_numba
        elif hasattr(t, "__cuda_array_interface__") and not SIM:
            f = _describe_cai
        else:
            f = None
        _DESCRIBERS[t] = f
    return f


def _span(a):
    """[start, end) of a device array's bytes; None for anything else (scalars)."""
    if SIM:
        ary = getattr(a, "_ary", None)       # the simulator's arrays wrap a NumPy array
        if not isinstance(ary, np.ndarray):
            return None
        start = ary.__array_interface__["data"][0]
        return start, start + ary.nbytes
    ptr = getattr(a, "device_ctypes_pointer", None)
    if ptr is None:
        return None
    start = ptr.value or 0
    return start, start + a.size * a.dtype.itemsize


class _Plan:
    """What a repeat call needs: the recorded launches (`_launch.ThinLaunch`) and the
    outputs to allocate: (slot, shape the caller gets, 3-D shape the kernels see,
    NumPy dtype)."""
    __slots__ = ("launches", "outs", "kind", "torch", "poison", "stats", "shape", "calls",
                 "tdt")

    @classmethod
    def build(cls, launches, views, kind, torch, poison, stats, shape):
        """A plan from a full call's recorded launches, or None where one cannot be made.
        Each array argument that is one of the call's own arrays (`views`: q, k, v
        views, outputs, scratch) becomes a slot, by identity; every other argument is a
        constant of the plan (scalars, dummy or block-mask arrays)."""
        slot_of = {id(a): name for name, a in views.items()}
        spans = [_span(a) for a in views.values()]
        thin = []
        for kern, grid, block, shmem, args in launches:
            slots = [slot_of.get(id(a)) for a in args]
            for a, slot in zip(args, slots):
                # a constant must not alias the call's own memory: a view of q or o made
                # inside a `run` (not the object itself) would be replayed with the first
                # call's pointer. No plan then: such calls always take the full path.
                sp = None if slot is not None else _span(a)
                if sp is not None and any(v is not None and sp[0] < v[1] and v[0] < sp[1]
                                          for v in spans):
                    return None
            t = _launch.thin_launch(kern, grid, block, shmem, args, slots)
            if t is None:
                return None
            thin.append(t)
        if not thin:
            return None
        B, H, N, d = shape
        p = cls()
        p.launches, p.kind, p.torch, p.poison, p.stats = tuple(thin), kind, torch, poison, stats
        p.shape, p.calls = shape, 0
        user = {"o": (B, H, N, d), "L": (B, H, N)}
        p.outs = tuple((name, user.get(name, tuple(a.shape)), tuple(a.shape), np.dtype(a.dtype))
                       for name, a in views.items() if name not in ("q", "k", "v"))
        if torch is not None:
            p.tdt = {npdt: _torch_dtype(torch, npdt) for _n, _s, _s3, npdt in p.outs}
        return p

    def __call__(self, q, k, v, ptrs):
        if self.torch is not None:
            torch, dev = self.torch, q.device
            arrays = {}
            for name, shape, _shape3, npdt in self.outs:
                t = (torch.full(shape, math.nan, dtype=self.tdt[npdt], device=dev)
                     if self.poison else torch.empty(shape, dtype=self.tdt[npdt], device=dev))
                arrays[name] = t
                ptrs[name] = t.data_ptr()
            stream = _launch.core_stream(_torch_stream(torch, dev))
            for t in self.launches:
                t.go(stream, arrays, ptrs)
            return (arrays["o"], arrays["L"]) if self.stats else arrays["o"]
        B, H, N, d = self.shape
        arrays = {}
        if SIM:     # the simulator launches through Numba: it needs the input views
            arrays["q"] = _bf16_bits(q).reshape(B * H, N, d)
            arrays["k"] = _bf16_bits(k).reshape(k.shape[0] * k.shape[1], N, d)
            arrays["v"] = _bf16_bits(v).reshape(v.shape[0] * v.shape[1], N, d)
        for name, _shape, shape3, npdt in self.outs:
            a = filled(shape3, npdt, np.nan) if self.poison else cuda.device_array(shape3, npdt)
            arrays[name] = a
            if not SIM:
                ptrs[name] = a.device_ctypes_pointer.value or 0
        stream = None if SIM else _launch.core_stream(0)
        for t in self.launches:
            t.go(stream, arrays, ptrs)
        O = _return_like(arrays["o"].reshape(B, H, N, d), self.kind, q)
        if not self.stats:
            return O
        return O, _return_like(arrays["L"].reshape(B, H, N), self.kind, q)
