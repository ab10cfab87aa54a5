"""GPUlayer: run commands on whichever machine has the GPU or CPU they need, through Redis and RQ.

import gpulayer as gl

job = gl.Client().submit(["python", "train.py"], source=".", outputs=["model.pt"])
job.wait()
job.download_outputs("results")
"""

from importlib.metadata import PackageNotFoundError, version

from .client import Client, Job
from .errors import (
    ArchiveError,
    ArtifactTooLarge,
    ConfigError,
    GpulayerError,
    InputNotFound,
    InvalidJobSpec,
    JobNotFinished,
    JobNotFound,
    OutputNotProduced,
    RedisUnavailable,
    ServerError,
    SourceError,
    Unschedulable,
    WaitTimeout,
    WorkerNotFound,
)
from .inventory import GPU, Resources, WorkerInfo
from .models import Attempt, JobRecord, JobSpec, JobState, LogLine, OutputSummary
from .placement import Plan, Reason
from .requirements import Requirements
from .settings import Settings

try:
    __version__ = version("gpulayer")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "GPU",
    "ArchiveError",
    "ArtifactTooLarge",
    "Attempt",
    "Client",
    "ConfigError",
    "GpulayerError",
    "InputNotFound",
    "InvalidJobSpec",
    "Job",
    "JobNotFinished",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "JobState",
    "LogLine",
    "OutputNotProduced",
    "OutputSummary",
    "Plan",
    "Reason",
    "RedisUnavailable",
    "Requirements",
    "Resources",
    "ServerError",
    "Settings",
    "SourceError",
    "Unschedulable",
    "WaitTimeout",
    "WorkerInfo",
    "WorkerNotFound",
    "__version__",
]
