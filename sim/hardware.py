"""GPU catalog: datasheet peaks plus the efficiencies the roofline model applies to them.

``kernel_tables`` names the GPU's measured vLLM kernel tables (``sim/data/kernels``), which the
default cost model (``sim/cost/vllm_step.py``) prices steps from; a GPU without them is priced
by the roofline.

Peaks are dense (no sparsity) datasheet values (docs/roofline.md §2). Efficiencies (fractions of a
peak a real kernel reaches) are calibrated on measured operator times — the Vidur project's MLP
profiles (``sim/data/profiles``) — by ``sim/cost/calibration/roofline.py``; see
``docs/roofline.md`` for the fit and its error. GPUs without measured data inherit the
efficiencies of the closest calibrated generation, which the ``efficiency_source`` field says.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.errors import UserError


class UnknownGPUError(UserError):
    """An unknown GPU name; the message lists the catalog."""


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator as the roofline model sees it."""

    name: str  # catalog key, e.g. "h100-sxm"
    display_name: str
    bf16_tflops: float  # dense peak, TFLOP/s
    fp8_tflops: float | None  # dense peak, TFLOP/s (None: no fp8 tensor cores)
    memory_gb: float  # HBM capacity as marketed, GB
    usable_memory_gib: float  # what the driver reports as total device memory, GiB
    memory_bw_tbps: float  # HBM bandwidth, TB/s
    nvlink_gbps: float  # NVLink bandwidth, GB/s, bidirectional total per GPU
    compute_efficiency: float  # achievable fraction of bf16 peak on large GEMMs
    memory_efficiency: float  # achievable fraction of HBM bandwidth on weight/KV streaming
    allreduce_latency_s: float  # fixed cost of one all-reduce call
    allreduce_efficiency: float  # achievable fraction of NVLink bandwidth in a ring all-reduce
    efficiency_source: str  # where the efficiencies come from
    sm_version: int = 90  # CUDA compute capability × 10 (vLLM's kernel and graph choices)
    kernel_tables: str | None = None  # measured vLLM kernel tables (sim/cost/kernel_tables.py)

    @property
    def memory_bytes(self) -> float:
        """Total device memory as ``torch.cuda.mem_get_info`` reports it (what vLLM sizes from)."""
        return self.usable_memory_gib * 2**30

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def memory_bw_bytes_s(self) -> float:
        return self.memory_bw_tbps * 1e12

    @property
    def link_bw_bytes_s(self) -> float:
        """Unidirectional NVLink bandwidth per GPU (half the bidirectional total)."""
        return self.nvlink_gbps * 1e9 / 2


# Efficiencies: fitted by sim/cost/calibration/roofline.py on shared/data/profiles/vidur
# (copied to sim/data/profiles); the H200 shares the H100's compute die and takes its values.
GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="h100-sxm",
            display_name="NVIDIA H100 SXM 80GB",
            bf16_tflops=989.0,
            fp8_tflops=1979.0,
            memory_gb=80.0,
            usable_memory_gib=79.6,
            memory_bw_tbps=3.35,
            nvlink_gbps=900.0,
            compute_efficiency=0.66,
            memory_efficiency=0.85,
            allreduce_latency_s=28e-6,
            allreduce_efficiency=0.74,
            efficiency_source="fitted: Vidur H100 GEMM and DGX H100 all-reduce profiles",
            sm_version=90,
            kernel_tables="h100_sxm",
        ),
        GPUSpec(
            name="h200-sxm",
            display_name="NVIDIA H200 SXM 141GB",
            bf16_tflops=989.0,
            fp8_tflops=1979.0,
            memory_gb=141.0,
            usable_memory_gib=139.8,
            memory_bw_tbps=4.8,
            nvlink_gbps=900.0,
            compute_efficiency=0.66,
            memory_efficiency=0.85,
            allreduce_latency_s=28e-6,
            allreduce_efficiency=0.74,
            efficiency_source="H100 fit (same compute die; not measured on H200)",
            sm_version=90,
            kernel_tables="h200_sxm",
        ),
        GPUSpec(
            name="a100-80gb",
            display_name="NVIDIA A100 SXM 80GB",
            bf16_tflops=312.0,
            fp8_tflops=None,
            memory_gb=80.0,
            usable_memory_gib=79.3,
            memory_bw_tbps=2.039,
            nvlink_gbps=600.0,
            compute_efficiency=0.69,
            memory_efficiency=0.71,
            allreduce_latency_s=43e-6,
            allreduce_efficiency=0.53,
            efficiency_source="fitted: Vidur A100 GEMM and DGX A100 all-reduce profiles",
            sm_version=80,
            kernel_tables="a100_sxm",
        ),
    )
}


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalog name (case-insensitive)."""
    key = name.strip().lower()
    if key not in GPUS:
        raise UnknownGPUError(f"unknown GPU {name!r}; valid: {', '.join(sorted(GPUS))}")
    return GPUS[key]
