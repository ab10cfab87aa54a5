"""``/metrics`` for Prometheus (the ``metrics`` role): what Redis says now, read at each scrape by a
collector of our own, so the numbers are the installation's, whichever server process answers."""

from __future__ import annotations

import math
from collections.abc import Iterator

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..service import Service
from .auth import requires, service

metrics = Blueprint("metrics", __name__)


class InstallationCollector(Collector):
    """Jobs by state, queue depths, workers, each worker's CPU slots and GPUs in use and its latest
    telemetry, and the histograms of jobs' start latency and run time."""

    def __init__(self, served: Service) -> None:
        self._service = served
        self._client = served.client

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "gpulayer_jobs", "Jobs by state (ended ones until their retention)", labels=["state"]
        )
        for state, count in self._client.job_counts().items():
            jobs.add_metric([state.value], count)
        yield jobs
        ended = CounterMetricFamily(
            "gpulayer_jobs_ended", "Jobs that ended, by final state, ever", labels=["state"]
        )
        for state, count in self._service.ended_counts().items():
            ended.add_metric([state.value], count)
        yield ended
        queues, gangs = self._service.queues()
        depth = GaugeMetricFamily("gpulayer_queue_depth", "Jobs waiting in each queue", labels=["queue"])
        for queue in queues:
            depth.add_metric([queue.name], queue.depth)
        yield depth
        yield GaugeMetricFamily("gpulayer_gang_jobs_waiting", "Gang jobs waiting for workers", value=gangs)
        workers = self._client.workers()
        yield GaugeMetricFamily("gpulayer_workers", "Connected workers", value=len(workers))
        slots = GaugeMetricFamily(
            "gpulayer_worker_cpu_slots", "CPU slots per worker", labels=["worker", "use"]
        )
        gpus = GaugeMetricFamily("gpulayer_worker_gpus", "GPUs per worker", labels=["worker", "use"])
        for worker in workers:
            slots.add_metric([worker.name, "busy"], worker.cpus_used)
            slots.add_metric([worker.name, "free"], max(worker.slots - worker.cpus_used, 0))
            gpus.add_metric([worker.name, "busy"], len(worker.gpus_busy))
            gpus.add_metric([worker.name, "free"], len(worker.gpus) - len(worker.gpus_busy))
        yield slots
        yield gpus
        yield from self._telemetry([worker.name for worker in workers])
        help_texts = {
            "start_latency": "Time from queued to running (files fetched, process started)",
            "run_time": "Time jobs ran, from start to end",
        }
        for name, histogram in self._service.histograms().items():
            yield HistogramMetricFamily(
                f"gpulayer_job_{name}_seconds",
                help_texts[name],
                buckets=[(_le(bound), count) for bound, count in histogram.buckets],
                sum_value=histogram.total,
            )

    def _telemetry(self, workers: list[str]) -> Iterator[GaugeMetricFamily]:
        """Each worker's latest sample, if it is recent (a few intervals old at most)."""
        recent = self._service.telemetry(self._client.settings.telemetry_interval * 3, workers)
        cpu = GaugeMetricFamily("gpulayer_worker_cpu_percent", "CPU use per worker", labels=["worker"])
        memory = GaugeMetricFamily(
            "gpulayer_worker_memory_used_bytes", "Memory in use per worker's machine", labels=["worker"]
        )
        labels = ["worker", "gpu", "uuid", "simulated"]
        use = GaugeMetricFamily("gpulayer_gpu_utilization_percent", "GPU utilisation", labels=labels)
        used = GaugeMetricFamily("gpulayer_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
        total = GaugeMetricFamily("gpulayer_gpu_memory_total_bytes", "GPU memory", labels=labels)
        heat = GaugeMetricFamily("gpulayer_gpu_temperature_celsius", "GPU temperature", labels=labels)
        for worker, samples in recent.items():
            if not samples:
                continue
            latest = samples[-1]
            cpu.add_metric([worker], latest.cpu_percent)
            memory.add_metric([worker], latest.memory_used)
            for gpu in latest.gpus:
                names = [worker, str(gpu.index), gpu.uuid, str(gpu.simulated).lower()]
                total.add_metric(names, gpu.memory_total)
                for family, value in (
                    (use, gpu.utilization),
                    (used, gpu.memory_used),
                    (heat, gpu.temperature),
                ):
                    if value is not None:
                        family.add_metric(names, value)
        yield from (cpu, memory, use, used, total, heat)


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus spells it."""
    return "+Inf" if math.isinf(bound) else str(bound)


@metrics.get("/metrics")
@requires("metrics")
def scrape() -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstallationCollector(service()))
    # content_type, not mimetype: Flask would add a second charset, which Prometheus 3 refuses.
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
