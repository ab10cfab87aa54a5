"""What a machine has (:class:`Resources`), and what a worker offers and holds now (:class:`WorkerInfo`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

#: Packages shown by `resources detect` and `workers`; matching sees every installed package.
KNOWN_FRAMEWORKS = (
    "torch",
    "torchvision",
    "jax",
    "jaxlib",
    "mlx",
    "cupy",
    "tensorflow",
    "onnxruntime",
    "onnxruntime-gpu",
    "tensorrt",
    "transformers",
    "numpy",
)


#: A worker not heard from for this many of its heartbeats counts as gone: no gang job is placed on
#: it, and a worker elsewhere may take its name.
SILENT_BEATS = 3


#: The kinds of device: NVIDIA's (CUDA), AMD's (ROCm), Apple Silicon's (Metal).
GpuKind = Literal["cuda", "rocm", "mps"]


class GPU(BaseModel):
    """One accelerator device. ``index`` is nvidia-smi's numbering (PCI bus order) for CUDA, and
    amd-smi's for ROCm."""

    index: int
    kind: GpuKind
    name: str
    uuid: str
    pci_bus_id: str | None = None
    memory_total: int
    memory_free: int | None = None
    compute_capability: str | None = None
    #: A device the worker was told to pretend it has (GPULAYER_FAKE_GPUS), for tests and demos.
    simulated: bool = False
    #: Its device node's minor number (``/dev/nvidia<minor>``), for the device fence; a simulated
    #: GPU's is its index.
    minor: int | None = None


class Resources(BaseModel):
    """This machine, as detected."""

    host: str
    platform: str
    cpus: int
    memory: int
    gpus: list[GPU] = Field(default_factory=list)
    #: How NVIDIA GPUs were looked for: ``ok``, or why there are none.
    nvml: str
    #: How AMD GPUs were looked for (where there are no NVIDIA ones): ``ok``, or why there are none.
    amd: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    #: Every installed Python distribution (normalised name → version), as the worker's Python sees it.
    frameworks: dict[str, str] = Field(default_factory=dict)

    def known_frameworks(self) -> dict[str, str]:
        return known(self.frameworks)

    @property
    def why_no_gpus(self) -> str:
        """Why none were found, in words: each kind looked for."""
        return "; ".join(filter(None, [self.nvml, self.amd and f"AMD: {self.amd}"]))


def known(frameworks: dict[str, str]) -> dict[str, str]:
    """The well-known frameworks among installed packages (any ``cupy-*`` build counts as cupy)."""
    shown = {name: version for name, version in frameworks.items() if name in KNOWN_FRAMEWORKS}
    shown.update({name: version for name, version in frameworks.items() if name.startswith("cupy-")})
    return dict(sorted(shown.items()))


class Offer(BaseModel):
    """What a worker offers to jobs, as it registers it."""

    #: CPU slots.
    slots: int
    #: Bytes of memory.
    memory: int
    gpus: list[GPU] = Field(default_factory=list)
    #: How its jobs are contained (cgroups), in words: see `gpulayer workers`.
    containment: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    frameworks: dict[str, str] = Field(default_factory=dict)
    #: The machine it runs on (:func:`gpulayer.machines.this_machine`); None from a worker before 0.4.
    machine: str | None = None


class WorkerInfo(Offer):
    """A live worker: what it offers, and what its running jobs hold now."""

    name: str
    host: str
    pid: int
    #: RQ's worker state: ``idle``, ``busy``, ``suspended``, ...
    state: str
    birth: datetime | None = None
    last_heartbeat: datetime | None = None
    #: Seconds between its heartbeats.
    heartbeat: float = 5.0
    #: The address other machines reach its gang jobs' rank 0 at (``--advertise-addr``).
    address: str | None = None
    #: The machine identity it runs under (`gpulayer access add worker NAME`).
    identity: str | None = None
    #: Jobs it has taken and not yet ended.
    running: int = 0
    cpus_used: int = 0
    memory_used: int = 0
    #: UUIDs of its GPUs that a job holds now.
    gpus_busy: list[str] = Field(default_factory=list)

    @property
    def load(self) -> float:
        """How busy it is, 0 to 1: the busier of its CPU slots and its GPUs."""
        cpu = self.cpus_used / self.slots if self.slots else 0.0
        gpu = len(self.gpus_busy) / len(self.gpus) if self.gpus else 0.0
        return max(cpu, gpu)

    @property
    def simulated(self) -> bool:
        return any(gpu.simulated for gpu in self.gpus)


class GpuSample(BaseModel):
    """One GPU's use at one moment. A simulated GPU reports 100% while a job holds it, else 0%, and
    no memory or temperature."""

    index: int
    uuid: str
    #: Percent of the last sample period a kernel ran (NVML's utilization rate).
    utilization: float | None = None
    memory_used: int | None = None
    memory_total: int
    #: Degrees Celsius.
    temperature: float | None = None
    simulated: bool = False


class Telemetry(BaseModel):
    """A worker's machine at one moment, published every few seconds."""

    #: Milliseconds since the epoch.
    time: int
    cpu_percent: float
    #: The 1-minute load average.
    load: float
    memory_used: int
    memory_total: int
    gpus: list[GpuSample] = Field(default_factory=list)
    #: Processes of the worker's jobs running now (its warm executors too): all its descendants.
    task_processes: int | None = None
