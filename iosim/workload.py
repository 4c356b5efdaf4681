"""The attention traffic of a whole model: one `AttentionCall` per layer and step, recorded
while a model runs (`recording`, `record`: gpu.hf records every call its backend makes) or
built from a transformers-style config without running anything (`calls_from_config`), and
priced call by call (`traffic_table`): the exact ledger (iosim's closed forms), and where
the models below the ledger cover the call, the predicted DRAM bytes (`iosim.levels`) and
time (`iosim.predict_time`, `iosim.predict_decode`), else their one-line reason.

    with recording() as calls:          # every record(call) inside lands in `calls`
        model(input_ids)                # a model whose attention runs on gpu.hf's backend
    table = traffic_table(calls, "H100-SXM")

Byte counts are totals over the call's batch x heads; ledger bytes are exact integers,
DRAM bytes and times are model predictions (floats). A model's config is read only for the
shape of its attention (layers, heads, K/V heads, head dim d, sliding windows): see
`model_shape`; `load_config` reads a transformers config.json or one of the shapes in
model_configs.json (`KNOWN_CONFIGS`).
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from .backward import backward_closed_form
from .closed_form import closed_form
from .launch.decode import auto_num_splits, choose_kv_reads, main_kernel
from .decode import DECODE, KV_READS, DecodeProblem, check_num_splits, \
    decode_closed_form
from .hardware import PRESETS, get_hardware
from .launch.plan import kernel_plan
from .problem import ConfigError, Problem, check_dtype, check_head_dim
from .tiling import ALGORITHMS, Tiling
from .varlen import VarlenProblem, varlen_backward_closed_form, varlen_closed_form

#: the steps a call belongs to: a prompt's forward, one decoding step, a training step
STEPS = ("prefill", "decode", "train")
#: the attention kinds a layer may have (transformers' config.layer_types values)
LAYER_TYPES = ("full_attention", "sliding_attention")
CONFIGS_PATH = Path(__file__).resolve().parent / "model_configs.json"


def _bad(field_name: str, value, allowed: str) -> ConfigError:
    return ConfigError(f"{field_name}={value!r} is not allowed; allowed: {allowed}")


def _hardware(preset):
    """The Hardware preset named `preset` (case-insensitive), or a ConfigError naming it."""
    try:
        return get_hardware(preset)
    except ConfigError:
        raise _bad("preset", preset, ", ".join(PRESETS)) from None


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------------------
# One call and its recording
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionCall:
    """One attention call of a model: which layer, in which step, on which problem, run by
    which schedule and tiling.

    layer: decoder layer index, 0-based. step: "prefill", "decode" or "train".
    problem: an iosim Problem (forward or, with backward=True, the backward pass of a
        training step), an iosim.VarlenProblem (a packed batch: padded sequences with their
        padding dropped) or an iosim.decode.DecodeProblem (a decoding step against the
        cache).
    algorithm: the forward algorithm ("standard", "fa1", "fa2") for a Problem or a
        VarlenProblem, the decode schedule ("fa2_decode", "split_kv") for a DecodeProblem.
    tiling: (B_r, B_c) for a Problem or a VarlenProblem (a Tiling is taken too), None for
        a DecodeProblem.
    num_splits: split-KV splits S (decode; 1 for fa2_decode and for a Problem).
    kv_reads: grouped heads' K/V reads, "per_query_head" or "per_group" (decode).
    backward: the backward pass of this call (step "train" only).
    """

    layer: int
    step: str
    problem: object
    algorithm: str
    tiling: tuple | None
    num_splits: int = 1
    kv_reads: str = "per_query_head"
    backward: bool = False

    def __post_init__(self):
        if not _is_int(self.layer) or self.layer < 0:
            raise _bad("layer", self.layer, "an integer >= 0 (the decoder layer, 0-based)")
        object.__setattr__(self, "layer", int(self.layer))
        if not isinstance(self.step, str) or self.step not in STEPS:
            raise _bad("step", self.step, ", ".join(STEPS))
        if not isinstance(self.backward, (bool, np.bool_)):
            raise _bad("backward", self.backward, "True or False")
        object.__setattr__(self, "backward", bool(self.backward))
        if not isinstance(self.kv_reads, str) or self.kv_reads not in KV_READS:
            raise _bad("kv_reads", self.kv_reads, ", ".join(KV_READS))
        p = self.problem
        if isinstance(p, DecodeProblem):
            self._check_decode()
        elif isinstance(p, (Problem, VarlenProblem)):
            self._check_forward()
        else:
            raise _bad("problem", type(p).__name__,
                       "an iosim.Problem, an iosim.VarlenProblem or an "
                       "iosim.decode.DecodeProblem")

    def _check_decode(self):
        if self.step != "decode":
            raise _bad("step", self.step, "'decode' for a DecodeProblem")
        if not isinstance(self.algorithm, str) or self.algorithm not in DECODE:
            raise _bad("algorithm", self.algorithm,
                       f"{', '.join(DECODE)} (the decode schedules, for a DecodeProblem)")
        if self.tiling is not None:
            raise _bad("tiling", self.tiling, "None for a DecodeProblem (no tiling changes "
                                              "the decode ledger)")
        if self.backward:
            raise _bad("backward", self.backward, "False for a DecodeProblem")
        S = check_num_splits(self.problem.N_kv, self.num_splits)
        if self.algorithm == "fa2_decode" and S != 1:
            raise _bad("num_splits", S, "1 for algorithm='fa2_decode' (split_kv for more)")
        object.__setattr__(self, "num_splits", S)

    def _check_forward(self):
        algs = ("fa2",) if self.backward and isinstance(self.problem, VarlenProblem) \
            else ALGORITHMS             # iosim.varlen's backward is fa2's
        if not isinstance(self.algorithm, str) or self.algorithm not in algs:
            raise _bad("algorithm", self.algorithm,
                       f"{', '.join(algs)} (the forward algorithms, for a "
                       f"{type(self.problem).__name__})")
        t = self.tiling
        if isinstance(t, Tiling):
            t = (t.B_r, t.B_c)
        if not (isinstance(t, (tuple, list)) and len(t) == 2
                and all(_is_int(x) and x > 0 for x in t)):
            raise _bad("tiling", self.tiling, f"(B_r, B_c), two positive integers, for a "
                                              f"{type(self.problem).__name__}")
        object.__setattr__(self, "tiling", (int(t[0]), int(t[1])))
        if self.num_splits != 1 or isinstance(self.num_splits, bool):
            raise _bad("num_splits", self.num_splits, f"1 for a {type(self.problem).__name__} "
                                                      f"(splits are decode's)")
        if self.backward and self.step != "train":
            raise _bad("step", self.step, "'train' for a backward call")

    @property
    def pass_(self) -> str:
        """'fwd', 'bwd' or 'decode'."""
        if isinstance(self.problem, DecodeProblem):
            return "decode"
        return "bwd" if self.backward else "fwd"


#: the recordings open now, innermost last (`recording`); record() appends to each
_ACTIVE: list[list] = []
_LOCK = threading.Lock()


def record(call: AttentionCall) -> None:
    """Append `call` to every open recording (`recording()`); nothing happens outside one."""
    if not isinstance(call, AttentionCall):
        raise _bad("call", type(call).__name__, "an iosim.workload.AttentionCall")
    with _LOCK:
        for calls in _ACTIVE:
            calls.append(call)


@contextmanager
def recording() -> Iterator[list[AttentionCall]]:
    """`with recording() as calls:` collects every call recorded inside, in order. Nested
    recordings each get every call made while they are open."""
    calls: list[AttentionCall] = []
    with _LOCK:
        _ACTIVE.append(calls)
    try:
        yield calls
    finally:
        with _LOCK:
            # by identity: an equal (say, empty) list of an enclosing recording stays
            for i in range(len(_ACTIVE) - 1, -1, -1):
                if _ACTIVE[i] is calls:
                    del _ACTIVE[i]
                    break


# ---------------------------------------------------------------------------------------
# A model's shape, from its config
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What a model's attention looks like: layers, query heads, K/V heads, head dim d
    (elements), each layer's sliding window in keys (None: full causal attention; W: a
    query sees the W most recent keys, itself included, as transformers'
    sliding_window), and the config's context length (None where it gives none)."""

    name: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    windows: tuple
    max_positions: int | None = None
    model_type: str | None = None

    @property
    def sliding_layers(self) -> int:
        return sum(w is not None for w in self.windows)


#: config fields of attention this model does not describe: multi-head latent attention
#: (DeepSeek-V2/V3: a latent K/V cache, other head dims) and hybrid stacks whose layers
#: are not all attention (Jamba, Nemotron-H, Zamba), named by the field that marks them
NOT_MODELLED = {"kv_lora_rank": "multi-head latent attention (a latent K/V cache)",
                "attn_layer_period": "a hybrid stack (attention on some layers only)",
                "hybrid_override_pattern": "a hybrid stack (attention on some layers only)",
                "layers_block_type": "a hybrid stack (attention on some layers only)"}
#: encoder (bidirectional) models: no causal mask, no decoding
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra",
                 "deberta", "deberta-v2", "modernbert", "vit")

#: transformers' own aliases (GPT-2-style configs) of the fields read here
_ALIASES = {"num_hidden_layers": ("n_layer",), "num_attention_heads": ("n_head",),
            "hidden_size": ("n_embd",), "max_position_embeddings": ("n_positions",)}


def _get(config, key):
    """config[key] (a dict) or config.key (an object), through transformers' aliases;
    None where absent."""
    for k in (key,) + _ALIASES.get(key, ()):
        v = config.get(k) if isinstance(config, dict) else getattr(config, k, None)
        if v is not None:
            return v
    return None


def _field(config, key: str, *, required: bool = True, what: str = "a positive integer"):
    v = _get(config, key)
    if v is None:
        if required:
            raise ConfigError(f"config: {key} is missing; allowed: {what} (a transformers "
                              f"config field)")
        return None
    if not _is_int(v) or v <= 0:
        raise ConfigError(f"config: {key}={v!r} is not allowed; allowed: {what}")
    return int(v)


def model_shape(config, name: str | None = None) -> ModelShape:
    """The attention shape of a transformers-style config (a dict, e.g. a config.json
    loaded, or a config object): num_hidden_layers, num_attention_heads,
    num_key_value_heads (default: the heads), head_dim (default hidden_size // heads),
    max_position_embeddings (optional), and the sliding windows:
      layer_types (transformers >= 4.5x): "sliding_attention" layers take sliding_window,
          "full_attention" ones none; other kinds are refused;
      otherwise use_sliding_window=False: no window (Qwen2); max_window_layers (with
          use_sliding_window): layers from it on slide (Qwen2); sliding_window_pattern=P:
          every P-th layer full, the rest slide (Gemma-3, Cohere2); model_type "gemma2":
          even layers slide; any other config with sliding_window: every layer (Mistral).
    A multimodal config's text_config is read where the top level has no layers.
    Refused (ConfigError naming the field): multi-head latent attention and hybrid stacks
    (NOT_MODELLED), encoder models (ENCODER_TYPES, is_encoder_decoder)."""
    if not isinstance(config, dict) and not hasattr(config, "__dict__"):
        raise _bad("config", type(config).__name__,
                   "a dict (a config.json loaded) or a transformers config object")
    if _get(config, "num_hidden_layers") is None and _get(config, "text_config") is not None:
        config = _get(config, "text_config")
    for key, what in NOT_MODELLED.items():
        if _get(config, key) is not None:
            raise ConfigError(f"config: {key}={_get(config, key)!r} marks {what}, which "
                              f"this model does not describe; allowed: decoder-only configs "
                              f"of multi-head, grouped-query or multi-query attention")
    if _get(config, "is_encoder_decoder") is True or _get(config, "model_type") in ENCODER_TYPES:
        raise ConfigError(f"config: model_type={_get(config, 'model_type')!r} (is_encoder_"
                          f"decoder={_get(config, 'is_encoder_decoder')!r}) is not a "
                          f"decoder-only model; allowed: decoder-only (causal) configs")
    layers = _field(config, "num_hidden_layers")
    heads = _field(config, "num_attention_heads")
    kv = _field(config, "num_key_value_heads", required=False) or heads
    if heads % kv:
        raise ConfigError(f"config: num_key_value_heads={kv} is not allowed for "
                          f"num_attention_heads={heads}; allowed: a divisor of it")
    d = _get(config, "head_dim")
    if d is None:
        hidden = _field(config, "hidden_size", what="a positive integer (or give head_dim)")
        if hidden % heads:
            raise ConfigError(f"config: hidden_size={hidden} is not a multiple of "
                              f"num_attention_heads={heads}; allowed: a multiple, or head_dim")
        d = hidden // heads
    try:
        d = check_head_dim(d)
    except ConfigError:
        raise ConfigError(f"config: head_dim={d!r} is not allowed; allowed: integers 1..256 "
                          f"(the kernels' and the model's head dims)") from None
    windows = _windows(config, layers)
    mtype = _get(config, "model_type")
    return ModelShape(name or (str(mtype) if mtype else "config"), layers, heads, kv, d,
                      windows, _field(config, "max_position_embeddings", required=False),
                      None if mtype is None else str(mtype))


def _windows(config, layers: int) -> tuple:
    """Each layer's sliding window (keys) or None (full attention); see `model_shape`."""
    W = _get(config, "sliding_window")
    if W is not None and (not _is_int(W) or W <= 0):
        raise ConfigError(f"config: sliding_window={W!r} is not allowed; allowed: a positive "
                          f"integer (keys a query sees, itself included) or null")
    types = _get(config, "layer_types")
    if types is not None:
        if not isinstance(types, (list, tuple)) or len(types) != layers:
            raise ConfigError(f"config: layer_types has {len(types) if isinstance(types, (list, tuple)) else type(types).__name__} "
                              f"entries; allowed: a list of num_hidden_layers={layers} kinds")
        for i, t in enumerate(types):
            if t not in LAYER_TYPES:
                raise ConfigError(f"config: layer_types[{i}]={t!r} is not modelled; allowed: "
                                  f"{', '.join(LAYER_TYPES)}")
        if "sliding_attention" in types and W is None:
            raise ConfigError("config: layer_types has sliding_attention layers but "
                              "sliding_window is missing; allowed: a positive integer")
        return tuple(W if t == "sliding_attention" else None for t in types)
    if W is None or _get(config, "use_sliding_window") is False:
        return (None,) * layers
    if _get(config, "use_sliding_window") is True and _get(config, "max_window_layers") is not None:
        first = _get(config, "max_window_layers")
        if not _is_int(first) or first < 0:
            raise ConfigError(f"config: max_window_layers={first!r} is not allowed; allowed: "
                              f"an integer >= 0")
        return tuple(W if i >= first else None for i in range(layers))
    pattern = _get(config, "sliding_window_pattern")
    if pattern is not None:
        P = _field(config, "sliding_window_pattern")
        return tuple(None if (i + 1) % P == 0 else W for i in range(layers))
    if _get(config, "model_type") == "gemma2":
        return tuple(W if i % 2 == 0 else None for i in range(layers))
    return (W,) * layers


def known_configs() -> dict:
    """The shapes in model_configs.json: name -> config dict (with its "source")."""
    with open(CONFIGS_PATH) as f:
        return json.load(f)["models"]


KNOWN_CONFIGS = tuple(sorted(known_configs()))


def load_config(name_or_path) -> tuple[str, dict]:
    """(name, config dict): one of KNOWN_CONFIGS by name, or a transformers config.json
    by path (its file name's parent folder names it)."""
    known = known_configs()
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise _bad("config", name_or_path, f"{', '.join(KNOWN_CONFIGS)} or the path of a "
                                            f"transformers config.json")
    if isinstance(name_or_path, str) and name_or_path in known:
        return name_or_path, known[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"config={str(name_or_path)!r} is neither a known shape nor a file; "
                          f"allowed: {', '.join(KNOWN_CONFIGS)} or the path of a "
                          f"transformers config.json")
    try:
        with open(path) as f:
            data = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config={str(path)!r} is not JSON ({type(e).__name__}: "
                          f"{str(e).splitlines()[0]}); allowed: a transformers config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config={str(path)!r} holds a {type(data).__name__}; allowed: a "
                          f"JSON object (a transformers config.json)")
    return (path.parent.name or path.stem) if path.name == "config.json" else path.stem, data


# ---------------------------------------------------------------------------------------
# The calls a prefill + decode (or a training step) runs
# ---------------------------------------------------------------------------------------
def _check_count(name: str, value, low: int) -> int:
    if not _is_int(value) or value < low:
        raise _bad(name, value, f"an integer >= {low}")
    return int(value)


def plan_problem(problem: Problem, hw, pass_: str = "fwd", tiling: Tiling | None = None):
    """`iosim.kernel_plan` of fa2 on `problem` as gpu runs it: bf16 is planned with the
    fp16 tables (gpu runs bf16 on the tensor-core kernels with fp16's tilings,
    gpu._choose.fa2_tc_default; kernel_plan plans fp16 and fp32)."""
    p = replace(problem, dtype="fp16") if problem.dtype == "bf16" else problem
    plan = kernel_plan("fa2", p, hw, pass_=pass_, tiling=tiling)
    if pass_ == "bwd" and plan.kernel == "tc":
        # kernel_plan plans the tensor-core backward at any d; it runs d <= 128 only, and
        # gpu then runs another kernel at another tiling, which kernel_plan does not give
        from .launch.backward.fa2_tc import default_tiling, plan_error
        why = plan_error(plan.tiling.B_r, plan.tiling.B_c, p.d, p.dtype,
                         default_tiling(p.d, p.causal)["MT"])
        if why:
            raise ConfigError(f"the fa2 backward at head_dim={p.d} is not allowed here: "
                              f"iosim.kernel_plan plans the tensor-core kernel, which does "
                              f"not run it ({why}); allowed: head_dim <= 128 for a training "
                              f"step")
    return plan


def calls_from_config(config, *, batch: int = 1, prefill: int = 8192,
                      decode_steps: int = 100, dtype: str = "fp16", preset: str = "H100-SXM",
                      kv_reads: str = "auto", train: bool = False
                      ) -> list[AttentionCall]:
    """The attention calls of a prefill of `prefill` tokens followed by `decode_steps`
    decoding steps (one new token each), batch sequences, on `preset`: one call per layer
    per step, in the order a model runs them (step by step, layers in order).

    Prefill: Problem(N=prefill, causal) per layer, fa2 at the kernel and tiling gpu
    runs on the preset (`plan_problem`). Decode step k (1-based): one query row against
    a cache of prefill + k rows (the new token's K/V appended first, as transformers'
    caches do), kv_reads ("auto": gpu.decode's choice, per_group on grouped heads where
    its flat kernel runs), schedule and num_splits by iosim.choose_num_splits on the
    preset's SMs and the main kernel's blocks an SM (gpu.decode's rule,
    iosim.launch.decode). A sliding layer of window W: the prefill gets window (W - 1, 0)
    (transformers' sliding_window counts the query itself), dropped where it covers every
    key (W >= N: the same mask); its decode steps read the W most recent rows,
    min(cache, W) (a cache of the window, or a kernel that skips the rows before it).
    train=True: a training step on prefill tokens instead: each layer's forward
    (step "train"), then the backward calls in reverse layer order; decode_steps must be 0.
    config: a dict or config object (`model_shape`) or a ModelShape."""
    shape = config if isinstance(config, ModelShape) else model_shape(config)
    batch = _check_count("batch", batch, 1)
    N = _check_count("prefill", prefill, 1)
    K = _check_count("decode_steps", decode_steps, 0)
    dtype = check_dtype(dtype)
    hw = _hardware(preset)
    if not isinstance(kv_reads, str) or kv_reads not in KV_READS + ("auto",):
        raise _bad("kv_reads", kv_reads, "auto, " + ", ".join(KV_READS))
    if not isinstance(train, bool):
        raise _bad("train", train, "True or False")
    if train and K:
        raise _bad("decode_steps", K, "0 with train=True (a training step does not decode)")
    heads = dict(heads=shape.heads, kv_heads=shape.kv_heads, batch=batch)

    def forward(layer, step, backward=False):
        W = shape.windows[layer]
        window = (-1, -1) if W is None or W >= N else (W - 1, 0)
        p = Problem(N=N, d=shape.head_dim, dtype=dtype, causal=True, window=window, **heads)
        t = plan_problem(p, hw, "bwd" if backward else "fwd").tiling
        return AttentionCall(layer, step, p, "fa2", (t.B_r, t.B_c), backward=backward)

    if train:
        return ([forward(i, "train") for i in range(shape.layers)]
                + [forward(i, "train", True) for i in reversed(range(shape.layers))])
    calls = [forward(i, "prefill") for i in range(shape.layers)]
    memo: dict = {}
    for k in range(1, K + 1):
        for i in range(shape.layers):
            W = shape.windows[i]
            n_kv = N + k if W is None else min(N + k, W)
            if n_kv not in memo:
                p = DecodeProblem(N_kv=n_kv, d=shape.head_dim, N_q=1, dtype=dtype, **heads)
                kr = choose_kv_reads(p, kv_reads)
                S = auto_num_splits(p, hw.sm_count, kr, main_kernel(p, kr)).num_splits
                memo[n_kv] = (p, S, kr)
            p, S, kr = memo[n_kv]
            calls.append(AttentionCall(i, "decode", p, "fa2_decode" if S == 1 else "split_kv",
                                       None, num_splits=S, kv_reads=kr))
    return calls


# ---------------------------------------------------------------------------------------
# Pricing the calls
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallTraffic:
    """One call priced: its kernel ("fa2 fwd tc", "split_kv", ...), the exact ledger
    (an iosim Ledger, BackwardLedger or DecodeLedger: elements and bytes, problem totals),
    the predicted DRAM bytes read and written and time (ms) where the models cover the
    call, else None with `reason` (one line) saying why; the models' warnings; trust: the
    models' trust statements for this kind of problem (time, DRAM; iosim.timing.trust)."""

    call: AttentionCall
    kernel: str
    ledger: object
    dram_read_bytes: float | None
    dram_write_bytes: float | None
    predicted_ms: float | None
    reason: str | None = None
    warnings: tuple = ()
    trust: tuple = ()

    @property
    def hbm_bytes(self) -> int:
        """Ledger bytes, read + written (exact)."""
        return self.ledger.hbm_bytes

    @property
    def dram_bytes(self) -> float | None:
        if self.dram_read_bytes is None:
            return None
        return self.dram_read_bytes + self.dram_write_bytes


@dataclass(frozen=True)
class LayerTraffic:
    """One layer's calls of one step kind summed ("prefill", "decode", "train" forward,
    "train" backward): calls, ledger bytes read and written per tensor (exact ints, summed
    over the calls), DRAM bytes and time summed where every call has them (else None and
    the first call's reason)."""

    layer: int
    step: str
    backward: bool
    calls: int
    read_bytes: dict
    write_bytes: dict
    dram_bytes: float | None
    predicted_ms: float | None
    reason: str | None = None

    @property
    def hbm_bytes(self) -> int:
        return sum(self.read_bytes.values()) + sum(self.write_bytes.values())


@dataclass(frozen=True)
class TrafficTable:
    """`traffic_table`'s answer: the preset and one CallTraffic per call, in call order."""

    preset: str
    rows: tuple = field(default_factory=tuple)

    def select(self, step: str | None = None, backward: bool | None = None) -> tuple:
        return tuple(r for r in self.rows if (step is None or r.call.step == step)
                     and (backward is None or r.call.backward == backward))

    def by_layer(self, step: str, backward: bool = False) -> tuple:
        """LayerTraffic per layer (ascending) of the calls of `step` (and pass)."""
        groups: dict = {}
        for r in self.select(step, backward):
            groups.setdefault(r.call.layer, []).append(r)
        return tuple(sum_rows(rows, layer, step, backward)
                     for layer, rows in sorted(groups.items()))


def sum_rows(rows, layer: int = -1, step: str = "", backward: bool = False) -> LayerTraffic:
    """CallTraffic rows summed as a LayerTraffic (layer, step, backward: its labels; -1
    and "" for rows of several layers or steps)."""
    rd: dict = {}
    wr: dict = {}
    for r in rows:
        for t in r.ledger.tensors():
            rd[t] = rd.get(t, 0) + r.ledger.read_bytes_of(t)
            wr[t] = wr.get(t, 0) + r.ledger.write_bytes_of(t)
    dram = None if any(r.dram_bytes is None for r in rows) else sum(r.dram_bytes for r in rows)
    ms = None if any(r.predicted_ms is None for r in rows) else sum(r.predicted_ms for r in rows)
    reason = next((r.reason for r in rows if r.reason), None)
    return LayerTraffic(layer, step, backward, len(rows), rd, wr, dram, ms, reason)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _price_varlen(call: AttentionCall, hw) -> CallTraffic:
    p, t = call.problem, Tiling(*call.tiling)
    ledger = (varlen_backward_closed_form(p, t) if call.backward
              else varlen_closed_form(call.algorithm, p, t))
    return CallTraffic(call, f"{call.algorithm} varlen {call.pass_}", ledger, None, None, None,
                       "no DRAM bytes or time: the L2 / DRAM and time models do not cover "
                       "packed variable-length batches (iosim.varlen: the ledger only)")


def _price_forward(call: AttentionCall, hw) -> CallTraffic:
    from .passes import levels          # Numba-compiled: imported when a call needs it
    from .timing.predict import predict_time
    p, t, pass_ = call.problem, Tiling(*call.tiling), call.pass_
    if isinstance(p, VarlenProblem):
        return _price_varlen(call, hw)
    ledger = (backward_closed_form if call.backward else closed_form)(call.algorithm, p, t)
    try:
        plan = (plan_problem(p, hw, pass_, t) if call.algorithm == "fa2"
                else kernel_plan(call.algorithm, p, hw, pass_=pass_, tiling=t))
        kernel = f"{call.algorithm} {pass_} {plan.kernel}"
    except ValueError as e:
        kernel = f"{call.algorithm} {pass_}"
        return CallTraffic(call, kernel, ledger, None, None, None,
                           f"no kernel plan on {hw.name}: {_one_line(e)}")
    try:
        lv = levels(call.algorithm, p, hw, pass_=pass_, tiling=t)
    except ValueError as e:             # a problem the L2 / DRAM model does not cover
        return CallTraffic(call, kernel, ledger, None, None, None,
                           f"no DRAM bytes or time: {_one_line(e)}")
    warnings = tuple(lv["warnings"])
    try:
        ms = predict_time(call.algorithm, p, hw, pass_=pass_, levels_result=lv)["predicted_ms"]
        reason = None
    except ValueError as e:             # a kernel the time model has no constants for
        ms, reason = None, f"no predicted time: {_one_line(e)}"
    trust = tuple(lv["trust"][k]["statement"] for k in ("time", "dram") if k in lv["trust"])
    return CallTraffic(call, kernel, ledger, float(lv["dram_read_bytes"]),
                       float(lv["dram_write_bytes"]), ms, reason, warnings, trust)


def _price_decode(call: AttentionCall, hw) -> CallTraffic:
    from .timing.decode import predict_decode
    p = call.problem
    ledger = decode_closed_form(call.algorithm, p, num_splits=call.num_splits,
                                kv_reads=call.kv_reads)
    kernel = call.algorithm + (f" S={call.num_splits}" if call.num_splits > 1 else "")
    reason = ("no DRAM bytes: the decode model (iosim.timing.decode) predicts time only; "
              "the L2 / DRAM model covers the forward and backward passes")
    try:
        pred = predict_decode(p, hw.name, call.num_splits, kv_reads=call.kv_reads,
                              main=main_kernel(p, call.kv_reads))
    except ValueError as e:             # a problem the decode kernels (so the model) cannot run
        return CallTraffic(call, kernel, ledger, None, None, None,
                           f"no DRAM bytes or time: {_one_line(e)}")
    return CallTraffic(call, kernel, ledger, None, None, pred["predicted_ms"], reason,
                       tuple(pred["warnings"]))


def traffic_table(calls, preset: str = "H100-SXM") -> TrafficTable:
    """Price each call on `preset`: its exact ledger (closed forms: iosim.closed_form,
    iosim.backward_closed_form, iosim.decode_closed_form), and the predicted DRAM bytes and
    time (iosim.levels + iosim.predict_time for forward / backward calls; time only from
    iosim.predict_decode for decode calls), or the model's one-line reason. Calls with
    the same problem are priced once."""
    hw = _hardware(preset)
    if isinstance(calls, AttentionCall) or not hasattr(calls, "__iter__"):
        raise _bad("calls", type(calls).__name__, "a list of iosim.workload.AttentionCall")
    calls = list(calls)
    for i, c in enumerate(calls):
        if not isinstance(c, AttentionCall):
            raise _bad(f"calls[{i}]", type(c).__name__, "an iosim.workload.AttentionCall")
    memo: dict = {}
    rows = []
    for c in calls:
        # a block mask is not part of a Problem's equality: such calls are priced alone
        mask = getattr(c.problem, "block_mask", None)
        key = (c.problem, c.algorithm, c.tiling, c.num_splits, c.kv_reads, c.backward,
               None if mask is None else id(c))
        if key not in memo:
            price = _price_decode if isinstance(c.problem, DecodeProblem) else _price_forward
            memo[key] = price(c, hw)
        rows.append(replace(memo[key], call=c))
    return TrafficTable(hw.name, tuple(rows))


__all__ = ["AttentionCall", "CallTraffic", "KNOWN_CONFIGS", "LAYER_TYPES", "LayerTraffic",
           "ModelShape", "STEPS", "TrafficTable", "calls_from_config", "known_configs",
           "load_config", "model_shape", "plan_problem", "record", "recording", "sum_rows",
           "traffic_table"]
