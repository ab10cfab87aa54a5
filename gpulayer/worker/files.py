"""A job's files on the worker: its source and inputs fetched (or, over what Redis should hold,
pulled from their submitter: :mod:`gpulayer.served_inputs`), checked against its signature and
unpacked into its folder; its outputs packed, signed and uploaded as it ends (or, over what Redis
should hold, kept on this worker: :mod:`.held`).

Each transfer is retried from its start through a Redis outage by the ``retry`` it is given (the
job's, which gives up once its lease could have passed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from .. import presigned
from ..archive import SPOOL_BYTES, Manifest, outputs_manifest, summarize
from ..home import private_folder
from ..models import JobSpec, OutputSummary
from ..pulls import Pull
from ..settings import Settings
from ..signing import ResultSigner, VerifyKey, WorkerKey, check_file, seal_archive
from ..store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE, SOURCE_ARCHIVE, ArtifactStore, HeldArchive
from ..store.execution import Claim
from ..store.transfers import TransferStore
from ..transfer_seal import SUBMITTERS
from ..units import format_size
from ..unpacking import extract
from .held import HeldOutputs

T = TypeVar("T")
log = logging.getLogger("gpulayer.worker")


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
    pulls: InputPulls,
) -> None:
    """Unpack job ``target``'s source and inputs into ``folder``, each checked against ``digests``
    (what its signature covers); inputs its submitter serves are pulled through ``pulls``."""
    names = ([SOURCE_ARCHIVE] if spec.source else []) + ([INPUTS_ARCHIVE] if spec.inputs else [])
    for name in names:
        held = retry(artifacts.held_inputs, target, name) if name == INPUTS_ARCHIVE else None
        if held is not None:
            check_file(digests, name, held.sha256)  # the one signed, before a byte of it comes
            with pulls.pulled(target, name, held) as archive:
                # As large as the submitter's files were: what they hold is the signed archive's.
                extract(archive, folder, max_bytes=max(max_bytes, held.unpacked))
            continue
        with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
            check_file(digests, name, retry(_download, artifacts, target, name, archive))
            # Inputs after the source, never over it: an input may not replace a source file.
            extract(archive, folder, max_bytes=max_bytes)


@dataclasses.dataclass(frozen=True)
class InputPulls:
    """How this worker pulls inputs their submitter serves: through ``transfers``, each chunk checked
    with the installation's job key ``checker``, into ``folder`` (a pull cut short resumes there)."""

    transfers: TransferStore
    checker: VerifyKey
    folder: Path

    @contextlib.contextmanager
    def pulled(self, target: str, name: str, held: HeldArchive) -> Iterator[IO[bytes]]:
        """Archive ``name`` of job ``target``, which ``held`` says its submitter serves (or the object
        store holds), pulled whole (checked against ``held.sha256``) and open at its start; removed
        after."""
        named = hashlib.sha256(target.encode()).hexdigest()[:16]
        partial = private_folder(self.folder) / f"{named}-{held.sha256[:16]}.part"
        try:
            if held.url is not None:  # in the object store
                presigned.fetch(held.url, partial, held.size, held.sha256)
            else:
                Pull(
                    self.transfers,
                    WorkerKey(SUBMITTERS, self.checker),
                    target,
                    name,
                    held,
                    partial,
                    who="its submitter",
                    again="submit it again, and keep the submit running until the job runs",
                ).run()
            with open(partial, "rb") as archive:
                yield archive
        finally:
            partial.unlink(missing_ok=True)


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
    held: Held,
    reading: Callable[[], contextlib.AbstractContextManager[None]],
    retry: Retry,
) -> tuple[OutputSummary | None, str | None]:
    """What the output ``patterns`` found in ``folder``, packed ``reading`` as the job's user and
    sealed by ``signer`` for ``claim``'s attempt: stored in Redis, or, above ``held``'s threshold, kept
    on this worker (and recorded in Redis); or why they could not be kept."""
    if not patterns:
        return None, None
    # As the job's user: a link it left towards the worker's files reads as nothing.
    with reading():
        manifest, missing = outputs_manifest(folder, patterns)
    summary = summarize(manifest, missing)
    if manifest.size > held.threshold:
        try:
            kept = _hold(manifest, claim, signer, held, reading)
        except OSError as exc:
            size = format_size(manifest.size)
            return None, f"cannot keep its {size} of outputs on worker {held.worker}: {exc}"
        kept = _put_away(kept, claim, held, retry(artifacts.outputs_urls, claim.target))
        retry(artifacts.hold_outputs, claim.job_id, claim.attempt, OUTPUTS_ARCHIVE, kept)
        return summary.model_copy(update={"held_by": kept.worker or None}), None
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as archive:
        with reading():
            manifest.write(archive)
        retry(_upload, artifacts, claim, signer, archive)
    return summary, None


@dataclasses.dataclass(frozen=True)
class Held:
    """Where this worker keeps outputs over ``threshold`` bytes: in ``outputs``, as worker ``worker``."""

    outputs: HeldOutputs
    worker: str
    threshold: int

    @classmethod
    def of(cls, settings: Settings, worker: str) -> Held:
        """Worker ``worker``'s, in its home, past ``settings.redis_outputs_max_bytes``."""
        return cls(HeldOutputs(settings.home / "held" / worker), worker, settings.redis_outputs_max_bytes)


def _put_away(kept: HeldArchive, claim: Claim, held: Held, urls: tuple[str, str] | None) -> HeldArchive:
    """What this worker keeps, put in the object store when the submitter gave ``urls`` to (its copy
    removed then); kept here if there are none, or the store refuses it."""
    if urls is None:
        return kept
    put, get = urls
    try:
        presigned.upload(put, held.outputs.path(claim.target, OUTPUTS_ARCHIVE))
    except OSError as exc:
        log.warning("job %s: its outputs stay on this worker: %s", claim.target, exc)
        return kept
    held.outputs.remove(claim.target)
    return dataclasses.replace(kept, worker="", url=get)


def _hold(
    manifest: Manifest,
    claim: Claim,
    signer: ResultSigner,
    held: Held,
    reading: Callable[[], contextlib.AbstractContextManager[None]],
) -> HeldArchive:
    """The outputs packed into this worker's keeping, for the job users know (a gang job's, from its
    node 0), and the record of them, sealed."""
    path, keep = held.outputs.writing(claim.target, OUTPUTS_ARCHIVE)
    # Opened by the worker, written as the job's user (who may not enter the worker's folder).
    with open(path, "wb") as archive, reading():
        manifest.write(archive)
    digest = hashlib.sha256()
    with open(path, "rb") as archive:
        size = 0
        while chunk := archive.read(SPOOL_BYTES):
            digest.update(chunk)
            size += len(chunk)
    keep()
    sha256 = digest.hexdigest()
    seal = seal_archive(signer, claim.target, claim.attempt, OUTPUTS_ARCHIVE, sha256)
    return HeldArchive(held.worker, size, sha256, seal)


def _upload(artifacts: ArtifactStore, claim: Claim, signer: ResultSigner, archive: IO[bytes]) -> None:
    # From the start on every try; the staged key is overwritten chunk by chunk.
    archive.seek(0)

    # For the job users know (a gang job's, from its node 0): what a client downloads and checks.
    def seal(sha256: str) -> str:
        return seal_archive(signer, claim.target, claim.attempt, OUTPUTS_ARCHIVE, sha256)

    artifacts.put_outputs(claim.job_id, claim.attempt, OUTPUTS_ARCHIVE, archive, seal=seal)
