"""What the GPU kernel model reads of a device: its published rates and sizes, and the class
of its memory system."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Final

from perfswarm.model.opcost import OpCost
from perfswarm.model.specs import MIB, DeviceSpec, device_specs, sm_caches

# the fraction of its rated bandwidth a device's DRAM streams at (streams_near_peak or not)
STREAMED: Final = {True: 0.9, False: 0.75}


def streams_near_peak(architecture: str, memory: str) -> bool:
    """HBM behind a Volta-or-later memory controller: streaming kernels reach about 90% of the
    rated bandwidth there (V100, A100 measure 0.9), about 75% on GDDR parts and on Pascal's
    first HBM2 (P100, P4, T4 measure 0.74-0.76: shared/gpu-kernels' large elementwise ops)."""
    return memory.upper().startswith("HBM") and architecture.lower() not in ("", "pascal")


@dataclass(frozen=True)
class Hardware:
    """One GPU's specs as features: rates in bytes/s and FLOP/s, sizes in bytes."""

    name: str
    bandwidth: float
    sms: int
    fp32: float           # non-tensor-core FP32 peak
    tensor_fp32: float    # TF32 tensor-core peak (the FP32 peak on GPUs without one)
    tensor_half: float    # FP16/BF16 peak (tensor cores where there are)
    l2_bytes: float
    memory_bytes: float
    near_peak_memory: bool = False  # streams_near_peak: unknown devices count as not
    # BF16's peak, where it is not FP16's (a T4 and a V100 have no BF16 tensor cores: their
    # FP32 rate); 0: FP16's
    tensor_bf16: float = 0.0
    vendor: str = "nvidia"  # whose kernels it runs (cuBLAS's, or ROCm's on CDNA parts)
    sm_threads: int = 2048  # the most threads an SM keeps resident
    l1_bytes: float = 0.0  # an SM's L1 that holds global loads (0: they go to the L2 only)

    @property
    def tf32_cores(self) -> bool:
        """Whether it runs FP32 work on TF32 tensor cores (Ampere or later; not a V100, a T4)."""
        return self.tensor_fp32 > self.fp32

    def runs(self, cost: OpCost) -> OpCost:
        """`cost` as this GPU runs it: TF32 work (FP32 data on tensor cores) is FP32 work
        where it has no TF32 tensor cores (a recorded A100 kernel moved to a V100 or a T4, an
        op graph's convolutions there: no tensor cores, no layout passes around them)."""
        return replace(cost, dtype="fp32") if cost.dtype == "tf32" and not self.tf32_cores \
            else cost

    @property
    def streamed_bandwidth(self) -> float:
        """The bandwidth a streaming kernel reaches (STREAMED of the rated one): the memory
        bound of an elementwise, norm or softmax kernel's roofline (work.STREAMING), so that
        the trees need not find a GPU of its memory class among the measured ones to learn it
        (left out, the V100's large elementwise ops had been priced at 0.82 of its rated
        bandwidth, the A100 the one other near-peak GPU; it measures 0.93)."""
        return self.bandwidth * STREAMED[self.near_peak_memory]

    def dominates(self, other: Hardware) -> bool:
        """Whether it has at least as much of every rate and size the model reads as `other`
        (another of the same vendor's parts): its kernels then run at least as fast."""
        return (self.name != other.name and self.vendor == other.vendor
                and all(a >= b for a, b in (
                    (self.fp32, other.fp32), (self.tensor_fp32, other.tensor_fp32),
                    (self.tensor_half, other.tensor_half),
                    (self.tensor_bf16 or self.tensor_half, other.tensor_bf16 or other.tensor_half),
                    (self.bandwidth, other.bandwidth), (self.sms, other.sms),
                    (self.l2_bytes, other.l2_bytes))))

    @classmethod
    def of_spec(cls, spec: DeviceSpec) -> Hardware:
        """From a devices.yaml spec."""
        fp32 = spec.peak_for("fp32")
        return cls(spec.name, spec.memory_bandwidth, spec.compute_units, fp32,
                   max(fp32, spec.peak_for("tf32")),
                   max(fp32, spec.peak_for("fp16")), spec.l2_bytes, spec.memory_bytes,
                   streams_near_peak(spec.architecture, spec.memory),
                   max(fp32, spec.peak_for("bf16")),
                   "amd" if spec.architecture.upper().startswith(("CDNA", "RDNA", "GCN"))
                   else "nvidia", spec.sm_threads, spec.l1_bytes)

    @classmethod
    def of_config(cls, config: Mapping[str, float | str]) -> Hardware:
        """From a NeuSight-style device config (GB/s, GFLOP/s, MB of 2^20 bytes, GB): keys
        Device, Mem_Bw, Num_Sm, SingleFLOPs, L2Cache, Dev_Mem, and optionally
        Compute_Capability ('8.0'), which gives its SMs' resident threads and L1 as a
        devices.yaml device's (specs.SM_CACHES; without it: 2048 and no L1, every second read
        of a layer norm's row left to the L2); the model reads no more of it. Raises
        KeyError or ValueError on a missing or malformed field."""
        fp32 = float(config["SingleFLOPs"]) * 1e9
        threads, l1_bytes = sm_caches(str(config.get("Compute_Capability", "")))
        return cls(str(config["Device"]), float(config["Mem_Bw"]) * 1e9, int(config["Num_Sm"]),
                   fp32, fp32, fp32,
                   float(config["L2Cache"]) * MIB, float(config["Dev_Mem"]) * 1e9,
                   sm_threads=threads, l1_bytes=l1_bytes)


@cache
def bundled_hardware() -> tuple[Hardware, ...]:
    """Every device of the bundled specs (model/devices.yaml) as the model reads it."""
    return tuple(Hardware.of_spec(spec) for spec in device_specs().values())
