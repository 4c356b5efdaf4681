"""Hardware specs: SRAM per thread block, HBM and L2, SM count, peak rates.

Units: bytes, bytes/s, FLOP/s. Each preset figure carries its source.
"""
from __future__ import annotations

from dataclasses import dataclass

from .problem import ConfigError

KB = 1024
MB = 1024 ** 2
GB = 1000 ** 3


@dataclass(frozen=True)
class Hardware:
    name: str
    sm_count: int
    smem_per_sm_bytes: int          # shared memory per SM (the SRAM the paper's M lives in)
    smem_per_block_bytes: int       # largest shared memory one thread block may opt in to
    l2_bytes: int
    hbm_bytes: int
    hbm_bandwidth: float            # bytes/s, read + write counted together
    fp32_flops: float               # FLOP/s on CUDA cores (non-tensor)
    fp16_tensor_flops: float        # FLOP/s dense fp16 on tensor cores
    #: bytes/s the SMs can pull from L2 together: an estimate, not a datasheet figure: one
    #: 64-byte L2 -> L1 transfer per SM per clock at the boost clock (the time model fits
    #: the fraction of it achieved; 0: unknown)
    l2_bandwidth: float = 0.0

    def __post_init__(self):
        for f in ("sm_count", "smem_per_sm_bytes", "smem_per_block_bytes", "l2_bytes", "hbm_bytes"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{f}={v!r} must be a positive integer (bytes or count)")
        for f in ("hbm_bandwidth", "fp32_flops", "fp16_tensor_flops"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"{f}={getattr(self, f)!r} must be positive")

    @property
    def sram_bytes(self) -> int:
        """M for one thread block, in bytes: the per-block opt-in maximum."""
        return self.smem_per_block_bytes

    def peak_flops(self, dtype: str) -> float:
        return self.fp16_tensor_flops if dtype in ("fp16", "bf16") else self.fp32_flops


PRESETS: dict[str, Hardware] = {
    # NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), Table 3 / Table 4:
    # 108 SMs, 192 KB L1/shared per SM of which up to 164 KB shared, 163 KB (166,912 B)
    # per block with opt-in (CUDA C Programming Guide, compute capability 8.0), 40 MB L2,
    # 1555 GB/s HBM2, 19.5 TFLOP/s FP32, 312 TFLOP/s dense FP16 tensor.
    "A100-40GB": Hardware("A100-40GB", 108, 164 * KB, 166_912, 40 * MB, 40 * GB,
                          1555e9, 19.5e12, 312e12, l2_bandwidth=108 * 64 * 1.41e9),
    # A100 80GB SXM datasheet (2021): HBM2e at 2039 GB/s; otherwise as A100-40GB.
    "A100-80GB": Hardware("A100-80GB", 108, 164 * KB, 166_912, 40 * MB, 80 * GB,
                          2039e9, 19.5e12, 312e12, l2_bandwidth=108 * 64 * 1.41e9),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5) and Hopper tuning guide: 132 SMs,
    # 228 KB shared per SM, 227 KB (232,448 B) per block with opt-in, 50 MB L2,
    # 3.35 TB/s HBM3, 67 TFLOP/s FP32, 989.4 TFLOP/s dense FP16 tensor.
    # (Measured on an H100 80GB HBM3 through the CUDA driver: 132 SMs, 50 MB L2, 232,448 B
    # per block after opting in.)
    "H100-SXM": Hardware("H100-SXM", 132, 228 * KB, 232_448, 50 * MB, 80 * GB,
                         3.35e12, 67e12, 989.4e12, l2_bandwidth=132 * 64 * 1.98e9),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, compute as
    # H100 SXM. L2: 60 MB, as the device reports it (cudaDevAttrL2CacheSize through
    # PyTorch's device properties on an H200, 2026-10-28: 60 MB against the H100's 50 MB);
    # its fa2 fp16 DRAM reads at N=65536 fell from 0.68 (H100) to 0.48 GB accordingly.
    "H200": Hardware("H200", 132, 228 * KB, 232_448, 60 * MB, 141 * GB,
                     4.8e12, 67e12, 989.4e12, l2_bandwidth=132 * 64 * 1.98e9),
}


def get_hardware(name: str) -> Hardware:
    """Look up a preset by name (case-insensitive)."""
    for key, hw in PRESETS.items():
        if key.lower() == str(name).lower():
            return hw
    raise ConfigError(f"gpu={name!r} is not a known preset; allowed: {', '.join(PRESETS)}")
