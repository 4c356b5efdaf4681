"""Backward kernels: dQ, dK, dV of exact attention, one module per algorithm family.

    flash.py     fa1 (Algorithm 4 as written) and fa2 (FlashAttention-2's backward) on the
                 CUDA cores, any dtype: the pre-pass (D = rowsum(dO o O), dQacc = 0), the
                 main kernel, the dQ conversion and the grouped-heads sum; the entry point
                 `attention_backward` (which picks the kernel for each algorithm).
    fa2_fast.py  the fa2 main kernel register-tiled on the CUDA cores (fp32 math), and the
                 warp-per-row pre-pass every fa2 backward uses on a GPU
    fa2_tc.py    the fa2 main kernel for fp16, bf16 on the tensor cores (d <= 128; N_k != N_q
                 and local windows too; with fa2_tc.cu)
    standard.py  Algorithm 3 (standard attention's backward), one kernel per line.
    standard_tc.py  the same five kernels for fp16, tile products on the tensor cores

Each has an instrumented build whose own element counts equal iosim.backward's ledger.
"""
from .._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads
from .flash import (BACKWARD_ALGORITHMS, BT, BW_TENSORS, attention_backward,
                    backward_shared_bytes, bwd_shared_bytes, default_backward_tiling)
from . import standard

__all__ = ["attention_backward", "default_backward_tiling", "bwd_shared_bytes",
           "backward_shared_bytes", "BACKWARD_ALGORITHMS", "BT", "BW_TENSORS", "standard"]
