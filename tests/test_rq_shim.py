"""The worker's one reach into RQ's private members (:mod:`gpulayer.worker.rq_shim`) still meets them
in the RQ installed: CI runs this file under RQ 2 and RQ 3 (``.ci/run``)."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest
import redis
from rq.queue import Queue
from rq.worker import WorkerStatus

from gpulayer.worker.rq_shim import RQWorkerShim


class Recording(RQWorkerShim):
    """A shim that notes its warm shutdowns instead of stopping."""

    warm_shutdowns = 0

    def warm_shutdown(self) -> None:
        self.warm_shutdowns += 1


@pytest.fixture
def signals_kept() -> Iterator[None]:
    """RQ's signal handling replaces this process's handlers: they are put back."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def made(kind: type[RQWorkerShim], raw_redis: redis.Redis) -> RQWorkerShim:
    return kind(queues=[], connection=raw_redis, name=f"shim-{uuid.uuid4().hex[:8]}")


def test_rq_asks_the_shim_for_the_address_redis_sees_the_worker_at(raw_redis: redis.Redis) -> None:
    worker = made(RQWorkerShim, raw_redis)
    host, _, port = worker.ip_address.rpartition(":")
    assert host == "127.0.0.1"
    assert port.isdigit()


@pytest.mark.usefixtures("signals_kept")
def test_a_first_signal_reaches_the_warm_shutdown_through_rqs_own_handler(raw_redis: redis.Redis) -> None:
    worker = made(Recording, raw_redis)
    assert isinstance(worker, Recording)
    worker.request_stop(signal.SIGTERM, None)
    assert worker.warm_shutdowns == 1


@pytest.mark.usefixtures("signals_kept")
def test_the_stop_flag_is_the_one_rqs_loop_reads(raw_redis: redis.Redis) -> None:
    worker = made(RQWorkerShim, raw_redis)
    assert not worker.stop_requested
    # RQ's own warm shutdown of a busy worker sets its flag: the shim reads that one.
    worker.set_state(WorkerStatus.BUSY)
    worker.request_stop(signal.SIGTERM, None)
    assert worker.stop_requested
    worker.stop_requested = False
    assert not worker.stop_requested


def test_the_queues_served_are_the_ones_rqs_dequeue_goes_through(raw_redis: redis.Redis) -> None:
    worker = made(RQWorkerShim, raw_redis)
    queues = [Queue(name, connection=raw_redis) for name in ("shim-a", "shim-b")]
    worker.serve(queues)
    assert worker.queue_names() == ["shim-a", "shim-b"]
    assert [queue.name for queue in worker._ordered_queues] == ["shim-a", "shim-b"]
