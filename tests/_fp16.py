"""What "within fp16 noise" means in the tests of gpu.hf (CPU and GPU)."""


def within_fp16_noise(got, sdpa, ref, what):
    """"Within fp16 noise": flashsim's fp16 result `got` is at most twice as far from the
    fp32 reference `ref` (the same weights in fp32 on SDPA) as SDPA's own fp16 result
    `sdpa` is (largest absolute error), with half an fp16 ulp of ref's largest magnitude
    (2^-11 relative) as the least error allowed to count. Most of either path's fp16
    error comes from the layers they share (projections, MLP, norms), so the ratio sits
    near 1; a wrong attention doubles it. Returns (flashsim's error, SDPA's error)."""
    e_got = (got.float() - ref.float()).abs().max().item()
    e_sdpa = (sdpa.float() - ref.float()).abs().max().item()
    floor = 2.0 ** -11 * ref.float().abs().max().item()
    assert e_got <= 2 * max(e_sdpa, floor), (what, e_got, e_sdpa, floor)
    return e_got, e_sdpa
