"""A job's checkpoint folder, kept in Redis while the job runs, so that a retry starts from what the
last attempt saved there, on whichever worker it lands.

Every command job gets an empty folder of its own beside its working folder, named to it in
``GPULAYER_CHECKPOINT_DIR``. While
it runs, the worker archives the folder every ``GPULAYER_CHECKPOINT_INTERVAL`` seconds if anything in
it changed (names, sizes, modification times), and once more when its processes end; the archive
becomes the job's only if the attempt still owns the job (``keep_checkpoint.lua``). A later attempt
finds the folder filled with it before its command starts, if the worker that ran the attempt which
kept it signed it (else the attempt starts without it, saying so). For a gang job, node 0's folder is
kept, and restored on node 0. The job's checkpoint is deleted when the job ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis.exceptions

from ..archive import SPOOL_BYTES, folder_manifest
from ..errors import UntrustedPayload
from ..signing import ResultSigner, seal_archive
from ..store.artifacts import CHECKPOINT_ARCHIVE, ArtifactStore, MissingArtifact
from ..store.execution import Claim, ExecutionStore
from ..units import format_size
from ..unpacking import extract

log = logging.getLogger("gpulayer.worker")
#: The folder's name: the job folder's, with this in front.
PREFIX = "ckpt-"

Signature = tuple[tuple[str, int, int], ...]


class CheckpointKeeper:
    def __init__(
        self,
        folder: Path,
        claim: Claim,
        store: ExecutionStore,
        artifacts: ArtifactStore,
        signer: ResultSigner,
        check: Callable[[str, str, str, str | None], None],
        *,
        interval: float,
        max_bytes: int,
        say: Callable[[str], None],
        reading: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.folder = folder
        self._claim = claim
        self._store = store
        self._artifacts = artifacts
        self._signer = signer
        #: Checks the kept archive (job id, name, SHA-256, seal) before it is unpacked.
        self._check = check
        self._interval = interval
        self._max_bytes = max_bytes
        self._say = say
        #: How the folder, the job's own, is read: with the job's user's permissions.
        self._reading = reading
        self._kept: Signature = ()
        self._next = time.monotonic() + interval
        self._too_large = False

    def restore(self) -> None:
        """Fill the folder with the checkpoint an earlier attempt kept, if there is one."""
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
            try:
                sha256, seal = self._artifacts.get_checkpoint(self._claim.target, archive)
                self._check(self._claim.target, CHECKPOINT_ARCHIVE, sha256, seal)
            except MissingArtifact:
                return
            except UntrustedPayload as exc:
                self._say(f"the checkpoint folder an earlier attempt kept is not restored: {exc}")
                return
            size = archive.tell()
            archive.seek(0)
            extract(archive, self.folder, max_bytes=self._max_bytes)
        self._kept = self._signature()
        self._say(f"restored the checkpoint folder an earlier attempt kept ({format_size(size)})")

    def tick(self, *, now: bool = False) -> None:
        """Keep the folder if it changed since it was last kept, at most once an interval (``now``:
        whatever the interval). A failure to keep it is said in the log; the job runs on."""
        if not now and time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._interval
        try:
            with self._reading():
                signature = self._signature()
                if signature and signature != self._kept:
                    self._keep(signature)
        except (OSError, redis.exceptions.RedisError) as exc:
            log.warning("job %s: could not keep its checkpoint folder: %s", self._claim.target, exc)

    def _keep(self, signature: Signature) -> None:
        manifest = folder_manifest(self.folder)
        if manifest.size > self._max_bytes:
            if not self._too_large:
                self._too_large = True
                self._say(
                    f"the checkpoint folder holds {format_size(manifest.size)}, above the "
                    f"{format_size(self._max_bytes)} per-job cap (GPULAYER_MAX_JOB_BYTES): not kept"
                )
            return
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
            manifest.write(archive)
            archive.seek(0)
            claim, signer = self._claim, self._signer
            self._artifacts.put_checkpoint(
                claim.target,
                claim.attempt,
                archive,
                lambda sha256: seal_archive(signer, claim.target, claim.attempt, CHECKPOINT_ARCHIVE, sha256),
            )
        if self._store.keep_checkpoint(self._claim):
            self._kept = signature

    def _signature(self) -> Signature:
        try:
            with os.scandir(self.folder) as entries:
                if next(entries, None) is None:
                    return ()  # the usual case of a job that keeps nothing, without a walk
        except (FileNotFoundError, NotADirectoryError):
            return ()  # the job removed it: nothing to keep, as a walk would find
        found = []
        for path in sorted(self.folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                stat = path.stat()
                found.append((path.relative_to(self.folder).as_posix(), stat.st_size, stat.st_mtime_ns))
        return tuple(found)
