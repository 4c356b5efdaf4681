"""The ledger: HBM reads and writes per tensor, in elements and bytes.

Counting conventions (stated once; README repeats them):
  * A read (write) of one element is one element loaded from (stored to) global memory
    by the kernel that runs the schedule. Ragged blocks count their valid rows only.
  * Counts are stored as totals for the whole problem (batch x query heads). Every
    instance does the same work, so per head = total / (batch * heads).
  * Grouped K/V heads: each query head reads its group's K and V itself, so K and V
    reads are counted per query head (as the kernels read them), not per K/V head.
  * Bytes = elements x the tensor's itemsize: the problem dtype for Q, K, V, O, S, P,
    dO, dQ, dK, dV, dS, dP; 4 (float32) for the statistics l, m, L, D.
  * The L2 cache is not modelled: these are the accesses the algorithm requests from
    HBM, the paper's "HBM accesses". What reaches DRAM on a real chip can be fewer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .problem import Problem
from .tiling import Tiling

#: Canonical order of tensor names in tables.
TENSOR_ORDER = ("Q", "K", "V", "O", "S", "P", "Z", "l", "m", "L",
                "dO", "D", "dS", "dP", "dQ", "dK", "dV")


class TrafficCounts:
    """Reads and writes per tensor (elements, problem totals) and their bytes: the
    accounting shared by every ledger (Ledger, BackwardLedger, iosim.decode.DecodeLedger).
    A ledger has `reads`, `writes` ({tensor: elements}) and `problem` (with `instances`
    and `itemsize_of`); ORDER is the order of tensors in tables, NAME_WIDTH the width of
    their column."""

    ORDER: tuple = TENSOR_ORDER
    NAME_WIDTH: int = 7

    def tensors(self) -> list[str]:
        names = set(self.reads) | set(self.writes)
        order = [t for t in self.ORDER if t in names]
        return order + sorted(names - set(order))

    def counts(self) -> dict:
        """{tensor: (read elements, write elements)} with zero entries dropped: for equality."""
        out = {}
        for t in self.tensors():
            r, w = int(self.reads.get(t, 0)), int(self.writes.get(t, 0))
            if r or w:
                out[t] = (r, w)
        return out

    @property
    def read_elements(self) -> int:
        return int(sum(self.reads.values()))

    @property
    def write_elements(self) -> int:
        return int(sum(self.writes.values()))

    def itemsize_of(self, tensor: str) -> int:
        """Bytes per element of a tensor in HBM."""
        return self.problem.itemsize_of(tensor)

    def read_bytes_of(self, tensor: str) -> int:
        return int(self.reads.get(tensor, 0)) * self.itemsize_of(tensor)

    def write_bytes_of(self, tensor: str) -> int:
        return int(self.writes.get(tensor, 0)) * self.itemsize_of(tensor)

    @property
    def hbm_read_bytes(self) -> int:
        return sum(self.read_bytes_of(t) for t in self.tensors())

    @property
    def hbm_write_bytes(self) -> int:
        return sum(self.write_bytes_of(t) for t in self.tensors())

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def hbm_bytes_per_head(self) -> int | float:
        """Bytes per (batch, query head) pair: an exact int where every instance does the
        same work (the total divides evenly, as for every uniform problem); otherwise
        (iosim.varlen: sequences of different lengths) the mean, a float."""
        q, r = divmod(self.hbm_bytes, self.problem.instances)
        return q if r == 0 else self.hbm_bytes / self.problem.instances

    def per_tensor(self) -> dict:
        """{tensor: {read_elements, write_elements, read_bytes, write_bytes}} (totals)."""
        return {t: {"read_elements": int(self.reads.get(t, 0)),
                    "write_elements": int(self.writes.get(t, 0)),
                    "read_bytes": self.read_bytes_of(t),
                    "write_bytes": self.write_bytes_of(t)} for t in self.tensors()}

    def table(self) -> str:
        """A readable per-tensor table (bytes are problem totals). Columns are at least
        16 / 18 characters wide and grow with the longest figure, so they stay apart at
        any size."""
        rows = [(name, c["read_elements"], c["write_elements"], c["read_bytes"],
                 c["write_bytes"]) for name, c in self.per_tensor().items()]
        rows.append(("total", self.read_elements, self.write_elements, self.hbm_read_bytes,
                     self.hbm_write_bytes))
        head = ("tensor", "read elems", "write elems", "read bytes", "write bytes")
        widths = [max([self.NAME_WIDTH] + [len(r[0]) + 1 for r in rows])]
        for k, least in zip(range(1, 5), (16, 16, 18, 18)):
            widths.append(max([least] + [len(f"{r[k]:,}") + 2 for r in rows]))
        lines = [f"{head[0]:<{widths[0]}}" + "".join(f"{h:>{w}}" for h, w in
                                                     zip(head[1:], widths[1:]))]
        for r in rows:
            lines.append(f"{r[0]:<{widths[0]}}" + "".join(f"{v:>{w},}" for v, w in
                                                          zip(r[1:], widths[1:])))
        return "\n".join(lines)


@dataclass(frozen=True)
class Ledger(TrafficCounts):
    """HBM traffic of one schedule on one problem. Element counts are problem totals."""

    algorithm: str
    problem: Problem
    tiling: Tiling
    reads: dict = field(default_factory=dict)    # tensor -> elements read (total)
    writes: dict = field(default_factory=dict)   # tensor -> elements written (total)

    def to_dict(self) -> dict:
        from .tiling import sram_footprint_bytes
        p, t = self.problem, self.tiling
        out = {
            "algorithm": self.algorithm,
            "batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads,
            "seq_len": p.N, "head_dim": p.d, "dtype": p.dtype, "causal": p.causal,
            "seq_len_kv": p.N_k, "window": list(p.window),   # key rows N_k; (left, right)
            "block_sparse": p.block_mask is not None,
            **({"dropout_p": p.dropout_p} if p.dropout_p else {}),
            "block_rows": t.B_r, "block_cols": t.B_c,
            "hbm_read_bytes": self.hbm_read_bytes,
            "hbm_write_bytes": self.hbm_write_bytes,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bytes_per_head": self.hbm_bytes_per_head,
            "per_tensor": self.per_tensor(),
        }
        if self.algorithm in ("standard", "fa1", "fa2"):
            out["sram_footprint_bytes"] = sram_footprint_bytes(self.algorithm, t.B_r, t.B_c, p.d, p.dtype)
        return out


class CountingMemory:
    """HBM as a dict of named arrays, every access counted in elements.

    `read(name, rows, cols)` returns a copy of the addressed block and adds its size to
    the read count; `write` stores a block and adds to the write count. One memory may
    serve several instances in turn (`alloc` swaps the arrays); counts accumulate.
    """

    #: The current instance's dropout keep mask (N_q, N_k) bool, or None: what the fused
    #: kernels regenerate on chip (iosim.dropout), so reading it is not counted.
    keep = None

    #: The access trace, or None (the default: nothing recorded). `record()` starts one: a
    #: list, in program order, of ("r" | "w", tensor, (r0, r1, c0, c1), elements) for each
    #: access (rows r0:r1, columns c0:c1 of the tensor; a 1-D tensor has columns 0:1) and
    #: the schedules' ("mark", kernel, cta, tile) entries (`mark`). Recording changes no
    #: count; it feeds the explorer page (analysis.explore).
    trace = None

    def __init__(self, **arrays):
        self.arrays = dict(arrays)
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}

    def alloc(self, name, array):
        self.arrays[name] = array

    def record(self) -> "CountingMemory":
        """Start recording the access trace (`trace`); returns self."""
        self.trace = []
        return self

    def mark(self, kernel: str, cta, tile=None) -> None:
        """Where the schedule is: the accesses that follow belong to thread block `cta` of
        kernel `kernel`, working on S tile `tile` = (i, j) (i = -1: key block j as a
        whole; j = -1: query block i as a whole; None: no tile). Recorded only while
        `trace` is on; free otherwise."""
        if self.trace is not None:
            self.trace.append(("mark", kernel, cta, tile))

    def _span(self, name: str, index) -> tuple:
        """(start, stop) of each axis of an access to `name` at `index`, flattened: (r0,
        r1, c0, c1) for a matrix, (r0, r1, 0, 1) for a vector; an integer index i is
        (i, i + 1), a missing one the whole axis (decode's tensors have more axes)."""
        shape = self.arrays[name].shape
        spans = []
        for axis in range(max(2, len(shape))):
            n = shape[axis] if axis < len(shape) else 1
            s = index[axis] if axis < len(index) else slice(None)
            if isinstance(s, slice):
                start, stop, _ = s.indices(n)
            else:
                start, stop = int(s), int(s) + 1
            spans += [start, stop]
        return tuple(spans)

    def read(self, name: str, *index):
        block = self.arrays[name][index if index else slice(None)]
        self.reads[name] = self.reads.get(name, 0) + block.size
        if self.trace is not None:
            self.trace.append(("r", name, self._span(name, index), block.size))
        return block.copy()

    def write(self, name: str, value, *index):
        target = self.arrays[name]
        idx = index if index else slice(None)
        dst = target[idx]
        self.writes[name] = self.writes.get(name, 0) + dst.size
        if self.trace is not None:
            self.trace.append(("w", name, self._span(name, index), dst.size))
        target[idx] = value

    def ledger(self, algorithm: str, problem: Problem, tiling: Tiling, multiplier: int = 1) -> Ledger:
        """The counts so far as a Ledger; `multiplier` scales them (e.g. to problem totals
        when only one instance was executed)."""
        return Ledger(algorithm, problem, tiling,
                      {t: c * multiplier for t, c in self.reads.items()},
                      {t: c * multiplier for t, c in self.writes.items()})
