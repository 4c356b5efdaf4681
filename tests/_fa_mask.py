"""flash-attn's documented attention mask, the independent reference the flash-attn
interface tests (NumPy and torch CPU tensors) build their float64 attention on."""
import numpy as np


def fa_mask(Nq, Nk, causal, window):
    """flash-attn's documented mask, (Nq, Nk) bool, from its rules (not iosim's): query
    row i sits at key position i + Nk - Nq (bottom-right aligned); window = (left, right),
    -1 unbounded."""
    # flash-attn's C++ resets a side >= seqlen_k to -1 (unbounded) before masking
    left, right = (-1 if w >= Nk else w for w in window)
    i = np.arange(Nq)[:, None] + Nk - Nq
    j = np.arange(Nk)[None, :]
    keep = np.ones((Nq, Nk), bool)
    if causal:
        keep &= j <= i
    if left >= 0:
        keep &= j >= i - left
    if right >= 0 and not causal:
        keep &= j <= i + right
    return keep
