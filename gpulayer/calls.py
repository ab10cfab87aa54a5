"""The client's side of remote functions: ship the code bundle, submit calls in batches, wait for
many jobs at once, and turn each ending back into a value or an exception."""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import pickle
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from redis.client import Pipeline

from .archive import SPOOL_BYTES, source_manifest
from .bundles import Bundle, BundleCache, archive_digest, project_root
from .errors import (
    ArtifactTooLarge,
    InvalidJobSpec,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobTimedOut,
    RemoteError,
    SourceError,
    WorkerLost,
)
from .models import (
    WORKER_LOST,
    Distributed,
    FunctionSpec,
    JobRecord,
    JobSpec,
    JobState,
    build_spec,
    validated,
)
from .options import CallOptions
from .payloads import CALL, ERROR, RESULT, dumps, load_result, pickle_function
from .requirements import Requirements
from .settings import Settings
from .signing import Keyring
from .store.artifacts import RedisArtifactStore, small_files
from .store.jobs import JobStore, submitted, under_new_ids
from .store.registry import IdentityRegistry
from .submits import environment, needs_of_profile
from .units import format_size
from .unpickling import OwnCode, Policy, Refused, loads_data

#: Calls submitted per round trip.
BATCH = 256
#: Unfinished calls a map keeps at most, unless told otherwise.
MAX_IN_FLIGHT = 10_000
#: A map that hears of no ended job for this long (s) reads its jobs' states, should a notice be lost.
_RECHECK = 5.0
#: A client re-touches a bundle it shipped (to keep it from expiring) after this long (s).
_TOUCH = 3600.0

Call = tuple[tuple[Any, ...], dict[str, Any]]
#: What a call's job stored when it ended: its record, its result or error payload by name, and the
#: registry's record of the worker identity that claimed its attempt (what the payload is checked with).
Ending = tuple[JobRecord, dict[str, bytes], bytes | None]


class Calls:
    def __init__(
        self,
        settings: Settings,
        jobs: JobStore,
        artifacts: RedisArtifactStore,
        registry: IdentityRegistry,
        keyring: Keyring,
        allow_pickle: bool = False,
    ) -> None:
        self._settings = settings
        self._jobs = jobs
        self._artifacts = artifacts
        self._registry = registry
        self._keyring = keyring
        self._bundles = BundleCache(settings.max_source_bytes, settings.home)
        #: When each bundle was last shipped (or found in Redis), and the name it is stored under.
        self._shipped: dict[str, tuple[float, str]] = {}
        #: The folder each bundle was made from: the code pickled by value names its files from there.
        self._roots: dict[str, Path] = {}
        own = OwnCode(self._own_files)
        #: How results are unpickled, by whether pickle is allowed; each keeps what it resolved.
        self._policies = {False: Policy(own), True: Policy(own, allow_pickle=True)}
        self._allow_pickle = allow_pickle

    def submit(self, function: Callable[..., Any], calls: Iterable[Call], options: CallOptions) -> list[str]:
        """Submit one job per call, :data:`BATCH` of them per round trip; returns their ids."""
        self._keyring.signer()  # no key: said before the bundle is shipped
        spec = self.spec(function, options)
        ids: list[str] = []
        pending = iter(calls)
        while batch := list(itertools.islice(pending, BATCH)):
            ids.extend(self._submit_batch(spec, function, batch, ""))
        return ids

    def map(
        self,
        function: Callable[..., Any],
        calls: Iterable[Call],
        options: CallOptions,
        ordered: bool,
        max_in_flight: int | None,
        return_exceptions: bool = False,
    ) -> Iterator[Any]:
        """Submit the first calls now, and return an iterator that submits the rest as earlier ones end
        and yields each value (or raises each exception, or yields it with ``return_exceptions``) in
        order, or as they end."""
        if max_in_flight is not None and max_in_flight < 1:
            raise InvalidJobSpec("max_in_flight must be at least 1")
        run = _MapRun(
            self,
            self.spec(function, options),
            function,
            iter(calls),
            max_in_flight or MAX_IN_FLIGHT,
            options.allow_pickle,
            return_exceptions,
        )
        run.fill()
        return run.results(ordered)

    def spec(self, function: Callable[..., Any], options: CallOptions) -> JobSpec:
        """The job every call of ``function`` makes, its code bundle shipped if Redis lacks it."""
        root = options.source or project_root()
        digest = self._ship(self._bundles.get(root))
        self._roots[digest] = root
        name = f"{getattr(function, '__module__', None) or '?'}.{getattr(function, '__qualname__', '?')}"
        profiles = self._settings.profiles
        given = options.requirements
        if options.profile is not None:
            given = needs_of_profile(options.profile, profiles, given)
        needs = validated(Requirements, given)
        return build_spec(
            command=[name],
            function=FunctionSpec(name=name, bundle=digest, fresh_process=options.fresh_process),
            requirements=needs,
            distributed=Distributed.of(needs, options),
            environment=environment(options, root, profiles),
            **options.kept(),
        )

    def _own_files(self) -> frozenset[Path]:
        """The files of the caller's own code: what the folders this client shipped hold, and the one
        a call ships by default (the running script's). A link is not its target's: it may point
        anywhere, the standard library included."""
        files: set[Path] = set()
        for root in {*self._roots.values(), project_root()}:
            try:
                members = source_manifest(
                    root, self._settings.max_source_bytes, self._settings.home
                ).members.values()
            except SourceError:
                continue
            files.update(path.resolve() for path in members if path.suffix == ".py" and not path.is_symlink())
        return frozenset(files)

    def _ship(self, bundle: Bundle) -> str:
        """Upload the bundle unless Redis has it whole (asking also keeps it from expiring); the name
        it is stored under, which workers check what they unpack against. That is the name of what
        the archive holds: a file that changed while it was packed changes it."""
        shipped_at, shipped = self._shipped.get(bundle.digest, (-_TOUCH, bundle.digest))
        if time.monotonic() - shipped_at < _TOUCH:
            return shipped
        if not self._artifacts.has_bundle(bundle.digest):
            with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as file:
                bundle.manifest.write(file)
                file.seek(0)
                shipped = archive_digest(file, self._settings.max_source_bytes)
                file.seek(0)
                self._artifacts.put_bundle(shipped, file)
        self._shipped[bundle.digest] = (time.monotonic(), shipped)
        return shipped

    def _submit_batch(
        self, spec: JobSpec, function: Callable[..., Any], calls: list[Call], batch: str
    ) -> list[str]:
        """Submit ``calls`` in one round trip: each call's signed pickle staged and its job created."""
        root = self._roots.get(spec.function.bundle) if spec.function else None
        try:
            pickled = pickle_function(function, root)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise InvalidJobSpec(f"cannot send {_name(function)}: {exc}") from None
        payloads = [self._pack_call(function, pickled, args, kwargs) for args, kwargs in calls]
        return under_new_ids(len(payloads), functools.partial(self._submit_once, spec, payloads, batch=batch))

    def _submit_once(
        self, spec: JobSpec, payloads: list[bytes], ids: dict[int, str], batch: str
    ) -> dict[int, str | None]:
        """Stage each call and submit its job under ``ids`` in one round trip; returns the id each
        got, None where it was taken (what was staged for it goes)."""
        upload = secrets.token_hex(4)
        positions: dict[int, int] = {}
        files = {index: {CALL: hashlib.sha256(payloads[index]).hexdigest()} for index in ids}
        seals = dict(zip(ids, self._jobs.seals([(ids[i], spec, files[i]) for i in ids]), strict=True))

        def build(pipe: Pipeline) -> None:
            for index, job_id in ids.items():
                self._artifacts.put_inputs(job_id, upload, CALL, io.BytesIO(payloads[index]), pipe=pipe)
                positions[index] = len(pipe)
                self._jobs.queue_submit(pipe, job_id, spec, upload, files[index], batch, seals[index])

        replies = self._jobs.pipeline(build)
        made = {index: submitted(replies[positions[index]]) for index in ids}
        for index, job_id in made.items():
            if job_id is None:
                self._artifacts.discard_inputs(ids[index], upload)
        return made

    def _pack_call(
        self, function: Callable[..., Any], pickled: bytes, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> bytes:
        try:
            payload = dumps((pickled, args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise InvalidJobSpec(f"cannot send a call of {_name(function)}: {exc}") from None
        if len(payload) > self._settings.max_job_bytes:
            raise ArtifactTooLarge(
                f"a call of {_name(function)} pickles to {format_size(len(payload))}, above the "
                f"{format_size(self._settings.max_job_bytes)} per-job cap (GPULAYER_MAX_JOB_BYTES)"
            )
        return payload

    def endings(self, job_ids: list[str]) -> list[Ending]:
        """The records and result payloads of ended jobs: one round trip for any number."""

        def build(pipe: Pipeline) -> None:
            for job_id in job_ids:
                self._jobs.queue_get(pipe, job_id)
                self._artifacts.queue_outputs(pipe, job_id)
            self._registry.queue_records(pipe)

        *replies, signers = self._jobs.pipeline(build)
        endings = []
        for index, job_id in enumerate(job_ids):
            record = self._jobs.record_of(job_id, replies[2 * index])
            if record is None:
                raise JobNotFound(f"no job {job_id!r} (never submitted, or past its retention)")
            signer = signers.get(record.identity.encode()) if record.identity else None
            endings.append((record, _payloads(replies[2 * index + 1]), signer))
        return endings

    def ending(self, record: JobRecord) -> Ending:
        """The result payloads of the ended job whose record a wait read, and the record of the
        identity that signed them: one round trip, the job's record not read again."""

        def build(pipe: Pipeline) -> None:
            self._artifacts.queue_outputs(pipe, record.id)
            self._registry.queue_record(pipe, record.identity or "")

        outputs, signer = self._jobs.pipeline(build)
        return record, _payloads(outputs), signer

    def value(self, ending: Ending, allow_pickle: bool | None = None) -> Any:
        """What the call returned; or the exception it raised, raised here; or :class:`JobFailed`.
        Unpickled as data only unless ``allow_pickle`` (None: as the client was told)."""
        record, stored, _ = ending
        policy = self._policies[self._allow_pickle if allow_pickle is None else allow_pickle]
        if record.state is JobState.SUCCEEDED and RESULT in stored:
            return self._load(ending, RESULT, policy)
        raise self._error(ending, policy)

    def _load(self, ending: Ending, name: str, policy: Policy) -> Any:
        """The payload ``name``, checked with the key of the worker that claimed the attempt, then
        unpickled under ``policy``."""
        record, stored, signer = ending
        key = self._registry.worker_key(record.identity, signer)
        return load_result(key, record.id, record.attempt, name, stored[name], policy)

    def _error(self, ending: Ending, policy: Policy) -> BaseException:
        record, stored, _ = ending
        job, name = record.id, record.command[0]
        if record.state is JobState.CANCELLED:
            return JobCancelled(f"job {job} ({name}) was cancelled", job)
        if record.state is JobState.TIMED_OUT:
            return JobTimedOut(f"job {job} ({name}) {record.reason}", job)
        if ERROR in stored:
            return _raised(record, self._load(ending, ERROR, policy), policy)
        if record.reason_code == WORKER_LOST:  # a gang's reason says more: "worker lost: ..."
            lost = sum(attempt.outcome == "lost" for attempt in record.attempts)
            return WorkerLost(
                f"job {job} ({name}): its worker was lost ({lost} time(s)); no retry was left", job
            )
        return JobFailed(f"job {job} ({name}) {record.state.value}: {record.reason}", job)


class _MapRun:
    """One ``map``: its calls' jobs share a batch token, so each one's end is pushed on one list."""

    def __init__(
        self,
        calls: Calls,
        spec: JobSpec,
        function: Callable[..., Any],
        pending: Iterator[Call],
        window: int,
        allow_pickle: bool | None,
        return_exceptions: bool,
    ) -> None:
        self._calls = calls
        self._allow_pickle = allow_pickle
        self._return_exceptions = return_exceptions
        self._spec = spec
        self._function = function
        self._pending = pending
        self._window = window
        self._token = secrets.token_hex(8)
        #: Unfinished jobs, by id: the index of their call.
        self._waiting: dict[str, int] = {}
        self._submitted = 0

    def fill(self) -> None:
        """Submit calls until ``window`` are unfinished or none are left."""
        while room := self._window - len(self._waiting):
            batch = list(itertools.islice(self._pending, min(room, BATCH)))
            if not batch:
                return
            for job_id in self._calls._submit_batch(self._spec, self._function, batch, self._token):
                self._waiting[job_id] = self._submitted
                self._submitted += 1

    def results(self, ordered: bool) -> Iterator[Any]:
        ended: dict[int, Ending] = {}
        next_index = 0
        quiet_since = time.monotonic()
        try:
            while True:
                if ordered:
                    while next_index in ended:
                        yield self._value(ended.pop(next_index))
                        next_index += 1
                else:
                    for index in list(ended):
                        yield self._value(ended.pop(index))
                self.fill()
                if not self._waiting:
                    return
                ids = [
                    job_id for job_id in self._calls._jobs.ended(self._token, 1.0) if job_id in self._waiting
                ]
                if not ids and time.monotonic() - quiet_since > _RECHECK:
                    ids = self._ended_unnoticed()
                if ids:
                    quiet_since = time.monotonic()
                for ending in self._calls.endings(ids):
                    ended[self._waiting.pop(ending[0].id)] = ending
        finally:
            # Left early (a break, an exception, Ctrl+C): the calls not yet finished are not wanted.
            if self._waiting:
                self._calls._jobs.cancel_many(list(self._waiting))

    def _value(self, ending: Ending) -> Any:
        """The call's value; its exception too, in its place, when the map returns exceptions."""
        try:
            return self._calls.value(ending, self._allow_pickle)
        except Exception as exc:
            if not self._return_exceptions:
                raise
            return exc

    def _ended_unnoticed(self) -> list[str]:
        """Jobs that ended without their notice reaching the list (Redis lost it in a restart)."""
        waiting = list(self._waiting)
        records = self._calls._jobs.get_many(waiting)
        return [
            job_id
            for job_id, record in zip(waiting, records, strict=True)
            if not record or record.state.is_terminal
        ]


class RemoteTraceback(Exception):
    """Where a remote function raised, on Python versions without exception notes."""


def _raised(record: JobRecord, report: dict[str, Any], policy: Policy) -> BaseException:
    """The exception a call raised, rebuilt with its remote traceback, or a :class:`RemoteError`
    (its class cannot be found here, or is not data): a remote failure is never hidden."""
    where = f"job {record.id} on worker {record.worker}"
    text = report["traceback"]
    exc = None
    why = ""
    if report["exception"] is not None:
        try:
            exc = loads_data(report["exception"], policy)  # inside the verified payload
        except Refused as refused:
            why = f" (not rebuilt here: its pickle calls {refused})"
        except Exception:  # its class cannot be imported here: described instead
            exc = None
    if isinstance(exc, Exception):
        if hasattr(exc, "add_note"):
            exc.add_note(f"\nRemote traceback ({where}):\n{text.rstrip()}")
        else:
            exc.__cause__ = RemoteTraceback(f"{where}\n{text}")
        return exc
    message = f"{report['type']}: {report['message']}{why}\n\nRemote traceback ({where}):\n{text.rstrip()}"
    return RemoteError(message, record.id, report["type"], text)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))


def _payloads(outputs: dict[bytes, bytes]) -> dict[str, bytes]:
    """What a function job left of its result or exception, among its outputs as read."""
    return small_files(outputs, (RESULT, ERROR))
