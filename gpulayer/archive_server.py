"""Serving archives this side keeps to those that ask, through Redis (:mod:`gpulayer.store.transfers`),
sealed for each asker (:mod:`gpulayer.transfer_seal`): a worker serves the outputs it keeps
(:mod:`gpulayer.worker.serving`), a submitter the inputs too large for Redis until a worker pulled them.

One thread reads the server's request stream, says every :data:`SERVING_EVERY` seconds that it serves
(how an asker tells it gone) and does the owner's periodic work (:meth:`ArchiveServer.tick`); each
transfer runs in a thread of its own, :data:`MOST_TRANSFERS` at a time, and sends no chunk while
:data:`WINDOW` of them are unacked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from redis.exceptions import RedisError

from .signing import ResultSigner
from .store.transfers import SERVING_EVERY, TransferStore
from .transfer_seal import CHUNK, Ask, Sealer, refusal

log = logging.getLogger("gpulayer.transfers")

#: Chunks of one transfer sent and not yet acked, at most: what Redis holds of it (:data:`CHUNK` each).
WINDOW = 4
#: Transfers served at once; a request past them is refused, saying so (the asker asks again).
MOST_TRANSFERS = 4
#: A transfer whose receiver acks nothing for this long (s) is dropped (it resumes with a new one).
STALL = 30.0
#: How long (s) one wait on Redis lasts: within a socket timeout, short enough to stop.
_BLOCK = 0.5
#: Where archive ``name`` of job ``job_id`` is, if this side serves it (None: it does not).
Find = Callable[[str, str], Path | None]


class ArchiveServer:
    """Serves, as ``name`` (its request stream's), the archives ``find`` finds, sealed by ``signer``;
    says it serves for ``ttl`` seconds at a time. ``who`` names it in what askers are told. ``fresh``:
    ``name`` is new, so every request on its stream is for this server, even one made before it
    started (else those are given up: made while no one served them)."""

    def __init__(
        self,
        transfers: TransferStore,
        name: str,
        who: str,
        find: Find,
        signer: ResultSigner,
        ttl: int,
        *,
        fresh: bool = False,
    ) -> None:
        self._transfers = transfers
        self._name, self._who = name, who
        self._find = find
        self._signer = signer
        self._ttl = ttl
        self._after = "0-0" if fresh else None
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MOST_TRANSFERS)
        self._thread = threading.Thread(target=self._run, name="gpulayer-serving", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def tick(self) -> None:
        """The owner's periodic work, every :data:`SERVING_EVERY` seconds (it may :meth:`stop`)."""

    def _run(self) -> None:
        after = self._after
        said = 0.0
        while not self._stopping.is_set():
            try:
                now = time.monotonic()
                if now - said >= SERVING_EVERY:
                    self._transfers.serving(self._name, self._ttl)
                    self.tick()
                    said = now
                if after is None:  # from now: a request made while no one read them has been given up
                    after = self._transfers.last_request(self._name)
                for entry, ask in self._transfers.requests(self._name, after, _BLOCK):
                    after = entry
                    if ask is not None:
                        self._take(ask)
            except (RedisError, OSError) as exc:
                log.warning("serving as %s: %s; trying again", self._name, exc)
                self._stopping.wait(_BLOCK)

    def _take(self, ask: Ask) -> None:
        if not self._slots.acquire(blocking=False):
            self._transfers.send(ask.transfer_id, refusal(f"{self._who} is busy: ask again"))
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
        path = self._find(ask.job_id, ask.name)
        try:
            archive = open(path, "rb") if path else None  # noqa: SIM115  # closed below
        except FileNotFoundError:
            archive = None
        if archive is None:
            kept = f"{self._who} keeps no {ask.name} of job {ask.job_id}"
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
        quiet for :data:`STALL` seconds (or the server stops)."""
        quiet_since = time.monotonic()
        while not self._stopping.is_set() and time.monotonic() - quiet_since < STALL:
            written = self._transfers.acked(ask.transfer_id, _BLOCK)
            if written is not None and written > acked:
                return written
        self._transfers.close(ask.transfer_id)
        return -1
