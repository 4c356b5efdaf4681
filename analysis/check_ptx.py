"""`flashsim check --ptx`: the kernels compiled to PTX for cc 9.0 (NVVM, NVRTC and
nvJitLink; no GPU needed) and checked for what their builds must and must not contain."""
from __future__ import annotations

#: Linked builds of the fa2 tensor-core kernels that `flashsim check --ptx` compiles
#: (tc_ptx_check): forward (B_r, B_c, d, causal, has_mask, count, MT, window, dt) and
#: backward (B_r, B_c, d, causal, has_mask, count, MT, kreg, DN, dt[, window]); the first
#: of each list are the --quick ones. fp16 and bf16; head dims padded to 16 on chip (40,
#: 59, 111) and above 128 (forward: 160, 256, Q read from shared at each k step).
TC_PTX_FORWARD = [(128, 64, 64, True, False, True, 1, False, "bf16"),
                  (128, 64, 59, True, True, True, 1, False, "fp16"),
                  (128, 64, 256, False, False, False, 1, False, "fp16"),
                  (128, 64, 64, False, False, False, 1, False, "fp16"),
                  (64, 64, 128, True, False, False, 1, True, "bf16"),
                  (128, 64, 40, False, False, True, 1, False, "bf16"),
                  (128, 64, 160, True, False, False, 1, False, "fp16"),
                  (128, 64, 256, True, True, True, 1, False, "bf16")]
#: fa1's tensor-core kernel (gpu.forward.fa1_tc) in bf16: (B_r, B_c, d, causal, has_mask,
#: count, MT, stages, dt) (not in --quick)
TC_PTX_FA1 = [(128, 128, 64, True, False, True, 1, 3, "bf16")]
TC_PTX_BACKWARD = [(64, 128, 64, True, False, True, 1, False, 64, "bf16"),
                   (64, 128, 64, False, False, False, 1, False, 32, "fp16"),
                   (32, 64, 128, False, False, False, 1, False, 32, "bf16"),
                   (64, 128, 59, True, True, True, 1, False, 64, "bf16"),
                   (32, 64, 111, False, False, False, 1, False, 16, "fp16"),
                   # a local window (N_k != N_q and windows, issue 18): the band's lower
                   # edge compiled in
                   (64, 128, 64, True, False, True, 1, False, 64, "fp16", True)]


def tc_ptx_check(quick: bool = False, out=print) -> list[str]:
    """The tensor-core kernels' linked PTX (fa2: TC_PTX_FORWARD, TC_PTX_BACKWARD, quick:
    the first of each; fa1: TC_PTX_FA1, not quick): the C++ inlined (no call), nothing in
    local memory, no .f64, the mma.sync count its loops imply in the dtype's form (f16 /
    bf16), atomics in the forward iff counting, dQ reductions in every backward build
    (vector ones for even d). NVVM, NVRTC and nvJitLink, no GPU. Returns the failures."""
    import re
    from gpu.backward import fa2_tc as bwd_tc
    from gpu.forward import fa2_tc

    def one(name, ptx, want_mma, dt, atom_ok):
        mma = ptx.count("mma.sync")
        bf = ptx.count(".bf16.bf16.f32")
        local = ptx.count(".local")
        call = len([ln for ln in ptx.splitlines() if ln.strip().startswith("call")])
        f64 = len(re.findall(r"\.f64\b", ptx))
        ok = (mma == want_mma and bf == (mma if dt == "bf16" else 0) and not local
              and not call and not f64 and atom_ok)
        out(f"{name:<52} mma={mma:<4} {dt} local={local} call={call} f64={f64} "
            f"{'ok' if ok else 'FAIL'}")
        return [] if ok else [name]

    failures = []
    for B_r, B_c, d, causal, mask, count, MT, window, dt in (
            TC_PTX_FORWARD[:1] if quick else TC_PTX_FORWARD):
        ptx = fa2_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, window=window, dt=dt)
        D = fa2_tc.padded(d)
        name = fa2_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, window,
                                 dt).py_func.__name__
        failures += one(name, ptx, 4 * (B_c // 16) * (D // 16) * MT, dt,
                        (ptx.count("atom.") > 0) == count)
    for B_r, B_c, d, causal, mask, count, MT, kreg, DN, dt, *win in (
            TC_PTX_BACKWARD[:1] if quick else TC_PTX_BACKWARD):
        window = bool(win and win[0])
        ptx = bwd_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, kreg, DN, dt=dt,
                                window=window)
        name = bwd_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, kreg, DN,
                                 dt, window).py_func.__name__
        want = 4 * (B_r // 8) * (bwd_tc.padded(d) // 16) * MT + (B_c // 16) * (DN // 8)
        # dQ: pairs in vector reductions; odd d (pairs not 8-byte aligned): single floats
        dq_ok = (ptx.count("red.global.add.v2") > 0 if d % 2 == 0 else
                 ptx.count("global.add.f32") > 0)
        failures += one(name, ptx, want, dt, dq_ok)
    from gpu.forward import fa1_tc
    for B_r, B_c, d, causal, mask, count, MT, st, dt in ([] if quick else TC_PTX_FA1):
        ptx = fa1_tc.linked_ptx(B_r, B_c, d, causal, mask, count, MT, st, dt=dt)
        name = fa1_tc.get_kernel(B_r, B_c, d, causal, mask, count, MT, st,
                                 dt).py_func.__name__
        failures += one(name, ptx, 4 * (B_c // 16) * (d // 16) * MT, dt,
                        (ptx.count("atom.") > 0) == count)
    return failures


def ptx_check(quick: bool = False, out=print) -> list[str]:
    """Compile every CUDA-core forward kernel (d=64, 64x64 tiles, all flags) for cc 9.0
    and check: no .f64 instruction; atomics present iff the counting build; the fast fa2,
    standard and fa1 kernels use 16-byte shared loads (ld.shared.v4.f32). The plain fa2
    backward's main kernel and its varlen twin: no .f64, atomics (dQ) in every build, more
    in the counting one. Then the fa2 tensor-core kernels' linked builds (tc_ptx_check).
    quick: fp16 causal only (tensor cores: one forward, one backward build). Needs
    NUMBA_ENABLE_CUDASIM=0 (NVVM, NVRTC, nvJitLink), not a GPU. Returns the failures."""
    import re
    from numba import cuda
    from numba.cuda import types as T
    from gpu import _launch
    from gpu.forward import fa1, fa1_fast, fa2, fa2_fast, fa2_varlen, standard, standard_fast
    A = lambda dt, nd: T.Array(dt, nd, "C")
    U8, I64, F32 = A(T.uint8, 2), A(T.int64, 2), A(T.float32, 2)
    failures = []
    for dt in (("fp16",) if quick else ("fp32", "fp16")):
        X = A(_launch.NB_DTYPE[dt], 3)
        for count in (False, True):
            for causal in ((True,) if quick else (False, True)):
                # scale, N, N_k, lo, hi, H, G (gpu.forward._band: the band arguments)
                scal = (T.float32,) + (T.int64,) * 6
                ks = [(fa2.fa2_forward_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, X, F32) + scal + (U8, I64)
                       + (T.uint64,) * 4 + (T.float32,)),     # dropout (gpu._philox)
                      (fa1.fa1_forward_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, X, F32, F32) + scal + (U8, I64)),
                      (standard.s_kernel(64, 64, 64, dt, causal, count, 128),
                       (X, X, X, A(T.int32, 2)) + scal + (I64,)),
                      (standard.softmax_kernel(64, 64, causal, True, count, 128),
                       (X, X, U8) + (T.int64,) * 4 + (I64,)),
                      (standard.pv_kernel(64, 64, 64, dt, causal, True, count, 128),
                       (X, X, X, T.float32, U8) + (T.int64,) * 6 + (I64,)),
                      (fa2_fast.fa2_fast_kernel(128, 64, 64, dt, causal, True, count, 128, 8,
                                                True), fa2_fast.signature(dt)),
                      (standard_fast.s_kernel(128, 128, 64, dt, causal, False, count, 256),
                       standard_fast.signatures(dt)["S"]),
                      (standard_fast.pv_kernel(128, 128, 64, dt, causal, False, True, count,
                                               256), standard_fast.signatures(dt)["PV"]),
                      (standard.softmax_kernel(128, 128, causal, True, count, 256, False,
                                               False, True), standard_fast.signatures(dt)[
                                                   "softmax"]),
                      # the dense rows' flat sweep (no band, no mask: FLAT)
                      (standard.softmax_kernel(128, 128, False, False, count, 256, False,
                                               False, True), standard_fast.signatures(dt)[
                                                   "softmax"]),
                      (fa1_fast.fa1_fast_kernel(128, 64, 64, dt, causal, False, True, count,
                                                256, True), fa1_fast.signature(dt)),
                      (fa2_varlen.fa2_varlen_kernel(64, 64, 64, dt, causal, count, 128),
                       fa2_varlen.signature(dt))]
                for kern, sig in ks:
                    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
                    name = kern.py_func.__name__
                    f64 = len(re.findall(r"\.f64\b", ptx))
                    atom = len(re.findall(r"\batom\.", ptx))
                    ok = f64 == 0 and (atom > 0) == count and name in ptx
                    extra = ""
                    if name.startswith(("fa2_fast", "std_fast", "fa1_fast")):   # LDS.128
                        v4 = len(re.findall(r"ld\.shared\.v4\.f32", ptx))
                        ok = ok and v4 > 0
                        extra = f" ld.shared.v4={v4}"
                    out(f"{name:<52} f64={f64:<3} atomics={atom:<3}{extra} "
                        f"{'ok' if ok else 'FAIL'}")
                    if not ok:
                        failures.append(name)
    # the plain fa2 backward's main kernel and its packed (varlen) twin: dQ is summed with
    # atomics in every build, so the rule is: no .f64, atomics present, and the counting
    # build has more of them (its counters)
    from gpu.backward import fa2_varlen as bwd_varlen
    from gpu.backward import flash
    for dt in (("fp16",) if quick else ("fp32", "fp16")):
        X = A(_launch.NB_DTYPE[dt], 3)
        main_sig = ((X,) * 5 + (F32, F32, F32, A(T.float32, 3), X, X, T.float32) +
                    (T.int64,) * 6 + (U8, I64) + (T.uint64,) * 4 + (T.float32,))
        for causal in ((True,) if quick else (False, True)):
            for kind, make, sig in (
                    ("fa2_bwd_main", lambda c: flash.bwd_main_kernel(
                        "fa2", 64, 64, 64, dt, causal, True, c, 128), main_sig),
                    ("fa2_varlen_bwd", lambda c: bwd_varlen.fa2_varlen_bwd_kernel(
                        64, 64, 64, dt, causal, c, 128), bwd_varlen.signature(dt))):
                atoms = []
                for count in (False, True):
                    kern = make(count)
                    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0))
                    f64 = len(re.findall(r"\.f64\b", ptx))
                    atoms.append(len(re.findall(r"\b(?:atom|red)\.", ptx)))
                    ok = f64 == 0 and atoms[-1] > 0 and (not count or atoms[1] > atoms[0])
                    out(f"{kern.py_func.__name__:<52} f64={f64:<3} atomics={atoms[-1]:<3} "
                        f"{'ok' if ok else 'FAIL'}")
                    if not ok:
                        failures.append(kern.py_func.__name__)
    failures += tc_ptx_check(quick, out)
    for dt in (T.float32, T.float16):   # the NaN-poison fill
        ptx, _ = cuda.compile_ptx(_launch._fill_kernel.py_func, (T.Array(dt, 1, "C"), T.float32),
                                  cc=(9, 0))
        f64 = len(re.findall(r"\.f64\b", ptx))
        out(f"{'fill_' + str(dt):<52} f64={f64:<3} {'ok' if f64 == 0 else 'FAIL'}")
        if f64:
            failures.append(f"fill {dt}")
    return failures
