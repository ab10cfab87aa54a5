"""Every error GPUlayer raises on purpose derives from :class:`GpulayerError`, grouped by what the
caller does about it: fix the request, look for something else, wait for the job to change, try again
later, fix the settings, distrust what came back, or look at the job that failed.

Each class carries ``exit_code``, the status the CLI exits with, and ``http_status``, the status the
HTTP API answers with; a subclass that says nothing has its group's. The tree::

    class                    exit  HTTP
    GpulayerError               1   400  anything GPUlayer raises on purpose
    ├── InvalidRequest          1   400  fix the request: it cannot work as sent
    │   ├── InvalidJobSpec      2   400  a job description that fails validation
    │   ├── SourceError         1   400  the source folder is missing, unreadable or over the cap
    │   ├── InputNotFound       1   400  an input path does not exist, or two inputs share a name
    │   ├── ArtifactTooLarge    1   413  a job's files are over the per-job cap
    │   ├── ArchiveError        1   400  an unsafe archive entry (absolute, "..", a device), or no room
    │   └── TokenError          2   400  an API token name that is taken or invalid
    ├── NotFound                1   404  no such thing: check the id or name
    │   ├── JobNotFound         1   404  no job with that id (never existed, or past its retention)
    │   ├── WorkerNotFound      1   404  no connected worker with that name
    │   └── TokenNotFound       2   404  no API token of that name; also a TokenError, as it was
    ├── Conflict                1   409  not in the state for that: wait for the job, or change it
    │   ├── JobNotFinished      1   409  the job has not ended yet, so it has no outputs
    │   ├── OutputNotProduced   1   409  a declared output was not produced by the job
    │   └── Unschedulable       1   409  no connected worker could ever run the job
    ├── Unavailable             1   503  not now: the same call may work later
    │   ├── RedisUnavailable    1   503  the Redis server cannot be reached
    │   ├── NotReplicated       1   503  a submit the master took, but fewer replicas had it in time
    │   ├── SubmitFailed        1   503  background submits that did not reach Redis: no such jobs
    │   ├── OutputsUnavailable  1   503  the worker keeping a job's outputs is gone or does not answer
    │   └── WaitTimeout        75   503  a wait ended before the job did
    ├── ConfigError             1   500  no Redis URL known, a bad setting
    │   └── NoInstallation      1   500  no installation is configured, and none was started
    ├── ServerError             1   500  the embedded Redis or a local worker failed to start or stop
    ├── UntrustedPayload        1   502  a job, file or result whose signature does not check
    │   └── UnsafePickle        1   502  a signed result whose pickle calls what is not data
    └── JobFailed               1   400  a remote function's job ended without a value
        ├── RemoteError         1   400  it raised an exception that cannot be rebuilt here
        ├── WorkerLost          1   400  its worker was lost, and no retry was left
        ├── JobTimedOut         1   400  it ran past its timeout
        └── JobCancelled        1   400  it was cancelled

An exception a remote function raises is raised in the caller as itself when it can be rebuilt there
(with the remote traceback attached), else as :class:`RemoteError`. ``tests/test_errors.py`` holds
this drawing to the classes.
"""

from __future__ import annotations


class GpulayerError(Exception):
    """Base of every error GPUlayer raises on purpose."""

    exit_code = 1
    http_status = 400


class InvalidRequest(GpulayerError):
    """The request cannot work as sent: fix it and send it again."""


class InvalidJobSpec(InvalidRequest):
    """A job description failed validation."""

    # As click's usage errors: the command line itself is wrong.
    exit_code = 2

    def __init__(
        self, message: str, field: str | None = None, problem: dict[str, object] | None = None
    ) -> None:
        super().__init__(message)
        #: The option at fault, by its name in the model (``retry_delay``), where one field is, and
        #: pydantic's report of what is wrong with it (``type``, ``msg``, ``ctx``): what the CLI says
        #: in its flags' terms (``--retry-delay: at most 1h``).
        self.field = field
        self.problem = problem


class SourceError(InvalidRequest):
    """The source folder is missing, unreadable, or larger than the cap."""


class InputNotFound(InvalidRequest):
    """An input path does not exist, or two inputs have one name."""


class ArtifactTooLarge(InvalidRequest):
    """A job's files are larger than the per-job cap."""

    http_status = 413


class ArchiveError(InvalidRequest):
    """An archive holds an entry that would land outside its folder, or is not a regular file or folder;
    or the folder it is unpacked into cannot take its entries (not writable, not a folder)."""


class TokenError(InvalidRequest):
    """An API token cannot be made: its name is taken or invalid, or its lifetime out of bounds."""

    exit_code = 2


class NotFound(GpulayerError):
    """Nothing has that id or name."""

    http_status = 404


class JobNotFound(NotFound):
    """No job has that id, or it is past its retention."""


class WorkerNotFound(NotFound):
    """No connected worker has that name."""


class TokenNotFound(NotFound, TokenError):
    """No API token has that name. Also a :class:`TokenError` (what revoking one raised before), whose
    exit code it keeps."""


class Conflict(GpulayerError):
    """What was asked does not fit the state things are in: wait for the job, or change it."""

    http_status = 409


class JobNotFinished(Conflict):
    """The job has not ended, so there is nothing to download yet."""


class OutputNotProduced(Conflict):
    """A declared output was not produced by the job."""


class Unschedulable(Conflict):
    """No connected worker could ever run the job."""


class Unavailable(GpulayerError):
    """Not now: the same call may work later."""

    http_status = 503


class RedisUnavailable(Unavailable):
    """The Redis server cannot be reached."""


class NotReplicated(Unavailable):
    """A submit the master took, but fewer of its replicas than ``submit_replicas`` asks had it in
    time: the job exists, and could be lost if the master failed now."""


class SubmitFailed(Unavailable):
    """Submits a client sent in the background (``Client(background_submits=True)``) did not reach
    Redis: those jobs were not made. ``job_ids`` names them; the cause is chained."""

    def __init__(self, message: str, job_ids: list[str]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class OutputsUnavailable(Unavailable):
    """The worker that keeps a job's outputs (too large for Redis) is gone, or does not answer."""


class WaitTimeout(Unavailable):
    """A wait ended before the job did."""

    # EX_TEMPFAIL from sysexits.h: try again later; distinct from the job's own exit codes.
    exit_code = 75


class ConfigError(GpulayerError):
    """A setting is missing or invalid."""

    # The settings are the server's own: nothing the request could change.
    http_status = 500


class NoInstallation(ConfigError):
    """No installation is configured on this machine, and no private one was started."""


class ServerError(GpulayerError):
    """The embedded Redis server or a local worker failed to start or stop."""

    http_status = 500


class UntrustedPayload(GpulayerError):
    """A job, one of its files, or a function's result is not what this installation's keys signed
    for it, so it was neither run nor unpickled."""

    # What a worker stored and did not sign (or another did): the server hands it on to nobody.
    http_status = 502


class UnsafePickle(UntrustedPayload):
    """A function's result, signed by a worker, names a global that is not data (``os.system``, a
    function, a class outside the allow-list); it was refused before anything of it was called.
    ``allow_pickle=True`` unpickles it for workers trusted with code."""


class JobFailed(GpulayerError):
    """A remote function's job ended without a value; ``job_id`` says which."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class RemoteError(JobFailed):
    """A remote function raised an exception that cannot be rebuilt here (its class cannot be imported,
    or it could not be pickled). ``remote_type`` and ``remote_traceback`` describe it."""

    def __init__(self, message: str, job_id: str, remote_type: str, remote_traceback: str) -> None:
        super().__init__(message, job_id)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


class WorkerLost(JobFailed):
    """The job's worker stopped (crashed, lost its network) and the job had no retry left."""


class JobTimedOut(JobFailed):
    """The job ran past its timeout and was stopped."""


class JobCancelled(JobFailed):
    """The job was cancelled."""
