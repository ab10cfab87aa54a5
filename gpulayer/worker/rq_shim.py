"""Where GPUlayer's worker reaches past RQ's public methods into its worker's private members: here
alone, so a new RQ changes one module, and ``tests/test_rq_shim.py`` (run under RQ 2 and RQ 3: see
``.ci/run``) says at once whether it did.

RQ 2.12 to 3.0 name them the same: ``_set_ip_address`` (called from RQ's ``__init__``),
``_shutdown`` (a first SIGINT or SIGTERM), ``_stop_requested`` (its loop's stop flag) and
``_ordered_queues`` (the queues its dequeue goes through).
"""

from __future__ import annotations

from typing import Any

import redis.exceptions
from redis import Redis
from rq.queue import Queue
from rq.worker import BaseWorker


class RQWorkerShim(BaseWorker):
    """RQ's worker, its private members reached through public names."""

    def _set_ip_address(self, connection: Redis) -> None:
        """The address Redis sees this worker at, from CLIENT INFO: RQ's own way may list every
        client (CLIENT LIST), which a worker's Redis user may not."""
        try:
            self.ip_address = str(connection.client_info()["addr"])
        except (redis.exceptions.ResponseError, KeyError):
            self.ip_address = "unknown"

    def _shutdown(self, *args: Any) -> None:
        """RQ's warm shutdown, the first signal's: :meth:`warm_shutdown`."""
        self.warm_shutdown()

    def warm_shutdown(self) -> None:
        """Take no new jobs; running ones finish (RQ's own: stop after the current job)."""
        super()._shutdown()  # type: ignore[no-untyped-call]

    @property
    def stop_requested(self) -> bool:
        """Whether RQ's loop is to stop (it looks between jobs, and a worker's own loop too)."""
        return self._stop_requested

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        self._stop_requested = value

    def serve(self, queues: list[Queue]) -> None:
        """Serve ``queues`` from now on, in this order."""
        self.queues = queues
        self._ordered_queues = queues[:]
