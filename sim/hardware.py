"""GPU catalog: datasheet facts (with sources) plus the efficiencies the roofline applies.

``kernel_tables`` names the GPU's measured vLLM kernel tables (``sim/data/kernels``), which the
default cost model (``sim/cost/vllm_step.py``) prices steps from: H100 SXM, H200, B200, GB200,
A100 80 GB and L40S. The others (H100 PCIe, A100 40 GB, L4, MI300X, MI325X) are priced by the
roofline with efficiencies carried over from a calibrated GPU — an estimate, which reports label
(``GPUSpec.calibration``).

Peaks are dense (no sparsity) datasheet values; ``sources`` names where each row's facts come
from (the full list with notes is in docs/catalog.md). Roofline efficiencies (fractions of a
peak a real kernel reaches) are calibrated on measured operator times — the Vidur project's MLP
profiles (``sim/data/profiles``) — by ``sim/cost/calibration/roofline.py`` (``docs/roofline.md``);
``efficiency_source`` says which GPU's fit a row uses.
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
    interconnect: str = ""  # the GPU-to-GPU fabric inside a node
    gpus_per_node: int = 8  # GPUs one NVLink/xGMI domain node holds in the usual system
    sources: str = ""  # where the datasheet facts come from

    @property
    def calibration(self) -> str:
        """How steps on this GPU are priced: measured kernel tables, or an estimate."""
        if self.kernel_tables is not None:
            return f"measured vLLM kernel tables ({self.kernel_tables})"
        return f"estimate: roofline, efficiencies {self.efficiency_source}"

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


# Efficiencies: fitted by sim/cost/calibration/roofline.py on shared/data/profiles/vidur (copied to
# sim/data/profiles) for H100 SXM and A100 80 GB; every other GPU carries one of those fits over.
_H100 = (0.66, 0.85, 28e-6, 0.74)  # compute, memory, all-reduce latency s, all-reduce
_A100 = (0.69, 0.71, 43e-6, 0.53)
_NVL4 = "NVLink 4 via NVSwitch (HGX)"
_NVL5 = "NVLink 5 via NVSwitch"
_AIC = "aiconfigurator-core 0.12.0 systems/{}.yaml"

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="h100-sxm", display_name="NVIDIA H100 SXM 80GB", bf16_tflops=989.0,
            fp8_tflops=1979.0, memory_gb=80.0, usable_memory_gib=79.6, memory_bw_tbps=3.35,
            nvlink_gbps=900.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="fitted: Vidur H100 GEMM and DGX H100 all-reduce profiles",
            sm_version=90, kernel_tables="h100_sxm", interconnect=_NVL4,
            sources="NVIDIA H100 whitepaper/datasheet (dense = half the sparse figures); "
            + _AIC.format("h100_sxm"),
        ),
        GPUSpec(
            name="h100-pcie", display_name="NVIDIA H100 PCIe 80GB", bf16_tflops=756.5,
            fp8_tflops=1513.0, memory_gb=80.0, usable_memory_gib=79.6, memory_bw_tbps=2.0,
            nvlink_gbps=128.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="carried over from the H100 SXM fit (same Hopper compute)",
            sm_version=90, interconnect="PCIe Gen5 x16 (no NVLink bridge)",
            sources="NVIDIA H100 PCIe datasheet (756.5 bf16 / 1513 fp8 dense, 2.0 TB/s); "
            + _AIC.format("h100_pcie"),
        ),
        GPUSpec(
            name="h200-sxm", display_name="NVIDIA H200 SXM 141GB", bf16_tflops=989.0,
            fp8_tflops=1979.0, memory_gb=141.0, usable_memory_gib=139.8, memory_bw_tbps=4.8,
            nvlink_gbps=900.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="H100 fit (same compute die; not measured on H200)",
            sm_version=90, kernel_tables="h200_sxm", interconnect=_NVL4,
            sources="NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s; H100 compute); "
            + _AIC.format("h200_sxm"),
        ),
        GPUSpec(
            name="b200", display_name="NVIDIA B200 180GB (HGX, 1000 W)", bf16_tflops=2250.0,
            fp8_tflops=4500.0, memory_gb=192.0, usable_memory_gib=179.0, memory_bw_tbps=8.0,
            nvlink_gbps=1800.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="carried over from the H100 fit (roofline only)",
            sm_version=100, kernel_tables="b200_sxm", interconnect=_NVL5,
            sources="NVIDIA HGX B200 specs (2250 bf16 / 4500 fp8 dense, 8 TB/s, NVLink 5 "
            "1.8 TB/s), as tabulated at glennklockwood.com/garden/processors/B200; "
            + _AIC.format("b200_sxm") + " (180 GiB usable)",
        ),
        GPUSpec(
            name="gb200", display_name="NVIDIA GB200 (per Blackwell GPU, NVL72)",
            bf16_tflops=2500.0, fp8_tflops=5000.0, memory_gb=192.0, usable_memory_gib=185.0,
            memory_bw_tbps=8.0, nvlink_gbps=1800.0,
            compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="carried over from the H100 fit (roofline only)",
            sm_version=100, kernel_tables="gb200", interconnect=_NVL5 + " (72-GPU NVL72 domain)",
            gpus_per_node=4,
            sources="NVIDIA GB200 NVL72 specs per GPU (2500 bf16 / 5000 fp8 dense, 8 TB/s), as "
            "tabulated at glennklockwood.com/garden/processors/B200; "
            + _AIC.format("gb200") + " (189471 MiB from nvidia-smi)",
        ),
        GPUSpec(
            name="a100-40gb", display_name="NVIDIA A100 SXM 40GB", bf16_tflops=312.0,
            fp8_tflops=None, memory_gb=40.0, usable_memory_gib=39.5, memory_bw_tbps=1.555,
            nvlink_gbps=600.0, compute_efficiency=_A100[0], memory_efficiency=_A100[1],
            allreduce_latency_s=_A100[2], allreduce_efficiency=_A100[3],
            efficiency_source="carried over from the A100 80 GB fit (same die, HBM2 at "
            "1.555 TB/s; the A100 kernel tables were measured on the 80 GB part)",
            sm_version=80, interconnect="NVLink 3 via NVSwitch (HGX)",
            sources="NVIDIA A100 datasheet (312 bf16 dense, 40 GB HBM2 1.555 TB/s, 600 GB/s "
            "NVLink); CUDA-reported total 42,405,855,232 B (upb-pc2 wiki)",
        ),
        GPUSpec(
            name="a100-80gb", display_name="NVIDIA A100 SXM 80GB", bf16_tflops=312.0,
            fp8_tflops=None, memory_gb=80.0, usable_memory_gib=79.3, memory_bw_tbps=2.039,
            nvlink_gbps=600.0, compute_efficiency=_A100[0], memory_efficiency=_A100[1],
            allreduce_latency_s=_A100[2], allreduce_efficiency=_A100[3],
            efficiency_source="fitted: Vidur A100 GEMM and DGX A100 all-reduce profiles",
            sm_version=80, kernel_tables="a100_sxm", interconnect="NVLink 3 via NVSwitch (HGX)",
            sources="NVIDIA A100 datasheet (312 bf16 dense, 80 GB HBM2e 2.039 TB/s); "
            + _AIC.format("a100_sxm"),
        ),
        GPUSpec(
            name="l40s", display_name="NVIDIA L40S 48GB", bf16_tflops=362.05, fp8_tflops=733.0,
            memory_gb=48.0, usable_memory_gib=44.99, memory_bw_tbps=0.864, nvlink_gbps=64.0,
            compute_efficiency=_A100[0], memory_efficiency=_A100[1],
            allreduce_latency_s=_A100[2], allreduce_efficiency=_A100[3],
            efficiency_source="carried over from the A100 fit (roofline only)",
            sm_version=89, kernel_tables="l40s", interconnect="PCIe Gen4 x16 (no NVLink)",
            sources=_AIC.format("l40s") + " (362.05 bf16 / 733 fp8 dense, 864 GB/s, 46068 MiB)",
        ),
        GPUSpec(
            name="l4", display_name="NVIDIA L4 24GB", bf16_tflops=121.0, fp8_tflops=242.0,
            memory_gb=24.0, usable_memory_gib=22.0, memory_bw_tbps=0.3, nvlink_gbps=64.0,
            compute_efficiency=_A100[0], memory_efficiency=_A100[1],
            allreduce_latency_s=_A100[2], allreduce_efficiency=_A100[3],
            efficiency_source="carried over from the A100 fit (no measured L4 data)",
            sm_version=89, interconnect="PCIe Gen4 x16 (no NVLink)",
            sources=_AIC.format("l4") + " (121 bf16 / 242 fp8 dense, 300 GB/s; 24 GB GDDR6 of "
            "which ~2 GiB is assumed reserved: an estimate)",
        ),
        GPUSpec(
            name="mi300x", display_name="AMD Instinct MI300X 192GB", bf16_tflops=1307.4,
            fp8_tflops=2614.9, memory_gb=192.0, usable_memory_gib=191.5, memory_bw_tbps=5.3,
            nvlink_gbps=896.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="carried over from the H100 fit (no measured AMD data)",
            sm_version=0, interconnect="AMD Infinity Fabric (xGMI), 7 links, direct mesh",
            sources="AMD MI300X datasheet (1307.4 bf16 / 2614.9 fp8 dense, 192 GB HBM3, "
            "5.3 TB/s) as quoted in the methodology notes of GitHub "
            "alpharomercoma/MI300X-vs-H200; 7 × 128 GB/s "
            "Infinity Fabric links (wheelersnetwork.com); usable memory an estimate",
        ),
        GPUSpec(
            name="mi325x", display_name="AMD Instinct MI325X 256GB", bf16_tflops=1307.4,
            fp8_tflops=2614.9, memory_gb=256.0, usable_memory_gib=255.5, memory_bw_tbps=6.0,
            nvlink_gbps=896.0, compute_efficiency=_H100[0], memory_efficiency=_H100[1],
            allreduce_latency_s=_H100[2], allreduce_efficiency=_H100[3],
            efficiency_source="carried over from the H100 fit (no measured AMD data)",
            sm_version=0, interconnect="AMD Infinity Fabric (xGMI), 7 links, direct mesh",
            sources="AMD MI325X specs (same CDNA3 compute as MI300X, 256 GB HBM3E, 6 TB/s) as "
            "quoted at awesomeagents.ai/hardware/amd-mi325x and slicast.com; usable memory an "
            "estimate",
        ),
    )
}

#: Earlier catalog names still accepted.
GPU_ALIASES: dict[str, str] = {"b200-sxm": "b200", "h100": "h100-sxm", "h200": "h200-sxm"}


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by catalog name (case-insensitive)."""
    key = name.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise UnknownGPUError(f"unknown GPU {name!r}; valid: {', '.join(sorted(GPUS))}")
    return GPUS[key]
