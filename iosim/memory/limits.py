"""What the L2 / DRAM model can lay out: the size of a problem it takes (`levels_size_error`),
checked at `pass_levels`' entry and by `flashsim traffic --levels` before it runs."""
from __future__ import annotations


#: What the L2 / DRAM model (iosim.memory) can lay out. It builds arrays over every
#: thread block of a launch (max(T_r, T_c) x batch x heads, T_r = ceil(N / B_r),
#: T_c = ceil(N / B_c)) and, for standard's tile kernels, over the T_r x T_c tiles of one
#: head before it coarsens them. Measured on one core: the causal fa2 forward at 2^22
#: thread blocks took 3.5 GB and 20 s; standard at 2^27 tiles 3.5 GB and 10 s; beyond
#: them it runs out of memory (N = 10^12: 58 GB for one array over fa2's query blocks).
LEVELS_MAX_BLOCKS = 1 << 22
LEVELS_MAX_TILES = 1 << 27


def levels_size_error(algorithm: str, problem, tiling, *, names=("--seq-len", "--batch x --heads",
                                                                 "--levels")) -> str | None:
    """None if the L2 / DRAM model can take the problem at this tiling (LEVELS_MAX_BLOCKS,
    LEVELS_MAX_TILES), else a one-line error naming the sequence length and the largest
    the model takes at these batch, heads and tiling (or batch x heads, when no length
    fits). names: what the message calls N, batch x heads and the model (the model's own
    entry: ("N", "batch x heads", "the L2 / DRAM model"))."""
    n_name, i_name, what = names
    N, I, B_r, B_c = problem.N, problem.instances, tiling.B_r, tiling.B_c
    T_r, T_c = tiling.T_r(N), tiling.T_c(problem.N_k)   # (K/V tiles: N_k rows)
    blocks, tiles = max(T_r, T_c) * I, (T_r * T_c if algorithm == "standard" else 0)
    if blocks <= LEVELS_MAX_BLOCKS and tiles <= LEVELS_MAX_TILES:
        return None
    rule = (f"the L2/DRAM model lays out every thread block, max(ceil(N/B_r), ceil(N/B_c)) x "
            f"batch x heads (B_r={B_r}, B_c={B_c}), at most {LEVELS_MAX_BLOCKS:,}"
            + (f", and standard's ceil(N/B_r) x ceil(N/B_c) tiles of a head, at most "
               f"{LEVELS_MAX_TILES:,}" if algorithm == "standard" else ""))
    per = LEVELS_MAX_BLOCKS // I
    if per == 0:
        return (f"{i_name} = {I:,} is too large for {what}: {rule}; allowed: "
                f"batch x heads <= {LEVELS_MAX_BLOCKS:,}")
    n_max = per * min(B_r, B_c)
    if algorithm == "standard":           # ceil(N/B_r) ceil(N/B_c) grows with N: bisect
        lo, hi = 0, n_max
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tiling.T_r(mid) * tiling.T_c(mid) <= LEVELS_MAX_TILES:
                lo = mid
            else:
                hi = mid - 1
        n_max = lo
    got = f"{blocks:,} thread blocks" + (f" and {tiles:,} tiles" if tiles else "")
    return (f"{n_name}={N} is too large for {what} ({got}): {rule}; allowed: {n_name} <= "
            f"{n_max:,} at batch={problem.batch}, heads={problem.heads} and this tiling")
