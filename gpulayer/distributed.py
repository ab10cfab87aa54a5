"""A gang job from Python: one command (or one function) run as ranks on several workers at once,
as ``gpulayer submit --nodes`` makes it (see docs/distributed.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .client import Client
from .functions import remote
from .job import Job
from .options import Launcher


class DistributedJob:
    """``gl.DistributedJob(["python", "train.py"], nodes=2, procs_per_node=2, source=".").submit()``

    ``target`` is a command, or a function every rank calls with ``args`` and ``kwargs`` (its value,
    rank 0's, is ``gl.FunctionHandle(job).result()``; ``@gl.remote(nodes=...)`` does the same).
    ``nodes`` distinct workers each run ``procs_per_node`` ranks (default: ``gpus_per_node`` for a
    GPU job, else 1); ``options`` are whatever :meth:`Client.submit` (or, for a function,
    ``gl.remote``) takes besides: requirements per node, ``source``, ``timeout``, ``retries``, ...
    """

    def __init__(
        self,
        target: str | Sequence[str] | Callable[..., Any],
        *,
        nodes: int = 1,
        procs_per_node: int | None = None,
        gpus_per_node: int | None = None,
        launcher: Launcher = "direct",
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.target = target
        self.nodes = nodes
        self.procs_per_node = procs_per_node
        self.launcher: Launcher = launcher
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = dict(options)
        if gpus_per_node is not None:
            self.options["gpus"] = gpus_per_node

    def __repr__(self) -> str:
        return f"DistributedJob({self.target!r}, nodes={self.nodes}, procs_per_node={self.procs_per_node})"

    def submit(self, client: Client | None = None) -> Job:
        """Queue it (on ``client``, or a :class:`Client` with the default connection); returns its job."""
        gang: dict[str, Any] = {
            "nodes": self.nodes,
            "procs_per_node": self.procs_per_node,
            "launcher": self.launcher,
        }
        if callable(self.target):
            decorate = remote(client=client, **gang, **self.options)
            job: Job = decorate(self.target).remote(*self.args, **self.kwargs).job
            return job
        return (client or Client()).submit(self.target, **gang, **self.options)
