"""Output archives too large for Redis, kept in the worker's own folder until their job expires.

Each job's archive lives in a folder named by the SHA-256 of the job's id (so no id, whatever it
holds, names a path of its choosing), beside a file naming the job. Kept while the job's record is in
Redis (its retention); a sweep removes those whose job is gone, and any older than the retention.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..home import private_folder
from .folders import remove_folder

log = logging.getLogger("gpulayer.worker")
_JOB_FILE = "job"
#: What a folder being written is named with, so a sweep (or a download) never takes it for whole.
_PARTIAL = ".part"


class HeldOutputs:
    """The archives one worker keeps, in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = private_folder(root)

    def path(self, job_id: str, name: str) -> Path:
        """Where archive ``name`` of job ``job_id`` is kept (it may not exist)."""
        return self._folder(job_id) / name

    def _folder(self, job_id: str) -> Path:
        return self.root / hashlib.sha256(job_id.encode()).hexdigest()

    def remove(self, job_id: str) -> None:
        """What is kept for job ``job_id`` (it went elsewhere)."""
        remove_folder(self._folder(job_id))

    def writing(self, job_id: str, name: str) -> tuple[Path, Callable[[], Path]]:
        """A new file to write archive ``name`` of job ``job_id`` in, and what makes it the kept one
        once it is whole (replacing one an earlier attempt kept)."""
        folder = self._folder(job_id)
        partial = folder.with_name(folder.name + _PARTIAL)
        remove_folder(partial)
        partial.mkdir(mode=0o700)
        (partial / _JOB_FILE).write_text(job_id)

        def keep() -> Path:
            remove_folder(folder)
            os.rename(partial, folder)
            return folder / name

        return partial / name, keep

    def sweep(self, retention: float, exist: Callable[[list[str]], Iterable[bool]]) -> int:
        """Remove what was kept for jobs that no longer ``exist`` (asked of a list of ids at once),
        what is older than ``retention`` seconds, and what was left half written; how many."""
        kept: dict[str, Path] = {}
        removed = 0
        for folder in self.root.iterdir():
            partial = folder.name.endswith(_PARTIAL)
            try:
                old = time.time() - folder.stat().st_mtime > retention
            except OSError:  # made the kept one, or removed, meanwhile
                continue
            job = None if partial else _job_of(folder)
            if old or (not partial and job is None):
                remove_folder(folder)
                removed += 1
            elif job is not None:
                kept[job] = folder
        for folder, there in zip(kept.values(), exist(list(kept)), strict=True):
            if not there:
                remove_folder(folder)
                removed += 1
        if removed:
            log.info("removed the outputs of %d job(s) past their retention", removed)
        return removed


def _job_of(folder: Path) -> str | None:
    try:
        return (folder / _JOB_FILE).read_text()
    except OSError:
        return None
