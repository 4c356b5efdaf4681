"""flashsim.gpu: Numba CUDA forward attention kernels running iosim's tile schedules.

Kernels: standard (Algorithm 0, S / softmax / PV through HBM), fa1 (Algorithm 1 as
written, one block per instance), fa2 (one block per query block). Each has an
instrumented build (count_traffic=True) whose own element counts equal iosim's ledger.
Shared launch machinery (specialisation, dynamic shared memory, counters) is in
gpu._launch. Import this package after NUMBA_ENABLE_CUDASIM is settled.
"""
from .api import DEFAULT_TILES, HEAD_DIMS, AttentionResult, attention, attention_result, default_tiling

__all__ = ["attention", "attention_result", "AttentionResult", "default_tiling", "HEAD_DIMS",
           "DEFAULT_TILES"]
from . import decode  # noqa: E402,F401  (KV-cache decoding: gpu.decode(q, k_cache, v_cache, ...), a callable package)
