"""One node's part of a gang job on this worker: start its ranks together, follow them, and stop them
all when one fails. Everything else — files, start, logs, leases, the end — is a job runner's.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from ..models import Distributed, JobState, OutputSummary
from ..payloads import CALL
from ..server import free_port
from ..store.execution import Part
from . import ranks
from .endings import Ending
from .output import Tracked
from .process import signal_tree
from .runner import JobRunner, spawn_failure


class PartRunner(JobRunner):
    @property
    def _part(self) -> Part:
        assert self.claim.part is not None
        return self.claim.part

    @property
    def _gang(self) -> Distributed:
        assert self.spec.distributed is not None
        return self.spec.distributed

    @property
    def _needs_folder(self) -> bool:
        # A function's ranks leave their results there.
        return True

    @property
    def _has_checkpoint_folder(self) -> bool:
        # Every rank is a process of this job's, a function's too (a remote Trainer's rank 0 saves there).
        return True

    def _announce(self) -> str:
        """Node 0 says where its rank 0 will listen as it starts."""
        # Free on every interface, as torchrun picks one: other machines connect to it.
        return f"{self._address}:{free_port('')}" if self._part.node == 0 else ""

    def _system(self, line: str) -> None:
        super()._system(f"node {self._part.node} ({self._store.worker}): {line}")

    def _launch(self, env: dict[str, str], call: bytes | None, announced: str) -> Ending | None:
        """Start this node's ranks (or torchrun) and follow them; any rank failing stops the others.
        ``call``: each rank calls the function, in the code bundle's folder."""
        master = announced or self._wait_for_master()
        if not master:
            if self._stop is not None:
                return self._outcome(0, None, None)
            reason = f"rank 0 did not start within {ranks.GANG_START_TIMEOUT:g} s"
            self._system(reason)
            return Ending(JobState.FAILED, reason=reason, unstarted=True)
        env = {**self._base_env, "PYTHONUNBUFFERED": "1", **env}
        cwd, command = self._workdir, self.spec.command
        if call is not None:
            prepared = self._prepare_call(call)
            if isinstance(prepared, Ending):
                return prepared
            cwd = prepared
            command = ranks.call_command(self._workdir)
        gang, node = self._gang, self._part.node
        first = node * gang.procs_per_node
        if gang.launcher == "torchrun":
            argv = ranks.torchrun(gang, node, master, command, self._workdir / ".torchrun")
            plan: list[tuple[int | None, list[str], dict[str, str]]] = [(None, argv, env)]
        else:
            devices = [device for device in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if device]
            plan = [
                (rank, command, {**env, **rank_env})
                for rank, rank_env in ranks.direct(gang, node, master, devices, env)
            ]
        tracked: list[Tracked] = []
        for rank, argv, rank_env in plan:
            try:
                process = self._processes.spawn(argv, cwd, rank_env, die_with_worker=True)
            except OSError as exc:
                for started in tracked:
                    signal_tree(started.pid, signal.SIGKILL)
                    self._processes.reap(started.process)
                code, reason = spawn_failure(argv[0], exc)
                reason = f"rank {rank if rank is not None else first}: {reason}"
                self._system(reason)
                return Ending(JobState.FAILED, code, reason, unstarted=True)
            tracked.append(Tracked(process, rank=rank, torchrun_base=first if rank is None else None))
        ending = self._command(tracked)
        return self._call_result(ending) if call is not None and ending is not None else ending

    def _command(self, tracked: list[Tracked]) -> Ending | None:
        """How the node's ranks ended: as the first that failed, named, if one did."""
        ending = super()._command(tracked)
        if ending is None or self._stop is not None:
            return ending
        if self._failed is None:
            # Several ranks: the first to fail was noted as it exited. One process (torchrun): here.
            failing = next((one for one in tracked if one.returncode), None)
            if failing is None:
                return ending
            self._failed = (failing.rank, failing.returncode or 0)
        outcome = self._outcome(self._failed[1], ending.outputs, None)
        return dataclasses.replace(outcome, reason=f"{self._failing()}: {outcome.reason}")

    def _failing(self) -> str:
        """Who failed first on this node: a rank, or torchrun (whose ranks it ran)."""
        assert self._failed is not None
        rank = self._failed[0]
        return f"rank {rank}" if rank is not None else f"torchrun (node {self._part.node})"

    def _upload_outputs(self) -> tuple[OutputSummary | None, str | None]:
        # Node 0's folder, where rank 0 runs, holds the outputs.
        return super()._upload_outputs() if self._part.node == 0 else (None, None)

    def _wait_for_master(self) -> str:
        """Where rank 0 listens, once node 0 has said it (polled: it is a matter of milliseconds when
        all goes well); '' if it does not within :data:`ranks.GANG_START_TIMEOUT` or the job stops."""
        deadline = time.monotonic() + ranks.GANG_START_TIMEOUT
        pause = 0.002
        while self._stop is None and time.monotonic() < deadline:
            master = self._persist(self._store.master, self.claim)
            if master:
                return master
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return ""

    def _prepare_call(self, call: bytes) -> Path | Ending:
        """For ranks that call a function: the call written where they read it, and the folder they
        run in. Or how the job ends."""
        function = self.spec.function
        assert function is not None
        functions = self._runtime()
        if isinstance(functions, Ending):
            return functions
        with self._processes.reading():  # into the job's folder, which its user could fill with links
            (self._workdir / CALL).write_bytes(call)
        return self._persist(functions.bundles.folder, function.bundle)

    def _call_result(self, ending: Ending) -> Ending:
        """A function's gang job ends with rank 0's value (stored by node 0), or with the exception
        of the rank that failed here."""
        found = None
        with self._processes.reading():  # the ranks wrote them, as the job's user
            if ending.state is JobState.SUCCEEDED and self._part.node == 0:
                found = ranks.call_result(self._workdir, 0)
            elif ending.state is JobState.FAILED:
                found = ranks.call_result(self._workdir, self._failed[0] if self._failed else None)
        if found is None:
            return ending
        reply = self._reply_ending(*found)
        if reply.state is JobState.FAILED and self._failed is not None:
            reason = f"{self._failing()}: {reply.reason}"
            return dataclasses.replace(reply, exit_code=ending.exit_code, reason=reason)
        return reply
