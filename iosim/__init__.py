"""iosim: the host-side HBM-traffic model of exact attention.

Problem (what), Hardware (where), Tiling (how it is cut), schedule (in what order):
`execute` runs a schedule for real through a counting memory; `closed_form` gives the
same ledger by formula. See README.md for the counting conventions. Below the ledger:
`kernel_plan` (which kernel launches a pass runs, `iosim.launch`), `levels` (the bytes at
L2 and DRAM, `iosim.memory`), `predict_time` and `predict_decode` (the kernels' time,
`iosim.timing`).
"""
from .backward import (BACKWARD, BackwardExecution, BackwardLedger, backward_closed_form,
                       backward_closed_form_arrays, execute_backward, reference_attention_backward)
from .decode import (DECODE, KV_READS, DecodeExecution, DecodeLedger, DecodeProblem, SplitChoice,
                     choose_num_splits, combine_partials, decode_closed_form, execute_decode,
                     pages_touched, paged_cache, random_decode_inputs, reference_decode,
                     split_bounds)
from .dropout import keep_mask, philox4x32, problem_keep_mask
from .closed_form import closed_form, closed_form_arrays, floor_sum, tile_sums
from .hardware import PRESETS, Hardware, get_hardware
from .ledger import CountingMemory, Ledger
from .problem import DTYPES, MAX_HEAD_DIM, ConfigError, Problem, check_dtype, check_head_dim
from .reference import (element_mask, reference_attention, rounder, rounding_model_attention,
                        rounding_model_backward)
from .schedules import FORWARD, Execution, active_tiles, block_bounds, execute, random_inputs
from .varlen import (VarlenExecution, VarlenLedger, VarlenProblem, check_cu_seqlens,
                     execute_varlen, random_varlen_inputs, reference_varlen,
                     varlen_closed_form, varlen_backward_closed_form,
                     execute_varlen_backward, reference_varlen_backward,
                     VarlenBackwardExecution)
from .gpt2 import flash_passes, gpt2_table, standard_passes
from .tiling import (ALGORITHMS, Tiling, check_tiling_fits, paper_tiling, resolve_tiling,
                     sram_footprint_bytes, sram_to_elements)
from .launch.plan import kernel_plan

__all__ = [
    "BACKWARD", "BackwardExecution", "BackwardLedger", "backward_closed_form",
    "backward_closed_form_arrays", "execute_backward", "reference_attention_backward",
    "DECODE", "KV_READS", "DecodeExecution", "DecodeLedger", "DecodeProblem", "SplitChoice",
    "choose_num_splits", "combine_partials", "decode_closed_form", "execute_decode",
    "pages_touched", "paged_cache", "random_decode_inputs", "reference_decode", "split_bounds",
    "flash_passes", "gpt2_table", "standard_passes",
    "keep_mask", "philox4x32", "problem_keep_mask",
    "ALGORITHMS", "DTYPES", "MAX_HEAD_DIM", "check_head_dim", "PRESETS", "ConfigError",
    "CountingMemory", "Execution", "FORWARD",
    "Hardware", "Ledger", "Problem", "Tiling", "active_tiles", "block_bounds", "check_dtype",
    "check_tiling_fits",
    "closed_form", "closed_form_arrays", "element_mask", "execute", "floor_sum", "get_hardware",
    "paper_tiling", "random_inputs", "reference_attention", "resolve_tiling", "rounder",
    "rounding_model_attention", "rounding_model_backward",
    "sram_footprint_bytes", "sram_to_elements", "tile_sums",
    "VarlenExecution", "VarlenLedger", "VarlenProblem", "check_cu_seqlens", "execute_varlen",
    "random_varlen_inputs", "reference_varlen", "varlen_closed_form",
    "varlen_backward_closed_form", "execute_varlen_backward", "reference_varlen_backward",
    "VarlenBackwardExecution",
    "kernel_plan", "levels", "predict_time", "predict_decode",
]

#: the L2 / DRAM and time models' entry points, imported on first use: those models compile
#: with Numba, and `import iosim` leaves numba unimported (its CUDA simulator switch,
#: NUMBA_ENABLE_CUDASIM, is read when numba is first imported)
_LAZY = {"levels": "passes", "predict_time": "timing", "predict_decode": "timing"}


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'iosim' has no attribute {name!r}")
