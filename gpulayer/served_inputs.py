"""Inputs too large for Redis, served by their submitter: packed into the client's home, recorded in
Redis (their size and SHA-256, no byte of them) and pulled by the worker that takes the job, through
Redis a window of chunks at a time (:mod:`gpulayer.archive_server`, :mod:`gpulayer.pulls`).

The submitter serves them until the job leaves ``queued`` and ``scheduled`` (its worker pulls them
while it is scheduled), then removes its copy: both sides only dial Redis, so either may be behind
NAT. A job whose submitter stopped serving before a worker pulled its inputs fails, saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import secrets
import time
from pathlib import Path

from .archive import SPOOL_BYTES, Manifest
from .archive_server import ArchiveServer
from .home import private_folder
from .models import JobState
from .signing import ResultSigner, SigningKey
from .store.artifacts import INPUTS_ARCHIVE, HeldArchive
from .store.stores import Stores
from .store.transfers import TransferStore
from .transfer_seal import SUBMITTERS

#: Where, in a client's home, the inputs it serves are packed.
SERVING = "serving"
#: While a job is in these states its inputs may still be pulled.
_PULLABLE = frozenset({JobState.QUEUED, JobState.SCHEDULED})


@dataclasses.dataclass(frozen=True)
class ServedInputs:
    """One submit's inputs archive, packed at ``path``, and its record (served as ``record.worker``)."""

    path: Path
    record: HeldArchive

    @classmethod
    def pack(cls, manifest: Manifest, home: Path, transfers: TransferStore, ttl: int) -> ServedInputs:
        """``manifest``'s files packed into ``home``, under a name of their own to serve as, said to
        be served (for ``ttl`` seconds) before the job is: its worker may ask at once."""
        name = f"submitter-{secrets.token_hex(8)}"
        folder = private_folder(home / SERVING)
        for left in folder.iterdir():  # by a client that stopped before its job ran: long given up
            with contextlib.suppress(OSError):
                if time.time() - left.stat().st_mtime > ttl:
                    left.unlink()
        path = folder / f"{name}.tar.gz"
        size, sha256 = packed(manifest, path)
        transfers.serving(name, ttl)
        return cls(path, HeldArchive(name, size, sha256, None, manifest.size))

    def serve(self, stores: Stores, job_id: str, key: SigningKey, ttl: int) -> ArchiveServer:
        """Serving them to the worker that takes job ``job_id``, signed with the job ``key``, until
        the job no longer waits for them (then the copy is removed); started."""
        server = _InputServer(stores, job_id, self, key, ttl)
        server.start()
        return server

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def packed(manifest: Manifest, path: Path) -> tuple[int, str]:
    """``manifest``'s files packed into the file ``path``: its size and SHA-256."""
    with open(path, "wb") as file:
        manifest.write(file)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(SPOOL_BYTES):
            digest.update(block)
    return path.stat().st_size, digest.hexdigest()


class _InputServer(ArchiveServer):
    def __init__(self, stores: Stores, job_id: str, served: ServedInputs, key: SigningKey, ttl: int) -> None:
        self._jobs = stores.jobs
        self._job_id = job_id
        self._served = served
        super().__init__(
            stores.transfers,
            served.record.worker,
            f"the submitter of job {job_id}",
            lambda asked, name: served.path if (asked, name) == (job_id, INPUTS_ARCHIVE) else None,
            ResultSigner(SUBMITTERS, key),
            ttl,
            fresh=True,
        )

    def tick(self) -> None:
        record = self._jobs.get(self._job_id)
        if record is None or record.state not in _PULLABLE:
            self.stop()
            # A transfer under way reads on: its file stays open.
            self._served.remove()
