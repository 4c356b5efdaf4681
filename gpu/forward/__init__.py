"""Forward kernels, one module per algorithm (and kernel generation of fa2):

    standard.py  Algorithm 0: S = Q K^T, P = softmax(S), O = P V through HBM
    standard_fast.py  the same three kernels register-tiled on the CUDA cores (fp32 fast path)
    standard_tc.py  the same three kernels for fp16, tile products on the tensor cores
    fa1.py       Algorithm 1 as written (FlashAttention), one block per (batch, head)
    fa1_fast.py  the same schedule register-tiled on the CUDA cores (fp32 fast path)
    fa1_tc.py    the same schedule on the tensor cores (fp16, bf16), with fa1_tc.cu
    fa2.py       FlashAttention-2, one block per query block: the plain reference kernel
    fa2_fast.py  the same schedule register-tiled on the CUDA cores (fp32 fast path)
    fa2_tc.py    the same schedule on the tensor cores (fp16, bf16; any d <= 256), with fa2_tc.cu
    fa2_varlen.py  the plain fa2 schedule on packed variable-length batches (cu_seqlens),
                 one launch (gpu.attention_varlen)
    _band.py     the causal / local-window band (N_q != N_k, bottom-right aligned) that
                 every kernel above masks and skips tiles by

`gpu.attention` picks among them; each has an instrumented build whose own element
counts equal iosim's ledger.
"""
from .._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads
