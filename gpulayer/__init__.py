"""GPUlayer: run commands and Python functions on whichever machine has the GPU or CPU they need,
through Redis and RQ.

import gpulayer as gl

@gl.remote(gpus=1)
def train(lr: float) -> float: ...

train.remote(0.01).result()                 # runs on a worker with a free GPU
list(train.map([0.1, 0.01, 0.001]))         # one job per item

job = gl.Client().submit(["python", "train.py"], source=".", outputs=["model.pt"])
job.wait()
job.download_outputs("results")

gl.DistributedJob(["python", "ddp.py"], nodes=2, gpus_per_node=4).submit()  # 8 ranks on 2 machines

gl.torch.Trainer(max_epochs=10, devices=2).fit(model)  # a PyTorch Trainer (pip install 'gpulayer[torch]')
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING

from .client import Client
from .distributed import DistributedJob
from .errors import (
    ArchiveError,
    ArtifactTooLarge,
    ConfigError,
    Conflict,
    GpulayerError,
    InputNotFound,
    InvalidJobSpec,
    InvalidRequest,
    JobCancelled,
    JobFailed,
    JobNotFinished,
    JobNotFound,
    JobTimedOut,
    NoInstallation,
    NotFound,
    NotReplicated,
    OutputNotProduced,
    OutputsUnavailable,
    RedisUnavailable,
    RemoteError,
    ServerError,
    SourceError,
    SubmitFailed,
    TokenError,
    TokenNotFound,
    Unavailable,
    UnsafePickle,
    Unschedulable,
    UntrustedPayload,
    WaitTimeout,
    WorkerLost,
    WorkerNotFound,
)
from .functions import FunctionHandle, RemoteFunction, connect, remote
from .inventory import GPU, Resources, WorkerInfo
from .job import Job
from .models import (
    Attempt,
    Distributed,
    GangPart,
    JobRecord,
    JobSpec,
    JobState,
    JobUsage,
    LogLine,
    OutputSummary,
)
from .options import CallOptions, SubmitOptions
from .placement import Plan, Reason
from .requirements import Requirements
from .settings import Settings

if TYPE_CHECKING:  # type checkers see gl.torch's types; at run time it is imported on first use
    from . import torch as torch


def __getattr__(name: str) -> ModuleType:
    """``gl.torch``, imported on first use: ``import gpulayer`` stays quick and needs no PyTorch."""
    if name == "torch":
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    __version__ = version("gpulayer")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "GPU",
    "ArchiveError",
    "ArtifactTooLarge",
    "Attempt",
    "CallOptions",
    "Client",
    "ConfigError",
    "Conflict",
    "Distributed",
    "DistributedJob",
    "FunctionHandle",
    "GangPart",
    "GpulayerError",
    "InputNotFound",
    "InvalidJobSpec",
    "InvalidRequest",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFinished",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "JobState",
    "JobTimedOut",
    "JobUsage",
    "LogLine",
    "NoInstallation",
    "NotFound",
    "NotReplicated",
    "OutputNotProduced",
    "OutputSummary",
    "OutputsUnavailable",
    "Plan",
    "Reason",
    "RedisUnavailable",
    "RemoteError",
    "RemoteFunction",
    "Requirements",
    "Resources",
    "ServerError",
    "Settings",
    "SourceError",
    "SubmitFailed",
    "SubmitOptions",
    "TokenError",
    "TokenNotFound",
    "Unavailable",
    "UnsafePickle",
    "Unschedulable",
    "UntrustedPayload",
    "WaitTimeout",
    "WorkerInfo",
    "WorkerLost",
    "WorkerNotFound",
    "__version__",
    "connect",
    "remote",
]
