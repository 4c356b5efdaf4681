"""The L2 model's constants (`L2Model`) and one launch's predicted DRAM bytes (`KernelTraffic`).

The model: an access finds its tile resident in a least-recently-used cache of effective
capacity C = capacity_fraction x the preset's L2 bytes, whose lines are hashed over sets of
`associativity` ways, with probability

    P(hit | D) = P[Poisson(A D / C) <= A - 1]        (A = associativity)

where D is the LRU stack distance (distinct bytes touched since the tile's last access).
DRAM reads = sum over reads of bytes x P(miss | D_prev), the first touch always missing
(cold L2); DRAM writes = sum over writes of bytes x P(evicted before the next access |
D_next). The other constants (footprints of shared tiles, the dirty cap, the drain at the
kernel's end, the lagging part of a wave, the private round trips' edge, the background
writes) are described field by field below. Units: bytes, whole problem, one launch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class L2Model:
    """The L2 model's constants (see the module docstring).

    capacity_fraction: effective capacity C as a fraction of the preset's L2 bytes (the
        H100's L2 is two partitions; data shared by all SMs is cached near each, which
        halves the capacity a shared stream sees).
    associativity: ways of the hashed set-associative cache the stack distance is
        compared with (softness of the capacity edge).
    max_accesses: budget of simulated accesses per kernel (coarsening beyond it).
    policy: "lru" (the hashed set-associative LRU above) or "random" (random replacement,
        `_random_replacement`).
    replicate: count each tile's footprint as the two-partition L2 holds it: a line is
        cached in its home partition and, when an SM of the other partition reads it, in
        that SM's partition too, so a tile shared by CTAs on both partitions occupies twice
        its bytes. private_footprint: the same factor for a tile only one CTA touches
        (1.5 if half its lines gained a near copy; the fit preferred 1.0). Distances are
        then these footprints.
    keep_fraction: rho of the insertion policy's protection of a cyclic working set
        larger than C (BIP / DIP-like adaptive insertion, or random replacement): an
        access at stack distance D > C still hits with probability rho x C / D (a loop of
        footprint F > C keeps about C of its F bytes), where the LRU would miss:
        P(hit | D) = max(P_lru(D), rho x min(1, C / D)). 0: plain (set-associative) LRU.
    shared_footprint: with replicate, the bytes a shared tile (read by CTAs on both
        partitions) occupies per byte: 2 if every far copy were kept as long as its home
        copy; less where the L2 drops clean duplicates first (the far copy of a line whose
        home partition still holds it), so that a shared stream fills the cache more
        slowly than twice its bytes.
    drain_fraction: the part of the dirty data resident at the kernel's end that reaches
        DRAM inside the measured kernel, at most drain_fraction x the L2's bytes (the
        write-back as the kernel retires; 2-3 MB measured on the H100). 0: none (the
        dirty lines at the end are never counted).
    once_footprint / once_write_footprint: what-ifs (tried for v5 and dropped; < 0: off):
        a tile accessed only once in the launch and only read (Q) / only written (O, S)
        counts this fraction of its bytes in other tiles' distances (streaming data
        inserted for early eviction).
    refetch_factor / refetch_capacity: what-if (tried for v5 and dropped; 1: off): a
        re-read of a shared tile costs, beyond its miss probability, (refetch_factor - 1)
        x P(miss | D against refetch_capacity x C) more DRAM fetches (each L2 partition
        fetching a shared line for its own SMs once the stream thrashes far beyond C).
    private_associativity: what-if (tried for v5 and dropped; 0: off): the ways of the
        capacity edge for tiles one CTA touches (fa1's O, l, m round trips), where
        `associativity` then sets it for shared tiles only (a replacement policy that
        protects lines with many hits would keep the K/V of a wave up to a hard edge).
    home_written: with replicate, the written part of a shared tile (wb bytes of a tile
        accessed with wr: stores, atomics / reductions such as the fa2 backward's dQ
        accumulator) counts once: writes are resolved at the line's home partition, its
        point of coherence, so only clean read data gains a copy in the far partition.
        Its footprint is then shared_footprint x nbytes - (shared_footprint - 1) x wb.
    dirty_fraction: the L2 keeps at most C_w = dirty_fraction x the L2's bytes of dirty
        data; beyond that the oldest dirty lines are cleaned (written to DRAM, kept valid,
        so reads still hit). A write then reaches DRAM if the tile is evicted before its
        next access (stack distance vs C) or cleaned before its next write: the distinct
        bytes *written* between the two (the dirty stack distance) exceed C_w, with the
        same set-associative softness. 0: no cap (dirty lines leave only by eviction).
    local_memory: count the local-memory traffic of builds whose frames overflow the L1
        (`sweep_kernel`'s local_frame_bytes; `iosim.launch.plan.LOCAL`): the frame of each
        SM slot re-read and rewritten in L2 at every step. False: local memory is not
        modelled beyond a frame written once per CTA (v5).
    dirty_associativity: what-if (tried for v6 and dropped; 0: off): the ways of the
        dirty cap's edge (the dirty stack distance against C_w); 0: `associativity`.
    partial_refetch: a coarse tile (a group of consecutive tiles, `sweep_kernel`) that one
        access touches in part (a causal prefix ending inside the group, a backward
        suffix starting inside it) and the next in full: the part the first did not touch
        is charged from the access before it (`_partial_refetch`), not counted as a hit.
        False (v5): the coarse tile's later full access hits on the partial one, and the
        rest of the group's bytes are lost (the causal fa2 forward's sweeps
        under-predicted by up to 20 %).
    sweep_lag: the lagging part of a wave (v8; 0: off): in the sweeps of the fa2 forward
        where two or more CTAs share an SM and all sweeps have the same length (not
        causal), each cohort of CTAs that start together is taken as a leading and a
        lagging part, the lagging one reading each K/V tile again sweep_lag x the sweep's
        length later (`sweep_kernel`'s lag). The re-read hits while the bytes touched in
        between (2 x lag x the K/V of every head the wave sweeps: one head, or the end of
        one and the start of the next) fit in C, and misses (a second DRAM fetch of the
        tile in that wave) beyond; its access also leaves each tile more recent, so the next
        wave's reuse distance is shorter (the first passes past capacity fetch less).
    causal_lag: the lagging part of the causal sweeps (v9; 0: off): as sweep_lag, in the
        causal fa2 forward where two or more CTAs share an SM (the heaviest query blocks
        first, every sweep of its own length, so that each CTA is its own cohort): each
        K/V tile read again causal_lag x the CTA's sweep length later. Small (v9: 0.03,
        against sweep_lag 0.35 for the non-causal cohorts): past capacity the second read
        costs a K/V fetch more of the long sweeps (N = 81-131K: -10 % to -20 % in v8), below
        it it only leaves the tiles more recent.
    private_rmw_capacity: the capacity edge of private read-modify-write round trips (a
        tile one CTA reads and writes in the same access: fa1's O_i, l_i, m_i, the
        local-memory frames) at this fraction of C (v10: 0.93; 1: off). With it
        `iosim.memory` gives fa1's Q_i a tile of its own (read only), so that the
        written half of each round trip leaves the cache first: fa1's intermediate writes
        reach DRAM at about twice the rate its re-reads miss near its working set.
    private_read_capacity: what-if (tried for v10 and dropped; 1: off): the same for
        private read-only re-reads (fa1's Q_i).
    background_write_rate: DRAM writes (bytes per second of kernel time) that the
        counters see beside the kernel's own write-backs (`iosim.memory` adds
        rate x the time model's predicted duration of each launch). Measured: the
        residual writes of second-long kernels grow with their duration at 21-25 MB/s on
        both chips (plain fa2 forward at N = 16384: 34 MB in 1.47 s, the plain backward
        56-64 MB in 2.64 s, fa1 fp32 at N = 8192: 121 MB in 4.76 s), whatever the kernel.
        0: none (v5).
    """
    capacity_fraction: float = 0.5
    associativity: int = 16
    max_accesses: int = 400_000
    policy: str = "lru"
    replicate: bool = False
    private_footprint: float = 1.5
    keep_fraction: float = 0.0
    dirty_fraction: float = 0.0
    home_written: bool = False
    shared_footprint: float = 2.0
    drain_fraction: float = 0.0
    once_footprint: float = -1.0
    once_write_footprint: float = -1.0
    refetch_factor: float = 1.0
    refetch_capacity: float = 1.0
    private_associativity: int = 0
    local_memory: bool = False
    dirty_associativity: int = 0
    partial_refetch: bool = False
    background_write_rate: float = 0.0
    sweep_lag: float = 0.0
    causal_lag: float = 0.0
    private_rmw_capacity: float = 1.0
    private_read_capacity: float = 1.0

    def __post_init__(self):
        if not 0 < self.capacity_fraction <= 2:
            raise ValueError(f"capacity_fraction={self.capacity_fraction!r} must be in (0, 2]")
        if int(self.associativity) != self.associativity or self.associativity < 1:
            raise ValueError(f"associativity={self.associativity!r} must be a positive integer")
        if self.policy not in ("lru", "random"):
            raise ValueError(f"policy={self.policy!r} is not known; allowed: lru, random")
        if not 0 <= self.keep_fraction <= 1 or not 0 <= self.dirty_fraction <= 2:
            raise ValueError(f"keep_fraction={self.keep_fraction!r} must be in [0, 1] and "
                             f"dirty_fraction={self.dirty_fraction!r} in [0, 2]")
        if not 0 <= self.drain_fraction <= 1 or not 1 <= self.shared_footprint <= 2:
            raise ValueError(f"drain_fraction={self.drain_fraction!r} must be in [0, 1] and "
                             f"shared_footprint={self.shared_footprint!r} in [1, 2]")
        if self.refetch_factor < 1 or self.refetch_capacity <= 0:
            raise ValueError(f"refetch_factor={self.refetch_factor!r} must be >= 1 and "
                             f"refetch_capacity={self.refetch_capacity!r} > 0")
        if self.background_write_rate < 0:
            raise ValueError(f"background_write_rate={self.background_write_rate!r} must be >= 0")
        if not 0 <= self.sweep_lag <= 1:
            raise ValueError(f"sweep_lag={self.sweep_lag!r} must be in [0, 1]")
        if not 0 <= self.causal_lag <= 1:
            raise ValueError(f"causal_lag={self.causal_lag!r} must be in [0, 1]")
        if not (0 < self.private_rmw_capacity <= 2 and 0 < self.private_read_capacity <= 2):
            raise ValueError(f"private_rmw_capacity={self.private_rmw_capacity!r} and "
                             f"private_read_capacity={self.private_read_capacity!r} must be "
                             f"in (0, 2]")
        if self.max_accesses < 1000:
            raise ValueError(f"max_accesses={self.max_accesses!r} must be >= 1000")


@dataclass(frozen=True)
class KernelTraffic:
    """Predicted DRAM bytes of one kernel launch (whole problem, cold L2)."""
    name: str
    dram_read_bytes: float
    dram_write_bytes: float
    slots: int
    accesses: int

    def to_dict(self):
        return {"name": self.name, "dram_read_bytes": self.dram_read_bytes,
                "dram_write_bytes": self.dram_write_bytes, "slots": self.slots,
                "simulated_accesses": self.accesses}
