"""Every error GPUlayer raises on purpose derives from :class:`GpulayerError`.

The tree::

    GpulayerError
    ├── ConfigError            no Redis URL known, a bad setting
    ├── RedisUnavailable       the Redis server cannot be reached
    ├── NotReplicated          a submit Redis's master took, but fewer replicas than asked had in time
    ├── ServerError            the embedded Redis or a local worker failed to start or stop
    ├── InvalidJobSpec         a job description that fails validation
    ├── SourceError            the source folder is missing, unreadable or over the cap
    ├── InputNotFound          an input path does not exist
    ├── ArtifactTooLarge       a job's files are over the per-job cap
    ├── ArchiveError           an unsafe archive entry (absolute path, "..", device), or no room for one
    ├── JobNotFound            no job with that id (never existed, or past its retention)
    ├── WorkerNotFound         no connected worker with that name
    ├── TokenError             an API token name that is taken or invalid, or no token of that name
    ├── JobNotFinished         the job has not ended yet, so it has no outputs
    ├── OutputNotProduced      a declared output was not produced by the job
    ├── Unschedulable          no connected worker could ever run the job
    ├── WaitTimeout            a wait ended before the job did
    ├── UntrustedPayload       a job, file or result whose signature does not check (never run or unpickled)
    │   └── UnsafePickle       a signed result whose pickle calls something that is not data (not called)
    └── JobFailed              a remote function's job ended without a value
        ├── RemoteError        it raised an exception that cannot be rebuilt here
        ├── WorkerLost         its worker was lost, and no retry was left
        ├── JobTimedOut        it ran past its timeout
        └── JobCancelled       it was cancelled

An exception a remote function raises is raised in the caller as itself when it can be rebuilt there
(with the remote traceback attached), else as :class:`RemoteError`.

Each carries ``exit_code``, the status the CLI exits with.
"""

from __future__ import annotations


class GpulayerError(Exception):
    """Base of every error GPUlayer raises on purpose."""

    exit_code = 1


class ConfigError(GpulayerError):
    """A setting is missing or invalid."""


class RedisUnavailable(GpulayerError):
    """The Redis server cannot be reached."""


class NotReplicated(GpulayerError):
    """A submit the master took, but fewer of its replicas than ``submit_replicas`` asks had it in
    time: the job exists, and could be lost if the master failed now."""


class ServerError(GpulayerError):
    """The embedded Redis server or a local worker failed to start or stop."""


class InvalidJobSpec(GpulayerError):
    """A job description failed validation."""

    exit_code = 2


class SourceError(GpulayerError):
    """The source folder is missing, unreadable, or larger than the cap."""


class InputNotFound(GpulayerError):
    """An input path does not exist."""


class ArtifactTooLarge(GpulayerError):
    """A job's files are larger than the per-job cap."""


class ArchiveError(GpulayerError):
    """An archive holds an entry that would land outside its folder, or is not a regular file or folder;
    or the folder it is unpacked into cannot take its entries (not writable, not a folder)."""


class JobNotFound(GpulayerError):
    """No job has that id, or it is past its retention."""


class WorkerNotFound(GpulayerError):
    """No connected worker has that name."""


class TokenError(GpulayerError):
    """An API token cannot be made (its name is taken or invalid) or found."""

    exit_code = 2


class JobNotFinished(GpulayerError):
    """The job has not ended, so there is nothing to download yet."""


class OutputNotProduced(GpulayerError):
    """A declared output was not produced by the job."""


class Unschedulable(GpulayerError):
    """No connected worker could ever run the job."""


class SubmitFailed(GpulayerError):
    """Submits a client sent in the background (``Client(background_submits=True)``) did not reach
    Redis: those jobs were not made. ``job_ids`` names them; the cause is chained."""

    def __init__(self, message: str, job_ids: list[str]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class WaitTimeout(GpulayerError):
    """A wait ended before the job did."""

    # EX_TEMPFAIL from sysexits.h: try again later; distinct from the job's own exit codes.
    exit_code = 75


class UntrustedPayload(GpulayerError):
    """A job, one of its files, or a function's result is not what this installation's keys signed
    for it, so it was neither run nor unpickled."""


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
