"""The append kernel: write N_q new K/V rows per sequence into the KV cache before the
attention (flash_attn_with_kvcache(k=, v=) semantics; iosim.decode's "append" step).

Grid (batch,), one block per sequence b, NT threads. With n = cache_seqlens[b] (read from
the device), the block copies K_new[b], V_new[b] ((kv_heads, N_q, d), every K/V head) into
cache rows [n, n + N_q): contiguous, k[b, g, n + r, :]; paged, k[page, (n + r) % P, g, :]
with page = block_table[b, (n + r) // P], each block-table entry of the pages the N_q rows
touch read once (by one thread each, into shared memory: a page holds every K/V head).
Thread 0 also writes seen[b] = n + N_q, the lengths the attention kernel then reads
(the caller's cache_seqlens are left as they are, as flash-attn leaves them).

flash-attn fuses the append into its attention kernel; flashsim launches it separately,
first, in the same `gpu.decode` call: the cache traffic is the same (N_q rows a sequence
and K/V head read from K_new / V_new and written into K / V), the block-table entries of
the append are read once more than a fused kernel would. Elements are copied as stored
(no rounding; bf16 as its bits).

Counting (count=True): K_new, V_new reads, K, V writes, block_table reads, in elements,
into the decode counters (rows in iosim.decode's DECODE_ORDER); the lengths are not
counted (as no kernel argument is).
"""
from __future__ import annotations

from numba import cuda, int32, int64

from iosim.decode import DECODE_ORDER, MAX_N_Q

from .._launch import READ, WRITE, add_count, kernel_name, specialisation

C = {name: i for i, name in enumerate(DECODE_ORDER)}


@specialisation
def append_kernel(d, N_q, paged, count, NT):
    """Kernel(k_new, v_new, k, v, block_table, cache_seqlens, seen, P, counters).

    k_new, v_new: (batch, kv_heads, N_q, d); k, v: the cache, (batch, kv_heads, N_alloc,
    d) contiguous or (num_pages, P, kv_heads, d) paged through block_table (batch, pages)
    int32; cache_seqlens (batch,) int32, the lengths before the append; seen (batch,)
    int32, written n + N_q; P int64 page rows (1 when contiguous). Grid (batch,)."""
    IKN, IVN, IK, IV, IBT = C["K_new"], C["V_new"], C["K"], C["V"], C["block_table"]
    NPG = MAX_N_Q                       # N_q rows touch at most N_q pages

    def kernel(k_new, v_new, k, v, block_table, cache_seqlens, seen, P, counters):
        b = cuda.blockIdx.x
        t = cuda.threadIdx.x
        Hk = k_new.shape[1]
        n = int64(cache_seqlens[b])
        phys = cuda.shared.array(NPG, int32)
        nBT = int64(0)
        nE = int64(0)
        j0 = n // P
        if paged:
            npg = (n + N_q - 1) // P - j0 + 1
            for j in range(t, npg, NT):
                phys[j] = block_table[b, j0 + j]
                if count:
                    nBT += 1
            cuda.syncthreads()
        for i in range(t, Hk * N_q * d, NT):
            g = i // (N_q * d)
            r = (i // d) % N_q
            x = i % d
            if paged:
                pos = n + r
                pg = phys[pos // P - j0]
                k[pg, pos % P, g, x] = k_new[b, g, r, x]
                v[pg, pos % P, g, x] = v_new[b, g, r, x]
            else:
                k[b, g, n + r, x] = k_new[b, g, r, x]
                v[b, g, n + r, x] = v_new[b, g, r, x]
            if count:
                nE += 1
        if t == 0:
            seen[b] = int32(n + N_q)
        if count:
            add_count(counters, IKN, READ, nE)
            add_count(counters, IVN, READ, nE)
            add_count(counters, IK, WRITE, nE)
            add_count(counters, IV, WRITE, nE)
            add_count(counters, IBT, READ, nBT)

    return kernel, kernel_name("decode_append", d=d, nq=N_q, paged=paged, count=count, t=NT)


__all__ = ["append_kernel"]
