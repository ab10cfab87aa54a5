"""One node's part of a gang job on this worker: start its ranks together, follow them, and stop them
all when one fails. Everything else — files, start, logs, leases, the end — is the job lifecycle's.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from redis import Redis
from redis.sentinel import SentinelConnectionPool

from ..models import Distributed, JobState
from ..network import address_towards, free_port
from ..payloads import CALL
from ..store.execution import Part
from . import node_ranks
from .calling import reply_ending
from .endings import Ending
from .launches import Followed, Launch, LaunchContext, Started, spawn_failure
from .output import Tracked
from .process import signal_tree
from .usage import LeadersMeter


class PartLaunch(Launch):
    # A function's ranks, too, are processes of the job's, in its folder: they leave their results
    # there, and a remote Trainer's rank 0 saves checkpoints.
    folder = True

    def __init__(self, part: Part, gang: Distributed, worker: str, address: str) -> None:
        self._part = part
        self._gang = gang
        self._worker = worker
        #: Where other machines reach this one: rank 0 listens there.
        self._address = address

    def announce(self) -> str:
        """Node 0 says where its rank 0 will listen as it starts."""
        # Free on every interface, as torchrun picks one: other machines connect to it.
        return f"{self._address}:{free_port('')}" if self._part.node == 0 else ""

    def label(self, line: str) -> str:
        return f"node {self._part.node} ({self._worker}): {line}"

    def start(
        self, job: LaunchContext, env: dict[str, str], call: bytes | None, announced: str
    ) -> Started | Ending:
        """Start this node's ranks (or torchrun), all or none. ``call``: each rank calls the
        function, in the code bundle's folder."""
        master = announced or self._wait_for_master(job)
        if not master:
            if job.stopped() is not None:
                return job.outcome(0, None, None)
            reason = f"rank 0 did not start within {node_ranks.GANG_START_TIMEOUT:g} s"
            job.say(reason)
            return Ending(JobState.FAILED, reason=reason, unstarted=True)
        env = {**job.base_env, "PYTHONUNBUFFERED": "1", **env}
        cwd, command = job.folder, job.spec.command
        if call is not None:
            cwd = self._prepare_call(job, call)
            command = node_ranks.call_command(job.folder)
        tracked = self._spawn(job, self._plan(job, env, master, command), cwd)
        if isinstance(tracked, Ending):
            return tracked
        # Node 0's folder, where rank 0 runs, holds the outputs.
        return Started(tracked, outputs=self._part.node == 0)

    def finish(self, job: LaunchContext, started: Started, followed: Followed) -> Ending:
        """As the first rank that failed, named, if one did (any rank failing stopped the others);
        a function's gang job with rank 0's value, or the failing rank's exception."""
        ending = super().finish(job, started, followed)
        failed = followed.failed
        if job.stopped() is None:
            # Several ranks: the first to fail was noted as it exited. One process (torchrun): here.
            failing = next((one for one in started.tracked if one.returncode), None)
            if failed is None and failing is not None:
                failed = (failing.rank, failing.returncode or 0)
            if failed is not None:
                outcome = job.outcome(failed[1], ending.outputs, None)
                ending = dataclasses.replace(outcome, reason=f"{self._failing(failed)}: {outcome.reason}")
        return self._call_result(job, ending, failed) if job.spec.function is not None else ending

    def _plan(
        self, job: LaunchContext, env: dict[str, str], master: str, command: list[str]
    ) -> list[tuple[int | None, list[str], dict[str, str]]]:
        """Each process to start on this node: its rank (None for torchrun), command and environment."""
        gang, node = self._gang, self._part.node
        if gang.launcher == "torchrun":
            return [(None, node_ranks.torchrun(gang, node, master, command, job.folder / ".torchrun"), env)]
        devices = [device for device in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if device]
        return [
            (rank, command, {**env, **rank_env})
            for rank, rank_env in node_ranks.direct(gang, node, master, devices, env)
        ]

    def _spawn(
        self, job: LaunchContext, plan: list[tuple[int | None, list[str], dict[str, str]]], cwd: Path
    ) -> list[Tracked] | Ending:
        """Start them all, or none: one that cannot start stops those started before it."""
        first = self._part.node * self._gang.procs_per_node
        tracked: list[Tracked] = []
        box = job.contain(LeadersMeter(), None)
        for rank, argv, rank_env in plan:
            try:
                process = job.processes.spawn(argv, cwd, rank_env, die_with_worker=True, box=box)
            except OSError as exc:
                for started in tracked:
                    signal_tree(started.pid, signal.SIGKILL)
                    job.processes.reap(started.process)
                code, reason = spawn_failure(argv[0], exc)
                reason = f"rank {rank if rank is not None else first}: {reason}"
                job.say(reason)
                return Ending(JobState.FAILED, code, reason, unstarted=True)
            tracked.append(Tracked(process, rank=rank, torchrun_base=first if rank is None else None))
        return tracked

    def _failing(self, failed: tuple[int | None, int]) -> str:
        """Who failed first on this node: a rank, or torchrun (whose ranks it ran)."""
        rank = failed[0]
        return f"rank {rank}" if rank is not None else f"torchrun (node {self._part.node})"

    def _wait_for_master(self, job: LaunchContext) -> str:
        """Where rank 0 listens, once node 0 has said it (polled: it is a matter of milliseconds when
        all goes well); '' if it does not within :data:`node_ranks.GANG_START_TIMEOUT` or the job stops."""
        deadline = time.monotonic() + node_ranks.GANG_START_TIMEOUT
        pause = 0.002
        while job.stopped() is None and time.monotonic() < deadline:
            master = job.master()
            if master:
                return master
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return ""

    def _prepare_call(self, job: LaunchContext, call: bytes) -> Path:
        """For ranks that call a function: the call written where they read it, and the folder they
        run in."""
        function = job.spec.function
        assert function is not None
        with job.processes.reading():  # into the job's folder, which its user could fill with links
            (job.folder / CALL).write_bytes(call)
        return job.retry(job.functions.bundles.folder, function.bundle)

    def _call_result(
        self, job: LaunchContext, ending: Ending, failed: tuple[int | None, int] | None
    ) -> Ending:
        """A function's gang job ends with rank 0's value (stored by node 0), or with the exception
        of the rank that failed here."""
        found = None
        with job.processes.reading():  # the ranks wrote them, as the job's user
            if ending.state is JobState.SUCCEEDED and self._part.node == 0:
                found = node_ranks.call_result(job.folder, 0)
            elif ending.state is JobState.FAILED:
                found = node_ranks.call_result(job.folder, failed[0] if failed else None)
        if found is None:
            return ending
        reply = reply_ending(job, *found)
        if reply.state is JobState.FAILED and failed is not None:
            reason = f"{self._failing(failed)}: {reply.reason}"
            return dataclasses.replace(reply, exit_code=ending.exit_code, reason=reason)
        return reply


def redis_route_address(connection: Redis) -> str:
    """This machine's address on the route to Redis: what other workers, which reach the same Redis,
    most likely reach it at."""
    pool = connection.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
        return address_towards(host, int(port))
    kwargs = pool.connection_kwargs
    host = kwargs.get("host")
    if not host:  # a Unix socket: Redis, and so every worker, is on this machine
        return "127.0.0.1"
    return address_towards(host, int(kwargs.get("port", 6379)))
