"""Hardware catalog: one `GPUSpec` per accelerator, datasheet figures (dense, per GPU).

Bandwidths are per GPU, per direction, in GB/s (1e9 B/s). memory_gib is what the framework can allocate
(nvidia-smi total), in GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from search_spaces.errors import SpecError
from search_spaces.inputs import excerpt
from search_spaces.layouts.layout import PRECISION_ALIASES

# Architecture families (one set of calibrated rates each) and the hosts beside the accelerators.
FAMILIES = ("hopper", "blackwell", "cpu")
HOSTS = ("x86", "grace", "cpu")


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_gib: float
    peak_tflops: dict = field(hash=False)  # precision -> dense TF/s
    hbm_tbps: float
    nvlink_domain: int  # GPUs that share one NVLink (scale-up) domain
    nvlink_gbps: float  # per GPU, per direction
    scaleout_gbps: float  # per GPU, per direction (InfiniBand / RoCE NIC)
    host_link_gbps: float  # GPU<->CPU, per direction (PCIe or NVLink-C2C): optimizer and activation offload copies
    family: str  # the architecture whose calibrated rates apply: hopper | blackwell | cpu (see FAMILIES)
    host: str  # the host CPU that runs offloaded optimizer steps: x86 | grace | cpu (see HOSTS)
    description: str = ""
    sms: int = 0  # streaming multiprocessors (datasheets; what the dispatcher's and delta-net's kernels occupy)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES or self.host not in HOSTS:
            raise SpecError(f"GPU {self.name}: family {self.family!r} or host {self.host!r} is unknown; "
                            f"families: {', '.join(FAMILIES)}; hosts: {', '.join(HOSTS)}")

    def supports(self, precision: str) -> bool:
        return PRECISION_ALIASES.get(precision, precision) in self.peak_tflops

    def peak(self, precision: str) -> float:
        """Dense peak TF/s for a layout precision (aliases accepted)."""
        p = PRECISION_ALIASES.get(precision, precision)
        if p not in self.peak_tflops:
            raise SpecError(f"{self.name} does not support precision {precision!r}; "
                            f"supported: {', '.join(self.peak_tflops)}")
        return float(self.peak_tflops[p])

    @property
    def is_cpu(self) -> bool:
        """The local host itself (gloo ranks), not an accelerator: its own cost terms apply."""
        return self.family == "cpu"

    def to_dict(self) -> dict:
        return {"name": self.name, "memory_gib": self.memory_gib, "peak_tflops": dict(self.peak_tflops),
                "hbm_tbps": self.hbm_tbps, "nvlink_domain": self.nvlink_domain, "nvlink_gbps": self.nvlink_gbps,
                "scaleout_gbps": self.scaleout_gbps, "host_link_gbps": self.host_link_gbps, "family": self.family,
                "host": self.host}


def _fp8(rate: float, mx: bool) -> dict:
    d = {"fp8-tensorwise": rate, "fp8-delayed": rate, "fp8-blockwise": rate}
    if mx:
        d["mxfp8"] = rate
    return d


# Sources: NVIDIA H100 datasheet (SXM5: BF16 989.4 TF dense, FP8 1978.9, TF32 494.7, HBM3 3.35 TB/s,
# NVLink 4 900 GB/s bidirectional, DGX H100: 8x ConnectX-7 400 Gb/s, PCIe Gen5 x16 64 GB/s per direction);
# H200 datasheet (same compute, 141 GB HBM3e 4.8 TB/s); DGX B200 datasheet (72 PF FP8 / 8 GPUs = 4.5 PF dense FP8,
# 2.25 PF BF16, HBM3e 8 TB/s, NVLink 5 1.8 TB/s bidirectional); GB200 NVL72 datasheet (per GPU 5 PF FP8 dense,
# 2.5 PF BF16, 186 GB HBM3e 8 TB/s, 72-GPU NVLink domain, NVLink-C2C 900 GB/s to Grace); GB300 NVL72 datasheet
# (288 GB HBM3e, ConnectX-8 800 Gb/s, FP8/BF16 as GB200); DGX B300 datasheet (288 GB HBM3e, 8x ConnectX-8).
# SMs: H100/H200 SXM 132, B200/GB200 148, B300/GB300 160.
GPUS: dict[str, GPUSpec] = {g.name: g for g in (
    GPUSpec("h100", 79.6, {"fp32": 494.7, "bf16": 989.4, **_fp8(1978.9, False)}, 3.35, 8, 450, 50, 55, "hopper", "x86",
            "H100 SXM5 80 GB (DGX H100)", 132),
    GPUSpec("h200", 140.0, {"fp32": 494.7, "bf16": 989.4, **_fp8(1978.9, False)}, 4.8, 8, 450, 50, 55, "hopper", "x86",
            "H200 SXM 141 GB (DGX H200)", 132),
    GPUSpec("b200", 179.0, {"fp32": 1100, "bf16": 2250, **_fp8(4500, True)}, 8.0, 8, 900, 50, 55, "blackwell", "x86",
            "B200 180 GB (DGX B200)", 148),
    GPUSpec("b300", 268.0, {"fp32": 1100, "bf16": 2250, **_fp8(4500, True)}, 8.0, 8, 900, 100, 55, "blackwell", "x86",
            "B300 288 GB (DGX B300)", 160),
    GPUSpec("gb200", 184.0, {"fp32": 1250, "bf16": 2500, **_fp8(5000, True)}, 8.0, 72, 900, 50, 450, "blackwell",
            "grace",
            "GB200 NVL72, 186 GB per GPU", 148),
    GPUSpec("gb300", 277.0, {"fp32": 1250, "bf16": 2500, **_fp8(5000, True)}, 8.0, 72, 900, 100, 450, "blackwell",
            "grace",
            "GB300 NVL72, 288 GB per GPU", 160),
    # Local CPU runs (gloo): all ranks share one host, so the "NVLink domain" is the machine; rates are a
    # rough 2-core figure, only used to order layouts, not to promise speed.
    GPUSpec("cpu", 16.0, {"fp32": 0.1, "bf16": 0.05}, 0.02, 64, 5, 5, 5, "cpu", "cpu",
            "host CPU (gloo), fp32/bf16 only"),
)}
GPU_NAMES: tuple[str, ...] = tuple(GPUS)

_ALIASES = {"h100-sxm": "h100", "h100-80gb": "h100", "dgx-h100": "h100", "dgx-h200": "h200", "dgx-b200": "b200",
            "dgx-b300": "b300", "dgx-gb200": "gb200", "dgx-gb300": "gb300", "gb200-nvl72": "gb200",
            "gb300-nvl72": "gb300"}


def load_gpu(name: str) -> GPUSpec:
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise SpecError(f"unknown GPU {excerpt(name)}; known: {', '.join(GPU_NAMES)}")  # may come from a file
    return GPUS[key]
