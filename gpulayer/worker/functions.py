"""What a worker needs for function jobs: the code bundles unpacked on this machine, and its warm
executors."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ..archive import SPOOL_BYTES
from ..bundles import archive_digest
from ..errors import UntrustedPayload
from ..store.artifacts import BUNDLE_TTL, ArtifactStore
from ..unpacking import extract
from .executor_pool import ExecutorPool

#: A file in every unpacked bundle folder, holding its digest.
BUNDLE_MARKER = ".gpulayer-bundle"
#: A bundle folder in use is checked for and touched this often (s), not at every call.
_TOUCH = 3600.0
# Spool a bundle in memory up to this size while unpacking it, on disk beyond.


class CodeBundles:
    """Bundles unpacked under ``root``, one folder per digest, shared by every worker of this machine
    that uses the same home. A folder appears whole or not at all (unpacked aside, then renamed)."""

    def __init__(self, root: Path, artifacts: ArtifactStore, max_bytes: int) -> None:
        self._root = root
        #: What a bundle may unpack to: the submitters' source cap.
        self._max_bytes = max_bytes
        self._artifacts = artifacts
        self._lock = threading.Lock()
        #: When each bundle was last looked at: a folder in use is looked at (and touched) hourly.
        self._used: dict[str, float] = {}

    def folder(self, digest: str) -> Path:
        """The bundle's folder, unpacked now if this machine does not have it yet."""
        final = self._root / digest
        now = time.monotonic()
        if now - self._used.get(digest, -_TOUCH) < _TOUCH:
            return final
        if not final.is_dir():
            with self._lock:
                if not final.is_dir():
                    self._unpack(digest, final)
        # Its modification time says when it was last used (see prune).
        with contextlib.suppress(OSError):
            os.utime(final)
        self._used[digest] = now
        return final

    def _unpack(self, digest: str, final: Path) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=self._root))
        try:
            with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
                self._artifacts.get_bundle(digest, archive)
                archive.seek(0)
                # Its name is in the job's signature: only what the submitter shipped is unpacked.
                if archive_digest(archive, self._max_bytes) != digest:
                    raise UntrustedPayload("the code bundle is not the one the job was signed with")
                archive.seek(0)
                extract(archive, aside, max_bytes=self._max_bytes)
            _readable(aside)
            # Never empty, so another worker's rename cannot replace it under a running call (a
            # rename onto an empty folder succeeds; onto a full one it fails).
            (aside / BUNDLE_MARKER).write_text(digest + "\n")
            try:
                aside.rename(final)
            except OSError:
                if not final.is_dir():  # not another worker of this machine that got there first
                    raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)

    def prune(self, max_age: float = BUNDLE_TTL) -> int:
        """Remove bundles unused for ``max_age`` seconds (and unpacking a crash left behind)."""
        removed = 0
        now = time.time()
        for folder in self._root.glob("*"):
            with contextlib.suppress(OSError):
                if now - folder.stat().st_mtime > max_age:
                    shutil.rmtree(folder)
                    removed += 1
        return removed


def _readable(folder: Path) -> None:
    """Readable by every user, writable by the worker's only: jobs that run as another user import
    from it, and none may change what the next job imports."""
    for dirpath, _, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, (os.lstat(path).st_mode & 0o755) | 0o444)


@dataclasses.dataclass(frozen=True)
class FunctionRuntime:
    """A worker's means to run function jobs."""

    bundles: CodeBundles
    executors: ExecutorPool
