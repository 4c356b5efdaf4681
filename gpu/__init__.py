"""flashsim.gpu: Numba CUDA kernels running iosim's tile schedules, grouped by pass.

    forward/    standard (Algorithm 0: S / softmax / PV through HBM), fa1 (Algorithm 1 as
                written, one block per instance), fa2 (one block per query block): plain,
                register-tiled (fast, fp32) and tensor-core (tc, fp16) kernels
    backward/   fa2 and fa1 (Algorithms 2 and 4), standard (Algorithm 3); fast and tc
                main kernels of fa2, tc kernels of standard
    decode/     KV-cache decoding: split-KV main kernel and combine, contiguous or paged
    _launch.py  what every kernel shares: specialisation, dynamic shared memory above
                48 KB, counters, the repeat-launch fast path
    mma.cuh, _tc.py   the tensor-core tile products (mma.sync / ldmatrix / cp.async
                templates) and how a Numba kernel links them

Entry points: `gpu.attention` (forward; picks the kernel), `gpu.attention_varlen`
(fa2 forward on packed variable-length batches, gpu/varlen.py) and
`gpu.attention_varlen_backward` (its gradients, gpu.backward.fa2_varlen), `gpu.backward.
attention_backward`, `gpu.autograd.flash_attention` (torch autograd), `gpu.decode`;
flash-attn's interface in `gpu.flash_attn` (flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache: change one import) and a transformers attention backend in
`gpu.hf` (`gpu.hf.register()`), both loaded on first use, torch only when given. Every
kernel has an instrumented build (count_traffic=True) whose own element counts equal
iosim's ledger. The kernels' launch plans (tile tables, shared-memory layouts, thread
counts, plan errors, default tilings) are `iosim.launch`'s: the model reads the same data.

GPU or simulator (`gpu/_env.py`). On a machine without a CUDA GPU the kernels run in
Numba's CUDA simulator on their own (same results, much slower), and say so once on
stderr. NUMBA_ENABLE_CUDASIM, where already set, is respected silently;
FLASHSIM_REQUIRE_GPU=1 demands a real GPU (`gpu._env.GPURequiredError`, one line, instead
of the simulator). The choice is made before numba.cuda loads, when the first kernel
module is imported: `import gpu` itself is light (its entry points load on first use),
so `gpu._env.has_cuda_gpu` / `ensure_cuda_env` can be imported before that.
"""

import importlib as _importlib

from ._env import GPURequiredError, ensure_cuda_env, has_cuda_gpu  # stdlib only: no numba

__all__ = ["attention", "attention_result", "AttentionResult", "default_tiling", "HEAD_DIMS",
           "DEFAULT_TILES", "attention_varlen", "attention_varlen_backward", "decode",
           "GPURequiredError", "has_cuda_gpu", "ensure_cuda_env"]

#: entry points -> the module that defines them (loaded on first use: `__getattr__`)
_ENTRY = {"attention": "api", "attention_result": "api", "AttentionResult": "api",
          "default_tiling": "api", "HEAD_DIMS": "api", "DEFAULT_TILES": "api",
          "attention_varlen": "varlen", "attention_varlen_backward": "varlen"}


def __getattr__(name):
    """gpu.attention, gpu.decode (KV-cache decoding, a callable package), gpu.api, ...:
    imported on first use (the GPU-or-simulator choice happens then, see above)."""
    if name in _ENTRY:
        value = getattr(_importlib.import_module(f".{_ENTRY[name]}", __name__), name)
    elif not name.startswith("__"):
        try:
            value = _importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
