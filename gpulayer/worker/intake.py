"""A claimed job's way in: checked to be exactly what a submitter signed, and claimed as what it
signed asks, then given its runner; or failed, unrun."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from ..errors import UntrustedPayload
from ..inventory import Offer
from ..models import MAX_SPEC_BYTES, JobSpec, JobState, validation_message
from ..signing import Verified, VerifyKey, check_job
from ..store.execution import Claim, ExecutionStore
from ..store.jobs import parse_spec
from ..store.keys import Keys
from .calling import CallLaunch
from .devices import visible_devices
from .launches import CommandLaunch, Launch
from .parts import PartLaunch
from .runner import Context, JobRunner

log = logging.getLogger("gpulayer.worker")

#: Ends the name of each job folder, so a restart removes those and nothing else in --workdir.
JOB_FOLDER_SUFFIX = ".gljob"


class JobIntake:
    """Runners for the jobs worker ``name`` (reached at ``address``) claims, with what ``offer``
    has: each in a folder of its own under ``workdir``, with ``base_env`` and its GPUs."""

    def __init__(
        self,
        store: ExecutionStore,
        keys: Keys,
        verifier: VerifyKey,
        context: Context,
        offer: Offer,
        *,
        name: str,
        address: str,
        workdir: Path,
        base_env: Mapping[str, str],
    ) -> None:
        self._store, self._keys, self._verifier, self._verified = store, keys, verifier, Verified()
        self._context, self._offer, self._name, self._address = context, offer, name, address
        self._workdir, self._base_env = workdir, base_env

    def runner(self, job: Claim) -> JobRunner | None:
        """The job's runner; None for a job that is not exactly what a submitter signed, or not
        claimed as what it signed asks, which fails, unrun."""
        try:
            spec = _read_spec(job.spec_json)
            files = check_job(self._verifier, job.target, job.spec_json or b"", job.seal, self._verified)
            if misplaced := job.misplaced(spec, self._keys.queue_for(spec.queue)):
                raise UntrustedPayload(misplaced)
        except (ValueError, UntrustedPayload) as exc:
            refused = isinstance(exc, UntrustedPayload)
            reason = f"refused: {exc}; it was not run" if refused else f"invalid job record: {exc}"
            if refused:
                self._store.append_logs(job, [("system", reason, None)])
            self._store.finish(job, JobState.FAILED, exit_code=None, reason=reason, outputs=None, seconds=0.0)
            log.error("job %s: %s", job.job_id, reason)
            return None
        folder = self._workdir / f"{job.job_id}-{job.attempt}{JOB_FOLDER_SUFFIX}"
        env = {**self._base_env, **visible_devices(self._offer.gpus, job.gpus)}
        if log.isEnabledFor(logging.INFO):  # a busy worker logs at WARNING: spare the join
            log.info("job %s: attempt %d started: %s", job.job_id, job.attempt, shlex.join(spec.command))
        return JobRunner(job, spec, files, self._launch(job, spec), self._context, folder, env)

    def _launch(self, job: Claim, spec: JobSpec) -> Launch:
        if job.part is not None:
            assert spec.distributed is not None, "only a gang job has parts"
            return PartLaunch(job.part, spec.distributed, self._name, self._address)
        return CallLaunch() if spec.function is not None else CommandLaunch()


def _read_spec(raw: bytes | None) -> JobSpec:
    """The stored spec, or ValueError with a one-line reason: a job written to Redis by anything
    other than a client can be missing, garbled or huge, and must fail, not crash the worker."""
    if raw is None:
        raise ValueError("it has no spec")
    if len(raw) > MAX_SPEC_BYTES:
        raise ValueError(f"its spec is {len(raw)} bytes, over the {MAX_SPEC_BYTES} allowed")
    try:
        return parse_spec(raw)  # parsed once for the many jobs of a loop or a map that share it
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None
