"""The plans of `flashsim check`: which configurations each suite runs in each mode, their
names, and sharding (analysis.check's docstring describes the suites and modes)."""
from __future__ import annotations

from analysis import check_variants

MODES = ("full", "quick", "sim")
SUITES = ("forward", "tc", "backward", "variants")
#: what `flashsim check` and run_checks run when no suite is named
DEFAULT_SUITES = ("forward", "tc", "backward")
TC_NEEDS_GPU = ("needs a CUDA GPU: the CUDA simulator cannot run the tensor-core kernel's "
                "linked C++ tile functions (its PTX builds without a GPU: "
                "gpu.forward.fa2_tc.linked_ptx)")


def forward_configs(mode: str) -> list[dict]:
    """dicts: alg, N, d, dtype, causal, batch, heads, kv_heads, tiles (None = default),
    mask, kernel (None = "auto")."""
    out = []
    if mode == "sim":
        base = dict(d=16, batch=1, heads=2, kv_heads=2, tiles=(16, 16), mask=False, kernel=None)
        for alg in ("standard", "fa1", "fa2"):
            out.append(dict(base, alg=alg, N=24, dtype="fp32", causal=False))
            out.append(dict(base, alg=alg, N=24, dtype="fp16", causal=True))
        out.append(dict(base, alg="fa2", N=40, dtype="fp32", causal=True, kv_heads=1, mask=True))
        out.append(dict(base, alg="fa2", N=40, dtype="fp32", causal=True, kernel="plain"))
        return out
    if mode == "quick":
        Ns, heads, tiles = (80,), 2, (32, 32)
    else:
        Ns, heads, tiles = (1024, 4096), 16, None
    for N in Ns:
        for dtype in ("fp32", "fp16"):
            for alg in ("standard", "fa1", "fa2"):
                for causal in (False, True):
                    out.append(dict(alg=alg, N=N, d=64, dtype=dtype, causal=causal, batch=1,
                                    heads=heads, kv_heads=heads, tiles=tiles, mask=False,
                                    kernel=None))
    N = Ns[0]
    extra = dict(N=N, d=64, batch=1, heads=heads, mask=False, kernel=None)
    # the plain fa2 kernel; the rows above run gpu.forward.fa2_fast / gpu.forward.fa2_tc where they apply
    for dtype in ("fp32", "fp16"):
        out.append(dict(extra, alg="fa2", dtype=dtype, causal=True, kv_heads=heads,
                        tiles=tiles or (32, 32), kernel="plain"))
    # the plain standard and fa1 kernels (fp32 'auto' runs gpu.forward.standard_fast,
    # fa1_fast), and the fast ones with grouped K/V and a block mask
    for alg in ("standard", "fa1"):
        out.append(dict(extra, alg=alg, dtype="fp32", causal=True, kv_heads=heads,
                        tiles=tiles or (64, 64), kernel="plain"))
        out.append(dict(extra, alg=alg, dtype="fp32", causal=True,
                        kv_heads=max(1, heads // 4), tiles=None, mask=True))
    # > 48 KB of dynamic shared memory: exercises the opt-in
    out.append(dict(extra, alg="fa2", dtype="fp32", causal=False, kv_heads=heads, tiles=(64, 64)))
    out.append(dict(extra, alg="fa1", dtype="fp16", causal=True, kv_heads=heads, tiles=(64, 64)))
    out.append(dict(extra, alg="standard", dtype="fp32", causal=True, kv_heads=heads,
                    tiles=(128, 64)))
    # grouped K/V and a block mask with an empty query block
    out.append(dict(extra, alg="fa2", dtype="fp16", causal=True, kv_heads=max(1, heads // 4),
                    tiles=None))
    out.append(dict(extra, alg="fa2", dtype="fp32", causal=True, kv_heads=heads, tiles=None,
                    mask=True))
    return out


def tc_configs(mode: str) -> list[dict]:
    """dicts: N, d, bh (query heads), G (query heads per K/V head), causal, tiles, mask
    ('none' | 'sparse': a random block mask with query block 0 empty), logit (input
    scale), MT (m-tiles of 16 rows per warp). Empty in `sim` mode (see TC_NEEDS_GPU)."""
    if mode == "sim":
        return []
    base = dict(bh=4, G=1, causal=False, tiles=(128, 64), mask="none", logit=1.0, MT=1)
    out = []
    for d in (64, 128, 16, 32, 48, 80, 96):
        for causal in (False, True):
            out.append(dict(base, N=1000, d=d, causal=causal))
    for tiles in ((64, 64), (128, 32), (64, 32), (16, 16), (32, 48), (128, 128)):
        out.append(dict(base, N=333, d=64, tiles=tiles, causal=True))
    out += [dict(base, N=1024, d=64, G=4, bh=8),                      # grouped K/V heads
            dict(base, N=1024, d=64, mask="sparse"),                   # block mask
            dict(base, N=1000, d=128, mask="sparse", causal=True),
            dict(base, N=1024, d=64, logit=30.0),                      # huge logits
            dict(base, N=77, d=64, causal=True, tiles=(64, 16)),
            dict(base, N=1, d=64),
            dict(base, N=4096, d=64, bh=16),
            dict(base, N=4096, d=64, bh=16, causal=True),
            dict(base, N=4096, d=128, bh=16, tiles=(128, 32)),
            # two m-tiles of 16 rows per warp
            dict(base, N=1000, d=64, MT=2), dict(base, N=1000, d=64, MT=2, causal=True),
            dict(base, N=333, d=48, MT=2, tiles=(64, 32), causal=True, mask="sparse"),
            dict(base, N=4096, d=64, bh=16, MT=2, causal=True)]
    # head dims padded to 16 on chip (d real columns loaded and stored); above 128 Q_w is
    # read from shared memory at each k step
    padded = [dict(base, N=1000, d=d, causal=causal) for d in (40, 59, 111, 160, 192, 256)
              for causal in (False, True)]
    out += padded + [dict(base, N=4096, d=256, bh=16), dict(base, N=4096, d=256, bh=16,
                                                            causal=True)]
    if mode == "quick":
        small = [c for c in out if c["N"] <= 1024]
        out = (small[:8] + [c for c in small[8:] if c["MT"] == 2]   # and every MT=2 build
               + [padded[2], padded[11]])                          # d = 59; 256 causal
    return out


def backward_configs(mode: str) -> list[dict]:
    """dicts: N, d, batch, heads, dtype, causal, algs (run on the same inputs)."""
    if mode == "sim":
        plan, d, batch, heads = {a: (40,) for a in ("fa2", "standard", "fa1")}, 16, 1, 2
    elif mode == "quick":
        plan, d, batch, heads = {a: (256,) for a in ("fa2", "standard", "fa1")}, 64, 2, 8
    else:   # fa1 (one thread block per instance: slow) at N=1024 only
        plan, d, batch, heads = {"fa2": (1024, 4096), "standard": (1024, 4096),
                                 "fa1": (1024,)}, 64, 2, 8
    out = []
    for N in sorted({n for ns in plan.values() for n in ns}):
        for dt in ("fp32", "fp16"):
            for causal in (False, True):
                out.append(dict(N=N, d=d, batch=batch, heads=heads, dtype=dt, causal=causal,
                                algs=[a for a in plan if N in plan[a]]))
    return out


ALGORITHMS = ("standard", "fa1", "fa2")


def plan(mode: str, suites=SUITES, algorithms=ALGORITHMS) -> list[tuple[str, dict]]:
    """[(suite, config)] in the order they run; `algorithms` keeps only the configurations
    (and, in the backward suite, the algorithms of a configuration) of those algorithms
    (the tc suite is fa2's)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {', '.join(MODES)}")
    bad = [a for a in algorithms if a not in ALGORITHMS]
    if bad or not algorithms:
        raise ValueError(f"algorithms={list(algorithms)!r} is not allowed; allowed: a non-empty "
                         f"subset of {', '.join(ALGORITHMS)}")
    makers = {"forward": forward_configs, "tc": tc_configs, "backward": backward_configs,
              "variants": check_variants.configs}
    out = []
    for s in suites:
        if s not in makers:
            raise ValueError(f"suite={s!r} is not known; allowed: {', '.join(SUITES)}")
        for c in makers[s](mode):
            if s == "backward":
                algs = [a for a in c["algs"] if a in algorithms]
                if algs:
                    out.append((s, dict(c, algs=algs)))
            elif c.get("alg", "fa2") in algorithms:
                out.append((s, c))
    return out


def n_rows(suite: str, cfg: dict) -> int:
    return len(cfg["algs"]) if suite == "backward" else 1


def shard_plan(cases: list, index: int, count: int) -> list:
    """Shard `index` of `count` of a plan (analysis.check's docstring: Sharding)."""
    return check_variants.shard(
        cases, index, count,
        group=lambda c: (c[0], c[1]["group"]) if c[0] == "variants" else id(c[1]))


def forward_name(cfg) -> str:
    kern = "-plain" if cfg.get("kernel") == "plain" else ""
    tiles = f" {cfg['tiles'][0]}x{cfg['tiles'][1]}" if cfg.get("tiles") else ""
    return (f"{cfg['alg']}{kern} N={cfg['N']} d={cfg['d']} {cfg['dtype']}"
            f"{' causal' if cfg['causal'] else ''}{' mask' if cfg['mask'] else ''}"
            f" H={cfg['heads']}/{cfg['kv_heads']}{tiles}")


def tc_name(cfg) -> str:
    B_r, B_c = cfg["tiles"]
    name = f"fa2-tc N={cfg['N']} d={cfg['d']} {B_r}x{B_c} MT={cfg['MT']}"
    if cfg["causal"]:
        name += " causal"
    if cfg["mask"] != "none":
        name += " mask"
    if cfg["G"] > 1:
        name += f" G={cfg['G']}"
    if cfg["logit"] != 1:
        name += f" logits x{cfg['logit']:g}"
    return name


def backward_name(cfg, alg) -> str:
    return (f"{alg} N={cfg['N']} d={cfg['d']} {cfg['dtype']}"
            f"{' causal' if cfg['causal'] else ''} B={cfg['batch']} H={cfg['heads']}")


def case_name(suite: str, cfg: dict) -> str:
    """The name of one configuration of a plan (its rows carry it as `case`)."""
    if suite == "forward":
        return forward_name(cfg)
    if suite == "tc":
        return tc_name(cfg)
    if suite == "variants":
        return check_variants.name(cfg)
    return f"backward N={cfg['N']} {cfg['dtype']}{' causal' if cfg['causal'] else ''}"

