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
attention_backward`, `gpu.autograd.flash_attention` (torch autograd), `gpu.decode`. Every
kernel has an instrumented build (count_traffic=True) whose own element counts equal
iosim's ledger. Import this package after NUMBA_ENABLE_CUDASIM is settled.
"""
from .api import DEFAULT_TILES, HEAD_DIMS, AttentionResult, attention, attention_result, default_tiling

__all__ = ["attention", "attention_result", "AttentionResult", "default_tiling", "HEAD_DIMS",
           "DEFAULT_TILES", "attention_varlen", "attention_varlen_backward"]
from .varlen import attention_varlen, attention_varlen_backward  # noqa: E402  (packed varlen)
from . import decode  # noqa: E402,F401  (KV-cache decoding: gpu.decode(q, k_cache, v_cache, ...), a callable package)
