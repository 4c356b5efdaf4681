"""Time model of gpu.decode's kernels (split-KV decoding): see predict_decode."""
from __future__ import annotations

import hashlib
import json

#: the fields of a decode_bench row that name its configuration (the split's key)
SPLIT_KEY_FIELDS = ("batch", "heads", "kv_heads", "seq_len_q", "seq_len_kv", "d", "dtype",
                    "paged", "kv_reads", "num_splits", "schedule", "sweep")


def split_of(row: dict) -> str:
    """"heldout" or "fit" for a measured decode_bench row.

    Fixed before any fitting (committed first, on its own, before any constant was fitted):
    key = json.dumps({k: row.get(k) for k in SPLIT_KEY_FIELDS}, sort_keys=True); the row
    is held out when the first byte of sha256(key) is odd, else it is in the fit half."""
    key = json.dumps({k: row.get(k) for k in SPLIT_KEY_FIELDS}, sort_keys=True)
    return "heldout" if hashlib.sha256(key.encode()).digest()[0] % 2 else "fit"
