"""``Job``: a handle on one job of an installation, for what a user asks of it: its record, a wait,
its logs, why it waits, a cancel, its outputs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from redis.exceptions import RedisError

from . import archive, placement, presigned
from .errors import (
    GpulayerError,
    JobNotFinished,
    JobNotFound,
    OutputNotProduced,
)
from .home import private_folder
from .inventory import WorkerInfo
from .models import (
    JobRecord,
    JobSpec,
    JobState,
    LogLine,
)
from .placement import Plan
from .provisioned import GANG, Decision
from .pulls import Progress, Pull
from .store.artifacts import (
    OUTPUTS_ARCHIVE,
    MissingArtifact,
)
from .unpacking import extract

if TYPE_CHECKING:
    from .client import Client

PathLike = str | os.PathLike[str]
#: Where, in a client's home, outputs a worker keeps are pulled to (and resumed from).
DOWNLOADS = "downloads"
#: How long a wait looks for a worker while none is connected before it says that no worker could run
#: the job (s): a worker started beside it (`gpulayer up`'s, a test's) registers well within this.
WORKER_JOIN_GRACE = 10.0
#: How often :meth:`Job.unrunnable` looks for a worker while none is connected (s).
_JOIN_POLL = 0.5


class Job:
    """A handle on one job. Cheap to make; every method asks Redis afresh."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobRecord:
        self.client.flush()
        record = self.client.stores.jobs.get(self.id)
        if record is None:
            raise JobNotFound(f"no job {self.id!r} (never submitted, or past its retention)")
        return record

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Block until the job ends and return its record; :class:`WaitTimeout` after ``timeout`` seconds."""
        return self.client._wait(self.id, timeout)

    def logs(self, follow: bool = False, rank: int | None = None) -> Iterator[LogLine]:
        """Its log lines so far; with ``follow``, then each new line as it comes, until the job ends.
        ``rank``: of a gang job, only the lines that rank printed."""
        self.status()
        lines = self.client.stores.logs.lines(self.id, follow=follow)
        return lines if rank is None else (line for line in lines if line.rank == rank)

    def log_page(self, after: str = "0-0", limit: int = 1000) -> list[tuple[str, LogLine]]:
        """Up to ``limit`` stored lines after the line with id ``after`` (``0-0``: from the first),
        each with its id: the cursor of the next page."""
        self.status()
        return self.client.stores.logs.page(self.id, after, limit)

    def log_tail(self, count: int = 50) -> list[tuple[str, LogLine]]:
        """The last ``count`` stored lines, oldest first, each with its id."""
        self.status()
        return self.client.stores.logs.tail(self.id, count)

    def why(self) -> Plan:
        """For a queued job: where it would start now, or why each worker cannot run it; and what the
        autoscaler decided for it, where one runs."""
        spec = self.status().spec
        plan = self._plan(spec, self.client.workers())
        decision = self._capacity(spec)
        return plan.model_copy(update={"capacity": decision.text}) if decision else plan

    def capacity(self) -> Decision | None:
        """What the autoscaler last decided for this queued job, if one runs and it needs a machine."""
        return self._capacity(self.status().spec)

    def _capacity(self, spec: JobSpec) -> Decision | None:
        gang = spec.distributed is not None and spec.distributed.nodes > 1
        return self.client.stores.capacity.decision(
            f"{GANG}{self.id}" if gang else self.client.keys.queue_for(spec.queue)
        )

    def _plan(self, spec: JobSpec, workers: list[WorkerInfo]) -> Plan:
        return placement.plan(spec.requirements, workers, spec.distributed.nodes if spec.distributed else 1)

    def unrunnable(self, grace: float = 0.0) -> Plan | None:
        """The plan of a queued job no connected worker could ever run (its reasons say why, worker
        by worker); None if it is not queued, or some connected worker could run it (busy or not).
        While no worker is connected at all, it looks again for up to ``grace`` seconds: a worker
        started beside the job may not have registered yet. One that joins later is not waited for."""
        deadline = time.monotonic() + grace
        while True:
            record = self.status()
            if record.state is not JobState.QUEUED:
                return None
            workers = self.client.workers()
            plan = self._plan(record.spec, workers)
            if plan.schedulable:
                return None
            if workers or time.monotonic() >= deadline:
                return plan
            time.sleep(_JOIN_POLL)

    @contextlib.contextmanager
    def saying_why_queued(self, after: float, say: Callable[[str], None]) -> Iterator[None]:
        """While the block runs (a wait): if the job is still queued ``after`` seconds in, ``say`` a line
        saying so and each line of :meth:`why`, once. A caller that waits would otherwise see nothing
        of a job no connected worker can start yet."""

        def hint() -> None:
            try:
                if self.status().state is JobState.QUEUED:
                    for line in [f"job {self.id} is still queued:", *self.why().lines()]:
                        say(line)
            except (GpulayerError, RedisError):
                pass  # a hint only: the wait itself reports what went wrong

        timer = threading.Timer(after, hint)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def cancel(self) -> bool:
        """Cancel the job: a queued job ends at once; a running one is stopped by its worker within about
        a second. Returns False, changing nothing, if the job had already ended."""
        self.client.flush()
        outcome = self.client.stores.jobs.cancel(self.id)
        if outcome == "missing":
            raise JobNotFound(f"no job {self.id!r} (never submitted, or past its retention)")
        return outcome in ("cancelled", "requested")

    def serves_inputs(self) -> bool:
        """Whether this client serves the job's inputs (too large for Redis) to its worker."""
        return self.id in self.client._serving

    def serve_inputs(self, timeout: float | None = None) -> None:
        """Keep serving the job's inputs too large for Redis (over ``redis_outputs_max_bytes``), which
        this client submitted and serves, until the job no longer waits for them (a worker pulled
        them and runs it, or it ended), or ``timeout`` seconds; at once if it serves none. A client
        that stops before then leaves the job to fail, saying its submitter is gone."""
        server = self.client._serving.get(self.id)
        if server is not None:
            server.join(timeout)

    def outputs_archive(self, dest: IO[bytes], progress: Progress | None = None) -> None:
        """Write the job's outputs, as the gzip-compressed tar archive its worker stored, to ``dest``,
        and check that the worker that ran the attempt which made it signed it: :class:`UntrustedPayload`
        if not (what ``dest`` got must then be thrown away); :class:`OutputNotProduced` if it stored
        none (or they expired); :class:`OutputsUnavailable` if they are kept on a worker that is gone.
        ``progress``: called with the bytes so far and in all as outputs a worker keeps come."""
        with self._outputs(self.status(), f"job {self.id} has no stored outputs", progress) as archive:
            shutil.copyfileobj(archive, dest)

    @contextlib.contextmanager
    def _outputs(self, record: JobRecord, missing: str, progress: Progress | None) -> Iterator[IO[bytes]]:
        """The job's outputs archive, checked, open at its start: read from Redis, or pulled from the
        worker that keeps it into the client's downloads folder (resumed there, removed once read),
        or read from the object store through the URL its submitter made."""
        stores = self.client.stores
        held = stores.artifacts.held_outputs(self.id, OUTPUTS_ARCHIVE)
        if held is None:
            with tempfile.SpooledTemporaryFile(archive.SPOOL_BYTES) as file:
                try:
                    sha256, seal = stores.artifacts.get_outputs(self.id, OUTPUTS_ARCHIVE, file)
                except MissingArtifact:
                    raise OutputNotProduced(missing) from None
                stores.registry.check_archive(record, OUTPUTS_ARCHIVE, sha256, seal)
                file.seek(0)
                yield file
            return
        sender = stores.registry.check_archive(record, OUTPUTS_ARCHIVE, held.sha256, held.seal)
        downloads = private_folder(self.client.settings.home / DOWNLOADS)
        named = hashlib.sha256(self.id.encode()).hexdigest()[:16]
        partial = downloads / f"{named}-{held.sha256[:16]}.part"
        if held.url is not None:  # in the object store, read whole (no resume)
            presigned.fetch(held.url, partial, held.size, held.sha256)
        else:
            Pull(stores.transfers, sender, self.id, OUTPUTS_ARCHIVE, held, partial, progress).run()
        with open(partial, "rb") as file:
            yield file
        partial.unlink(missing_ok=True)

    def download_outputs(self, dest: PathLike, progress: Progress | None = None) -> list[Path]:
        """Unpack the job's outputs into ``dest`` (made if missing), each at its path in the job's
        folder (``results/a.csv`` lands in ``dest/results/a.csv``); returns the files written. Only
        an archive signed by the worker that ran the job is unpacked (else :class:`UntrustedPayload`,
        nothing written), and of it only what the job declared as outputs, inside ``dest``. Raises
        :class:`ArchiveError`, having written nothing, if ``dest`` or a folder in it cannot take them,
        and :class:`OutputNotProduced` (after writing the rest) if a declared output was not produced.
        Outputs too large for Redis come from the worker that keeps them (``progress`` is told how far
        along), resuming a pull that stopped; :class:`OutputsUnavailable` if that worker is gone."""
        record = self.status()
        if not record.state.is_terminal:
            raise JobNotFinished(f"job {self.id} is {record.state.value}; outputs are uploaded when it ends")
        if not record.spec.outputs:
            return []
        if record.outputs is None:
            reason = f": {record.reason}" if record.reason else ""
            raise OutputNotProduced(
                f"job {self.id} stored no outputs (it ended {record.state.value}{reason})"
            )
        # Made by the unpacking, once it found room for every file: an unwritable folder is one
        # line, and nothing is half written.
        with self._outputs(record, f"the outputs of job {self.id} have expired", progress) as file:
            written = extract(
                file,
                Path(dest),
                max_bytes=max(self.client.settings.max_job_bytes, record.outputs.bytes),
                replace=True,
                keep=archive.declared(record.spec.outputs),
            )
        if record.outputs.missing:
            raise OutputNotProduced("output not produced: " + ", ".join(record.outputs.missing))
        return written
