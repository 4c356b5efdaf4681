"""Probe the lent GPU: versions, a Numba kernel, >48 KB dynamic shared memory opt-in.

ONE-OFF probe of the lent H100 (kept for the record; result: data set kind `device_probe`).
"""
import json, os, subprocess, sys, time
import numpy as np
assert tuple(int(x) for x in np.__version__.split(".")[:2]) < (2, 5), np.__version__
from numba import cuda, float32
import numba, numba_cuda
from numba.cuda.cudadrv import driver as drv
out = {"numpy": np.__version__, "numba": numba.__version__, "numba_cuda": numba_cuda.__version__}
dev = cuda.get_current_device()
out["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
out["cc"] = dev.compute_capability
@cuda.jit
def k(x, n):
    sm = cuda.shared.array(0, float32)
    t = cuda.threadIdx.x
    for i in range(t, n, cuda.blockDim.x):
        sm[i] = float32(i)
    cuda.syncthreads()
    for i in range(t, n, cuda.blockDim.x):
        x[i] = sm[n - 1 - i]
n = 40000  # 160 KB of float32
x = cuda.device_array(n, np.float32)
sig = (numba.types.float32[::1], numba.types.int64)
kern = k.compile(sig) if hasattr(k, "compile") else None
try:
    k[1, 256, 0, n * 4](x, n); cuda.synchronize(); out["optin_without_attr"] = "ran"
except Exception as e:
    out["optin_without_attr"] = repr(e)[:200]
try:
    sys.path.insert(0, os.getcwd())
    from gpu._launch import launch
    y = cuda.device_array(n, np.float32)
    launch(k, 1, 256, n * 4, y, n); cuda.synchronize()
    h = y.copy_to_host()
    out["optin_via_gpu_launch"] = bool((h == np.arange(n, dtype=np.float32)[::-1]).all())
except Exception as e:
    out["optin_via_gpu_launch"] = repr(e)[:300]
try:
    ck = k.overloads[sig] if sig in k.overloads else list(k.overloads.values())[0]
    lib = ck._codelibrary
    cufunc = lib.get_cufunc()
    out["cufunc_type"] = type(cufunc).__name__
    out["cufunc_attrs"] = [a for a in dir(cufunc) if not a.startswith("__")][:40]
except Exception as e:
    out["cufunc_err"] = repr(e)[:300]
for tool in ("ncu", "compute-sanitizer", "nvcc"):
    out[tool] = subprocess.run(f"which {tool}", shell=True, capture_output=True, text=True).stdout.strip()
try:
    import torch
    out["torch"] = torch.__version__
except Exception as e:
    out["torch"] = repr(e)
print(json.dumps(out, indent=1, default=str))
