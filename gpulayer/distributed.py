"""A gang job from Python: one command run as ranks on several workers at once, as
``gpulayer submit --nodes`` makes it (see docs/distributed.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .client import Client, Job
from .models import Launcher


class DistributedJob:
    """``gl.DistributedJob(["python", "train.py"], nodes=2, procs_per_node=2, source=".").submit()``

    ``nodes`` distinct workers each run ``procs_per_node`` ranks (default: ``gpus_per_node`` for a
    GPU job, else 1); ``options`` are whatever :meth:`Client.submit` takes besides (requirements per
    node, ``source``, ``outputs``, ``timeout``, ``retries``, ...).
    """

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        nodes: int = 1,
        procs_per_node: int | None = None,
        gpus_per_node: int | None = None,
        launcher: Launcher = "direct",
        **options: Any,
    ) -> None:
        self.command = command
        self.nodes = nodes
        self.procs_per_node = procs_per_node
        self.launcher: Launcher = launcher
        self.options = dict(options)
        if gpus_per_node is not None:
            self.options["gpus"] = gpus_per_node

    def __repr__(self) -> str:
        return f"DistributedJob({self.command!r}, nodes={self.nodes}, procs_per_node={self.procs_per_node})"

    def submit(self, client: Client | None = None) -> Job:
        """Queue it (on ``client``, or a :class:`Client` with the default connection); returns its handle."""
        return (client or Client()).submit(
            self.command,
            nodes=self.nodes,
            procs_per_node=self.procs_per_node,
            launcher=self.launcher,
            **self.options,
        )
