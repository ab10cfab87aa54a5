"""``/metrics`` for Prometheus (the ``metrics`` role): what Redis says now, read at each scrape by a
collector of our own, so the numbers are the installation's, whichever server process answers."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..client import Client
from .auth import client, requires

metrics = Blueprint("metrics", __name__)


class InstallationCollector(Collector):
    """Jobs by state, queue depths, workers, and each worker's CPU slots and GPUs in use."""

    def __init__(self, connected: Client) -> None:
        self._client = connected

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "gpulayer_jobs", "Jobs by state (ended ones until their retention)", labels=["state"]
        )
        for state, count in self._client.job_counts().items():
            jobs.add_metric([state.value], count)
        yield jobs
        queues, gangs = self._client.queues()
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


@metrics.get("/metrics")
@requires("metrics")
def scrape() -> Response:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstallationCollector(client()))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
