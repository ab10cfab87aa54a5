"""The ``simulated`` provider: each machine is a worker process on this host, with the kind's GPUs
simulated (``GPULAYER_FAKE_GPUS``), a home of its own, and only its own worker token, given on its
stdin. For tests and demos: a boot delay and failures can be set.

Options (its section of the capacity configuration): ``kinds`` (a list of machine kinds),
``boot_delay`` (s before the worker starts), ``fail_start`` (every start fails), ``never_join``
(machines start but their worker never does), ``folder`` (where machines' homes and logs are kept;
default ``$GPULAYER_HOME/capacity/<name>``), ``env`` (more variables for the workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

from ..settings import Settings
from .provider import MachineKind, MachineStatus, Provider, ProviderError, parse_options

#: What a machine's worker must not inherit from the autoscaler: its credentials and settings.
_NOT_INHERITED = ("GPULAYER_", "REDISCLI_AUTH")
#: How long a stop waits for the worker to end before it is killed (s).
_STOP_GRACE = 10.0


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kinds: list[MachineKind] = []
    boot_delay: float = 0.0
    fail_start: bool = False
    never_join: bool = False
    folder: Path | None = None
    env: dict[str, str] = {}


class SimulatedProvider(Provider):
    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, options)
        self.options = parse_options(name, _Options, options)
        self.folder = self.options.folder or Settings.from_env().home / "capacity" / name
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def kinds(self) -> list[MachineKind]:
        return list(self.options.kinds)

    def start(self, name: str, kind: MachineKind, token: str) -> None:
        if self.options.fail_start:
            raise ProviderError("simulated failure (fail_start)")
        folder = self.folder / name
        home = folder / "home"
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        worker = [sys.executable, "-m", "gpulayer", "join", "--token-file", "-", "--name", name]
        worker += ["--slots", str(kind.cpus)]
        for key, value in kind.labels.items():
            worker += ["--label", f"{key}={value}"]
        command = ["sleep", "1000000"] if self.options.never_join else worker
        if self.options.boot_delay:
            command = ["sh", "-c", f'sleep {self.options.boot_delay:g}; exec "$@"', "boot", *command]
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        env.update(self.options.env, GPULAYER_HOME=str(home))
        gpus = kind.fake_gpus()
        if gpus is not None:
            env["GPULAYER_FAKE_GPUS"] = gpus
        with open(folder / "worker.log", "ab") as log:
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # it outlives an autoscaler that restarts
                )
            except OSError as exc:
                raise ProviderError(f"cannot start a worker process: {exc}") from None
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(token.encode() + b"\n")
            process.stdin.close()
        self._children[name] = process
        started = psutil.Process(process.pid).create_time()
        (folder / "machine.json").write_text(json.dumps({"pid": process.pid, "started": started}))

    def status(self, name: str) -> MachineStatus:
        process = self._process(name)
        if process is None:
            return MachineStatus("gone")
        try:
            exited = process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return MachineStatus("gone")
        if exited:
            child = self._children.get(name)
            code = child.wait() if child is not None else None
            return MachineStatus("failed", f"its worker exited (status {code}); see {self.folder / name}")
        return MachineStatus("up")

    def stop(self, name: str) -> None:
        process = self._process(name)
        if process is not None:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGTERM)  # a warm stop: an idle worker ends at once
                try:
                    process.wait(_STOP_GRACE)
                except psutil.TimeoutExpired:
                    process.kill()
                    process.wait(_STOP_GRACE)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        shutil.rmtree(self.folder / name / "home", ignore_errors=True)
        (self.folder / name / "machine.json").unlink(missing_ok=True)

    def _process(self, name: str) -> psutil.Process | None:
        """The machine's process, if it is the one started (not another that took its pid)."""
        try:
            record = json.loads((self.folder / name / "machine.json").read_text())
            process = psutil.Process(record["pid"])
            if abs(process.create_time() - record["started"]) > 0.01:
                return None
            return process
        except (OSError, ValueError, KeyError, psutil.Error):
            return None
