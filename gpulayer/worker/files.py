"""A job's files on the worker: its source and inputs fetched, checked against its signature and
unpacked into its folder; its outputs packed, signed and uploaded as it ends."""

from __future__ import annotations

import tempfile
from typing import IO, TYPE_CHECKING

from ..archive import SPOOL_BYTES, pack_outputs
from ..errors import ArtifactTooLarge
from ..models import OutputSummary
from ..signing import check_file, seal_archive
from ..store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE, SOURCE_ARCHIVE
from ..unpacking import extract

if TYPE_CHECKING:
    from .runner import JobRunner

# Spool archives in memory up to this size, on disk beyond.


def fetch_inputs(job: JobRunner) -> None:
    names = ([SOURCE_ARCHIVE] if job.spec.source else []) + ([INPUTS_ARCHIVE] if job.spec.inputs else [])
    for name in names:
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
            check_file(job.digests, name, job.through_outage(_download, job, name, archive))
            # Inputs after the source, never over it: an input may not replace a source file.
            extract(archive, job.workdir, max_bytes=job.context.settings.max_job_bytes)


def _download(job: JobRunner, name: str, archive: IO[bytes]) -> str:
    # From the start on every try, so a download cut short by Redis leaves nothing behind.
    archive.seek(0)
    archive.truncate()
    digest = job.context.artifacts.get_inputs(job.claim.target, name, archive)
    archive.seek(0)
    return digest


def upload_outputs(job: JobRunner) -> tuple[OutputSummary | None, str | None]:
    """What the job's output patterns found (or the reason they are too large to keep)."""
    if not job.spec.outputs:
        return None, None
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
        try:
            # As the job's user: a link it left towards the worker's files reads as nothing.
            with job.processes.reading():
                summary = pack_outputs(
                    job.workdir, job.spec.outputs, archive, job.context.settings.max_job_bytes
                )
        except ArtifactTooLarge as exc:
            return None, str(exc)
        job.through_outage(_upload, job, archive)
    return summary, None


def _upload(job: JobRunner, archive: IO[bytes]) -> None:
    # From the start on every try; the staged key is overwritten chunk by chunk.
    archive.seek(0)
    claim = job.claim

    # For the job users know (a gang job's, from its node 0): what a client downloads and checks.
    def seal(sha256: str) -> str:
        return seal_archive(job.context.signer, claim.target, claim.attempt, OUTPUTS_ARCHIVE, sha256)

    job.context.artifacts.put_outputs(job.job_id, claim.attempt, OUTPUTS_ARCHIVE, archive, seal=seal)
