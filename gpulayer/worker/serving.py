"""Serving the archives this worker keeps (:mod:`.held`) to the clients that ask, through Redis
(:mod:`gpulayer.store.transfers`), sealed for each asker (:mod:`gpulayer.transfer_seal`).

One thread reads the worker's request stream, says every :data:`SERVING_EVERY` seconds that the
worker serves (how a client tells it gone), and sweeps what expired; each transfer runs in a thread
of its own, :data:`MOST_TRANSFERS` at a time, and sends no chunk while :data:`WINDOW` of them are
unacked.
"""

from __future__ import annotations

import logging
import threading
import time

from redis.exceptions import RedisError

from ..settings import Settings
from ..signing import ResultSigner
from ..store.artifacts import OUTPUTS_ARCHIVE
from ..store.stores import Stores
from ..store.transfers import SERVING_EVERY
from ..transfer_seal import CHUNK, Ask, Sealer, refusal
from .files import Held

log = logging.getLogger("gpulayer.worker")

#: Chunks of one transfer sent and not yet acked, at most: what Redis holds of it (:data:`CHUNK` each).
WINDOW = 4
#: Transfers served at once; a request past them is refused, saying so (the client asks again).
MOST_TRANSFERS = 4
#: A transfer whose receiver acks nothing for this long (s) is dropped (it resumes with a new one).
STALL = 30.0
#: What is kept is swept this often (s).
SWEEP_EVERY = 3600.0
#: How long (s) one wait on Redis lasts: within the worker's socket timeout, short enough to stop.
_BLOCK = 0.5
#: The archives a client may ask for.
_SERVED = frozenset({OUTPUTS_ARCHIVE})


class OutputServer:
    """Serves the archives ``held`` keeps, sealed by ``signer``; sweeps those past the retention."""

    def __init__(self, stores: Stores, held: Held, signer: ResultSigner, settings: Settings) -> None:
        self._transfers = stores.transfers
        self._exist = stores.jobs.exist
        self._held = held.outputs
        self._worker = held.worker
        self._signer = signer
        self._retention = settings.retention_seconds
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MOST_TRANSFERS)
        self._thread = threading.Thread(target=self._run, name="gpulayer-outputs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        after: str | None = None
        said = swept = 0.0
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now - said >= SERVING_EVERY:
                    self._transfers.serving(self._worker, self._retention)
                    said = now
                if now - swept >= SWEEP_EVERY:
                    self._held.sweep(self._retention, self._exist)
                    swept = now
                if after is None:  # from now: a request made while no worker read them has been given up
                    after = self._transfers.last_request(self._worker)
                for entry, ask in self._transfers.requests(self._worker, after, _BLOCK):
                    after = entry
                    if ask is not None:
                        self._take(ask)
            except (RedisError, OSError) as exc:
                log.warning("serving held outputs: %s; trying again", exc)
                self._stopping.wait(_BLOCK)

    def _take(self, ask: Ask) -> None:
        if not self._slots.acquire(blocking=False):
            self._transfers.send(ask.transfer_id, refusal(f"worker {self._worker} is busy: ask again"))
            return
        threading.Thread(target=self._serve, args=(ask,), name="gpulayer-transfer", daemon=True).start()

    def _serve(self, ask: Ask) -> None:
        try:
            self._send(ask)
        except (RedisError, OSError) as exc:
            log.warning("job %s: sending its %s stopped: %s", ask.job_id, ask.name, exc)
        finally:
            self._slots.release()

    def _send(self, ask: Ask) -> None:
        path = self._held.path(ask.job_id, ask.name) if ask.name in _SERVED else None
        try:
            archive = open(path, "rb") if path else None  # noqa: SIM115  # closed below
        except FileNotFoundError:
            archive = None
        if archive is None:
            kept = f"worker {self._worker} keeps no {ask.name} of job {ask.job_id}"
            self._transfers.send(ask.transfer_id, refusal(f"{kept} (removed, or past its retention)"))
            return
        with archive:
            size = archive.seek(0, 2)
            sealer = Sealer(ask, self._signer)
            self._transfers.send(ask.transfer_id, sealer.hello(size))
            archive.seek(min(ask.offset, size))
            sent = acked = 0
            while True:
                chunk = archive.read(CHUNK)
                while sent - acked >= WINDOW:
                    acked = self._wait_ack(ask, acked)
                    if acked < 0:
                        return
                self._transfers.send(ask.transfer_id, sealer.seal(sent, chunk))
                sent += 1
                if not chunk:  # the end, sealed as such
                    return

    def _wait_ack(self, ask: Ask, acked: int) -> int:
        """How many chunks the receiver has written, once it acks more than ``acked``; -1 if it went
        quiet for :data:`STALL` seconds (or the worker stops)."""
        quiet_since = time.monotonic()
        while not self._stopping.is_set() and time.monotonic() - quiet_since < STALL:
            written = self._transfers.acked(ask.transfer_id, _BLOCK)
            if written is not None and written > acked:
                return written
        self._transfers.close(ask.transfer_id)
        return -1
