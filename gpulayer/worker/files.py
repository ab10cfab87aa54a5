"""A job's files on the worker: its source and inputs fetched, checked against its signature and
unpacked into its folder; its outputs packed, signed and uploaded as it ends.

Each transfer is retried from its start through a Redis outage by the ``retry`` it is given (the
job's, which gives up once its lease could have passed).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from ..archive import SPOOL_BYTES, pack_outputs
from ..errors import ArtifactTooLarge
from ..models import JobSpec, OutputSummary
from ..signing import ResultSigner, check_file, seal_archive
from ..store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE, SOURCE_ARCHIVE, ArtifactStore
from ..store.execution import Claim
from ..unpacking import extract

T = TypeVar("T")


class Retry(Protocol):
    def __call__(self, call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...


def fetch_inputs(
    artifacts: ArtifactStore,
    target: str,
    spec: JobSpec,
    digests: Mapping[str, str],
    folder: Path,
    *,
    max_bytes: int,
    retry: Retry,
) -> None:
    """Unpack job ``target``'s source and inputs into ``folder``, each checked against ``digests``
    (what its signature covers)."""
    names = ([SOURCE_ARCHIVE] if spec.source else []) + ([INPUTS_ARCHIVE] if spec.inputs else [])
    for name in names:
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
            check_file(digests, name, retry(_download, artifacts, target, name, archive))
            # Inputs after the source, never over it: an input may not replace a source file.
            extract(archive, folder, max_bytes=max_bytes)


def _download(artifacts: ArtifactStore, target: str, name: str, archive: IO[bytes]) -> str:
    # From the start on every try, so a download cut short by Redis leaves nothing behind.
    archive.seek(0)
    archive.truncate()
    digest = artifacts.get_inputs(target, name, archive)
    archive.seek(0)
    return digest


def upload_outputs(
    artifacts: ArtifactStore,
    claim: Claim,
    patterns: list[str],
    folder: Path,
    *,
    signer: ResultSigner,
    max_bytes: int,
    reading: Callable[[], contextlib.AbstractContextManager[None]],
    retry: Retry,
) -> tuple[OutputSummary | None, str | None]:
    """What the output ``patterns`` found in ``folder`` (or the reason they are too large to keep),
    packed ``reading`` as the job's user, and stored for ``claim``'s attempt, sealed by ``signer``."""
    if not patterns:
        return None, None
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
        try:
            # As the job's user: a link it left towards the worker's files reads as nothing.
            with reading():
                summary = pack_outputs(folder, patterns, archive, max_bytes)
        except ArtifactTooLarge as exc:
            return None, str(exc)
        retry(_upload, artifacts, claim, signer, archive)
    return summary, None


def _upload(artifacts: ArtifactStore, claim: Claim, signer: ResultSigner, archive: IO[bytes]) -> None:
    # From the start on every try; the staged key is overwritten chunk by chunk.
    archive.seek(0)

    # For the job users know (a gang job's, from its node 0): what a client downloads and checks.
    def seal(sha256: str) -> str:
        return seal_archive(signer, claim.target, claim.attempt, OUTPUTS_ARCHIVE, sha256)

    artifacts.put_outputs(claim.job_id, claim.attempt, OUTPUTS_ARCHIVE, archive, seal=seal)
