"""Decoding against a KV cache: N_q = 1..16 new query rows per sequence, N_kv cache rows.

What runs (the schedules of iosim.decode, counted exactly; `gpu.decode` picks them):

* `split_kv.decode_kernel`, the main kernel. FlashAttention-2's forward reduced to one
  query block of N_q rows: a thread block ("reader") loads Q once, streams K_j, V_j
  (the paper's B_c-row blocks, here TB-row tiles) through an online softmax with the
  running max m and sum l, and writes O = acc / l and L = m + log l. With num_splits
  S = 1 it is the `fa2_decode` schedule: one block per reader writes O and L directly.
  With S > 1 it is Flash-Decoding's split-KV step (Dao et al., "Flash-Decoding for
  long-context inference", 2023): the cache is cut into S chunks of ceil(N_kv / S)
  rows, one block per (split, reader), so that batch x heads x S blocks fill the SMs
  when batch x heads alone would not; each writes its partial output Opart[s] and
  log-sum-exp Lpart[s] in float32.
  Readers: kv_reads="per_query_head" (a block per (batch, query head), each reading
  its group's K/V, as the forward kernels do) or "per_group" (a block per (batch, K/V
  head) serving all G query heads of the group: K/V read once; GQA / MQA decoding).
  Paged cache (vLLM's PagedAttention, flash-attn's block_table): the block walks the
  pages its chunk touches, reading one int32 block-table entry per page.
* `split_kv.combine_kernel` (S > 1): Flash-Decoding's reduction, one block per (batch,
  query head): M = max_s Lpart_s, w_s = exp(Lpart_s - M), O = sum_s w_s Opart_s /
  sum_s w_s, L = M + log sum_s w_s.
* `append.append_kernel` (gpu.decode(k=, v=)): first, one block per sequence writes the
  N_q new K/V rows into the cache at rows [cache_seqlens[b], cache_seqlens[b] + N_q)
  (through the block table when paged) and the lengths the attention then sees into a
  device array (flash-attn fuses this into its attention kernel; flashsim launches it
  separately, in the same call).

Ragged batches: the main kernel reads each sequence's length from an int32 device array
(per-sequence cache_seqlens, or the one N_kv for every sequence) and cuts that sequence
into S chunks of its own; a block with an empty chunk reads nothing.

The tiled main kernel and `flat.flat_kernel` (the default wherever the tensor-core kernel
does not apply: each lane group streams its own key rows, no barrier in the key loop) run
on the CUDA cores; `tc.tc_kernel` (the default in fp16 and bf16 at d = 16, 64, 128;
iosim.launch.decode.main_kernel) puts a K/V head's G x N_q query rows on
the M side of one tensor-core tile and streams K/V through each warp's cp.async pipeline:
on grouped heads the CUDA-core kernels are bound by issuing G multiply-adds per element
loaded (Nsight Compute), where the tensor-core one reached 81-91 % of the HBM peak on
large caches (docs/decoding.md). `api.decode` checks inputs, chooses num_splits
(iosim.choose_num_splits for the GPU's SM count) and returns the kernels' own counts as
an iosim.decode.DecodeLedger (count_traffic=True); `api.DecodeLauncher` holds one
configuration's launches for repeated calls on preallocated arrays (benchmarks).

`gpu.decode` is this package and is callable: `gpu.decode(q, k_cache, v_cache, ...)` is
`gpu.decode.api.decode(...)` (same signature and docstring via `gpu.decode.decode`), so
the function and its modules (`gpu.decode.split_kv`, `gpu.decode.api`) share one name
without one shadowing the other.
"""
from .._env import use_backend
use_backend()   # first: GPU or Numba's simulator, settled before numba.cuda loads
import inspect as _inspect
import sys as _sys
import types as _types

from .api import DecodeLauncher, auto_num_splits, counters_to_decode_ledger, decode

__all__ = ["decode", "DecodeLauncher", "auto_num_splits", "counters_to_decode_ledger"]


class _CallablePackage(_types.ModuleType):
    """This package's type: calling the package calls api.decode."""

    def __call__(self, *args, **kwargs):
        return decode(*args, **kwargs)


__signature__ = _inspect.signature(decode)
_sys.modules[__name__].__class__ = _CallablePackage
