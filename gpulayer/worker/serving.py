"""Serving the archives this worker keeps (:mod:`.held`) to the clients that ask
(:mod:`gpulayer.archive_server`), and sweeping those past the retention."""

from __future__ import annotations

import time

from ..archive_server import ArchiveServer
from ..settings import Settings
from ..signing import ResultSigner
from ..store.artifacts import OUTPUTS_ARCHIVE
from ..store.stores import Stores
from .files import Held

#: What is kept is swept this often (s).
SWEEP_EVERY = 3600.0
#: The archives a client may ask for.
_SERVED = frozenset({OUTPUTS_ARCHIVE})


class OutputServer(ArchiveServer):
    """Serves the archives ``held`` keeps, sealed by ``signer``; sweeps those past the retention."""

    def __init__(self, stores: Stores, held: Held, signer: ResultSigner, settings: Settings) -> None:
        self._exist = stores.jobs.exist
        self._held = held.outputs
        self._retention = settings.retention_seconds
        self._swept: float | None = None
        super().__init__(
            stores.transfers,
            held.worker,
            f"worker {held.worker}",
            lambda job_id, name: self._held.path(job_id, name) if name in _SERVED else None,
            signer,
            settings.retention_seconds,
        )

    def tick(self) -> None:
        now = time.monotonic()
        if self._swept is None or now - self._swept >= SWEEP_EVERY:
            self._held.sweep(self._retention, self._exist)
            self._swept = now
