"""A worker's telemetry: every few seconds, its machine's CPU, memory and each GPU's use (NVML, or
AMD's tools), kept in Redis for an hour and published for the dashboard; and, by one worker per
interval, a sample of the whole installation (jobs by state, queue depths) for the activity charts."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..amd import AmdProbe, Reading
from ..inventory import GPU, GpuSample, Telemetry
from ..models import ActivitySample
from ..store.telemetry import TelemetryStore
from .process import descendants

log = logging.getLogger("gpulayer.worker")


class GpuProbe:
    """Reads each GPU's use. NVIDIA GPUs through NVML (opened once), AMD GPUs through AMD's tools
    (:class:`AmdProbe`); a simulated GPU reports 100% while a job holds it; a GPU neither can read
    (Apple's) reports what it can: its size."""

    def __init__(self, gpus: list[GPU]) -> None:
        self._gpus = gpus
        self._handles: dict[str, Any] = {}
        self._nvml: Any = None
        real_amd = [gpu for gpu in gpus if gpu.kind == "rocm" and not gpu.simulated]
        self._amd = AmdProbe(real_amd) if real_amd else None
        if any(gpu.kind == "cuda" and not gpu.simulated for gpu in gpus):
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handles = {
                    gpu.uuid: pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                    for gpu in gpus
                    if gpu.kind == "cuda" and not gpu.simulated
                }
            except Exception as exc:  # NVML missing or broken: sample what psutil sees, say why once
                log.warning("telemetry: cannot read GPUs through NVML: %s", exc)

    def sample(self, busy: set[int]) -> list[GpuSample]:
        amd = self._amd.read() if self._amd is not None else {}  # one read for all of them
        return [self._one(gpu, gpu.index in busy, amd.get(gpu.index)) for gpu in self._gpus]

    def _one(self, gpu: GPU, busy: bool, amd: Reading | None) -> GpuSample:
        sample = GpuSample(index=gpu.index, uuid=gpu.uuid, memory_total=gpu.memory_total)
        if gpu.simulated:
            sample.utilization, sample.simulated = (100.0 if busy else 0.0), True
            return sample
        if gpu.kind == "rocm":
            if amd is not None:
                sample.utilization, sample.memory_used = amd.utilization, amd.memory_used
                sample.temperature = amd.temperature
            return sample
        handle = self._handles.get(gpu.uuid)
        if handle is None:
            return sample
        nvml = self._nvml
        try:
            sample.utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            sample.memory_used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            sample.temperature = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        except nvml.NVMLError as exc:  # a GPU that fell off the bus shows as unknown, not as an error
            log.debug("telemetry: GPU %s: %s", gpu.uuid, exc)
        return sample

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
        if self._amd is not None:
            self._amd.close()


class TelemetryReporter(threading.Thread):
    """Samples every ``store.interval`` seconds until stopped. ``busy`` names the indices of the GPUs
    this worker's jobs hold; ``activity`` samples the installation when it is this worker's turn."""

    def __init__(
        self,
        store: TelemetryStore,
        name: str,
        gpus: list[GPU],
        busy: Callable[[], set[int]],
        activity: Callable[[], ActivitySample],
    ) -> None:
        super().__init__(name="gpulayer-telemetry", daemon=True)
        self._store = store
        self._name = name
        self._probe = GpuProbe(gpus)
        self._busy = busy
        self._activity = activity
        self._stopping = threading.Event()
        psutil.cpu_percent(None)  # the first reading starts the interval the next one measures

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        try:
            while not self._stopping.wait(self._store.interval):
                try:
                    self.report()
                except Exception as exc:  # Redis away for a moment: the next sample tries again
                    log.warning("telemetry: worker %s: %s", self._name, exc)
        finally:
            self._probe.close()

    def report(self) -> None:
        memory = psutil.virtual_memory()
        self._store.record(
            self._name,
            Telemetry(
                time=int(time.time() * 1000),
                cpu_percent=psutil.cpu_percent(None),
                load=os.getloadavg()[0],
                memory_used=memory.total - memory.available,
                memory_total=memory.total,
                gpus=self._probe.sample(self._busy()),
                task_processes=len(descendants(os.getpid())),
            ),
        )
        if self._store.activity_turn(self._name):
            self._store.record_activity(self._activity())
