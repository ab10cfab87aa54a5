"""The ``docker`` provider: each machine is a container of the project's image (compose/Dockerfile) on
a Docker engine, its worker joining with the machine's own token and nothing else. The token goes in
through the ``docker`` command's stdin, as a file copied into the created container before it starts
(root's alone, read-only): it is in no environment variable, no argument and no file of this host,
so ``docker inspect`` does not show it.

Options (its section of the capacity configuration): ``kinds`` (a list of machine kinds), ``image``
(default ``gpulayer``), ``docker`` (the command, default ``docker``), ``host`` (the engine's address,
as ``docker --host`` takes it; default the command's own), ``network`` (the network containers join,
so that they reach Redis at the address in their tokens), ``run_as`` (the user of the image the
worker starts jobs as; default ``gpulayer``), ``simulate_gpus`` (a kind's GPUs are simulated rather
than asked of the engine with ``--gpus``: for tests and demos on hosts without NVIDIA GPUs).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from .provider import MachineKind, MachineStatus, Provider, ProviderError, parse_options

#: Where a machine's token is, in its container: a folder and a file only root reads.
TOKEN_FOLDER = "/run/gpulayer"
TOKEN_FILE = f"{TOKEN_FOLDER}/token"
#: The labels each container is tagged with: the machine's name, and its provider's.
MACHINE_LABEL = "gpulayer.machine"
PROVIDER_LABEL = "gpulayer.provider"
#: How long a stop lets the worker end on its own before the engine kills it (s).
STOP_GRACE = 10
#: The longest a ``docker`` command may take (s): one that hangs must not hold the autoscaler's turn.
COMMAND_TIMEOUT = 120.0
#: What ``docker`` says of a container it does not have.
_NO_SUCH = "no such container"


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kinds: list[MachineKind] = []
    image: str = "gpulayer"
    docker: str = "docker"
    host: str | None = None
    network: str | None = None
    run_as: str = "gpulayer"
    simulate_gpus: bool = False


def container(name: str) -> str:
    """The container of the machine ``name``."""
    return f"gpulayer-{name}"


class DockerProvider(Provider):
    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        super().__init__(name, options)
        self.options = parse_options(name, _Options, options)

    def kinds(self) -> list[MachineKind]:
        return list(self.options.kinds)

    def create_command(self, name: str, kind: MachineKind) -> list[str]:
        """``docker create``'s arguments for the machine ``name`` of ``kind``: a container that runs
        the image's ``gpulayer join`` as root (who alone reads the token, and starts each job as
        :attr:`_Options.run_as`), within the kind's CPUs and memory."""
        options = self.options
        command = ["create", "--name", container(name), "--user", "root"]
        command += ["--label", f"{MACHINE_LABEL}={name}", "--label", f"{PROVIDER_LABEL}={self.name}"]
        command += ["--cpus", str(kind.cpus)]
        if kind.memory:
            command += ["--memory", str(kind.memory)]
        if options.network:
            command += ["--network", options.network]
        fake = kind.fake_gpus() if options.simulate_gpus else None
        if kind.accelerator == "cuda" and kind.gpus and fake is None:
            command += ["--gpus", str(kind.gpus)]
        command += [options.image, "join", "--token-file", TOKEN_FILE, "--name", name]
        command += ["--slots", str(kind.cpus), "--run-as", options.run_as]
        if fake is not None:
            command += ["--fake-gpus", fake]
        for key, value in kind.labels.items():
            command += ["--label", f"{key}={value}"]
        return command

    def start(self, name: str, kind: MachineKind, token: str) -> None:
        self._docker(self.create_command(name, kind))
        try:
            # Into the created container, from stdin: the token is never a file of this host.
            self._docker(
                ["cp", "-", f"{container(name)}:{TOKEN_FOLDER.rsplit('/', 1)[0]}"], _token_tar(token)
            )
            self._docker(["start", container(name)])
        except ProviderError:
            with contextlib.suppress(ProviderError):  # the failure to start is what is said
                self.stop(name)
            raise

    def status(self, name: str) -> MachineStatus:
        found = self._docker(
            ["inspect", "--type", "container", "--format", "{{json .State}}", container(name)],
            missing_ok=True,
        )
        if found is None:
            return MachineStatus("gone")
        try:
            state = json.loads(found)
        except ValueError:
            raise ProviderError(f"docker inspect {container(name)} said: {found[:200]}") from None
        status = state.get("Status")
        if status in ("created", "restarting"):
            return MachineStatus("starting")
        if status in ("running", "paused"):
            return MachineStatus("up")
        if status == "removing":
            return MachineStatus("gone")
        why = f"its container {status} (status {state.get('ExitCode')}"
        return MachineStatus("failed", f"{why}; see `docker logs {container(name)}`)")

    def stop(self, name: str) -> None:
        # A warm stop first (an idle worker leaves at once), then the container is removed.
        self._docker(["stop", "--time", str(STOP_GRACE), container(name)], missing_ok=True)
        self._docker(["rm", "--force", "--volumes", container(name)], missing_ok=True)

    def _docker(self, arguments: Sequence[str], stdin: bytes = b"", missing_ok: bool = False) -> str | None:
        """What ``docker`` printed, run with ``arguments``; None for a container it does not have
        where ``missing_ok``; :class:`ProviderError` when it fails."""
        command = [self.options.docker, *(["--host", self.options.host] if self.options.host else [])]
        command += arguments
        try:
            done = subprocess.run(
                command, input=stdin, capture_output=True, timeout=COMMAND_TIMEOUT, check=False
            )
        except OSError as exc:
            raise ProviderError(f"cannot run {self.options.docker}: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise ProviderError(f"docker {arguments[0]} took more than {COMMAND_TIMEOUT:g} s") from None
        said = done.stderr.decode(errors="replace").strip()
        if done.returncode == 0:
            return done.stdout.decode(errors="replace")
        if missing_ok and _NO_SUCH in said.lower():
            return None
        raise ProviderError(f"docker {arguments[0]}: {said or f'exit status {done.returncode}'}")


def _token_tar(token: str) -> bytes:
    """A tar stream of :data:`TOKEN_FOLDER` holding the token, both root's alone."""
    folder = TOKEN_FOLDER.rsplit("/", 1)[1]
    data = token.encode() + b"\n"
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        directory = tarfile.TarInfo(folder)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(directory)
        entry = tarfile.TarInfo(f"{folder}/token")
        entry.size, entry.mode = len(data), 0o400
        tar.addfile(entry, io.BytesIO(data))
    return stream.getvalue()
