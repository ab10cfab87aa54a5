"""The ``docker`` provider: the ``docker`` command lines it runs (against a stand-in ``docker`` that
records them), and, where a Docker engine answers, a machine that is a container of the project's
image running a job for real, holding its token and nothing else, removed once idle. That one is
skipped where no engine answers, unless GPULAYER_CONTAINER_TESTS=required (as .ci/run sets it)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpulayer import Client, JobState
from gpulayer.capacity import MachineKind, ProviderError, load
from gpulayer.capacity.docker import MACHINE_LABEL, DockerProvider, container
from tests.conftest import wait_for
from tests.test_capacity import KINDS, Running, _ended, autoscalers  # noqa: F401 - a fixture

A100X2 = MachineKind.model_validate(KINDS[1] | {"memory": "8GiB", "labels": {"zone": "mars"}})

#: A stand-in for ``docker``: it appends its arguments and what it read on stdin to $FAKE_DOCKER_LOG,
#: answers ``inspect`` with $FAKE_DOCKER_STATE (or no such container), and fails the command named
#: in $FAKE_DOCKER_FAIL.
FAKE_DOCKER = """\
import json, os, sys
arguments = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"arguments": arguments, "stdin": sys.stdin.buffer.read().hex()}) + "\\n")
command = next(a for a in arguments if not a.startswith("-") and a != os.environ.get("FAKE_DOCKER_HOST"))
if command == os.environ.get("FAKE_DOCKER_FAIL"):
    sys.exit("Error response from daemon: could not select device driver with capabilities: [[gpu]]")
if command == "inspect":
    state = os.environ.get("FAKE_DOCKER_STATE")
    if state is None:
        sys.exit("Error: No such container: " + arguments[-1])
    print(state)
"""


class FakeDocker:
    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = folder / "docker"
        self.path.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
        self.path.chmod(0o755)
        self.log = folder / "docker.log"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_DOCKER_LOG", str(self.log))

    def provider(self, **options: Any) -> DockerProvider:
        return DockerProvider("dock", {"kinds": [A100X2.model_dump()], "docker": str(self.path), **options})

    def calls(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def set(self, variable: str, value: str) -> None:
        self.monkeypatch.setenv(variable, value)


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDocker:
    return FakeDocker(tmp_path, monkeypatch)


def test_it_is_found_by_its_entry_point_and_refuses_an_unknown_option() -> None:
    assert isinstance(load("gpu-host", {"type": "docker", "kinds": KINDS}), DockerProvider)
    with pytest.raises(ProviderError, match=r"provider gpu-host: .*pull"):
        load("gpu-host", {"type": "docker", "pull": "always"})


def test_a_machine_is_a_container_asking_the_engine_for_its_gpus_and_limited_to_its_kind(
    docker: FakeDocker,
) -> None:
    command = docker.provider(image="registry.example/gpulayer:1", network="gpulayer_default").create_command(
        "dock-a100x2-1", A100X2
    )
    assert command == [
        "create", "--name", "gpulayer-dock-a100x2-1", "--user", "root",
        "--label", f"{MACHINE_LABEL}=dock-a100x2-1", "--label", "gpulayer.provider=dock",
        "--cpus", "2", "--memory", str(8 << 30), "--network", "gpulayer_default", "--gpus", "2",
        "registry.example/gpulayer:1",
        "join", "--token-file", "/run/gpulayer/token", "--name", "dock-a100x2-1", "--slots", "2",
        "--run-as", "gpulayer", "--label", "zone=mars",
    ]  # fmt: skip
    simulated = docker.provider(simulate_gpus=True).create_command("m", A100X2)
    assert "--gpus" not in simulated
    gpus = json.loads(simulated[simulated.index("--fake-gpus") + 1])
    assert gpus == [{"name": "NVIDIA A100-SXM4-80GB", "memory": 80 << 30}] * 2
    cpu = docker.provider().create_command("m", MachineKind(name="cpu4", cpus=4))
    assert not {"--gpus", "--memory", "--fake-gpus"} & set(cpu)


def test_the_token_goes_in_on_stdin_as_a_file_only_root_reads_before_the_container_starts(
    docker: FakeDocker,
) -> None:
    docker.provider(host="ssh://gpu-host").start("m1", A100X2, "glt_secret")
    calls = docker.calls()
    assert [call["arguments"][2] for call in calls] == ["create", "cp", "start"]
    assert all(call["arguments"][:2] == ["--host", "ssh://gpu-host"] for call in calls)
    assert not any("glt_secret" in " ".join(call["arguments"]) for call in calls)
    assert calls[1]["arguments"][2:] == ["cp", "-", "gpulayer-m1:/run"]
    with tarfile.open(fileobj=io.BytesIO(bytes.fromhex(calls[1]["stdin"]))) as tar:
        members = {member.name: member for member in tar.getmembers()}
        assert {name: (m.mode, m.uid, m.isdir()) for name, m in members.items()} == {
            "gpulayer": (0o700, 0, True),
            "gpulayer/token": (0o400, 0, False),
        }
        token = tar.extractfile(members["gpulayer/token"])
        assert token is not None
        assert token.read() == b"glt_secret\n"


def test_a_container_that_cannot_start_is_removed_and_the_engines_words_are_the_reason(
    docker: FakeDocker,
) -> None:
    docker.set("FAKE_DOCKER_FAIL", "start")
    with pytest.raises(ProviderError, match=r"^docker start: Error response from daemon: could not select"):
        docker.provider().start("m1", A100X2, "glt_secret")
    assert [call["arguments"][0] for call in docker.calls()] == ["create", "cp", "start", "stop", "rm"]
    missing = docker.provider(docker=str(docker.path.parent / "nowhere"))
    with pytest.raises(ProviderError, match=r"^cannot run .*nowhere"):
        missing.start("m2", A100X2, "glt_secret")


def test_its_state_is_the_containers_and_a_container_it_does_not_have_is_gone(docker: FakeDocker) -> None:
    provider = docker.provider()
    assert provider.status("m1").state == "gone"
    provider.stop("m1")  # nothing to stop: not an error
    assert [call["arguments"][:2] for call in docker.calls()[1:]] == [["stop", "--time"], ["rm", "--force"]]
    for status, state in (("created", "starting"), ("running", "up"), ("removing", "gone")):
        docker.set("FAKE_DOCKER_STATE", json.dumps({"Status": status, "ExitCode": 0}))
        assert provider.status("m1").state == state
    docker.set("FAKE_DOCKER_STATE", json.dumps({"Status": "exited", "ExitCode": 2}))
    assert provider.status("m1").detail == ("its container exited (status 2; see `docker logs gpulayer-m1`)")


# --- for real, where an engine answers ----------------------------------------------------------


def _engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def image() -> str:
    """The project's image, built as the Compose tests build it (no Docker Hub)."""
    if not _engine():
        if os.environ.get("GPULAYER_CONTAINER_TESTS") == "required":
            raise RuntimeError("GPULAYER_CONTAINER_TESTS=required, but no Docker engine answers")
        pytest.skip("no Docker engine answers here")
    from tests import test_compose

    test_compose._base_image()
    test_compose._build()
    return test_compose.IMAGE


@pytest.fixture
def tokens(autoscalers: Running, monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    """Each token the autoscaler gives a machine."""
    given: list[str] = []
    add = autoscalers.enroller.add

    def recorded(name: str) -> str:
        given.append(add(name))
        return given[-1]

    monkeypatch.setattr(autoscalers.enroller, "add", recorded)
    return given


def test_a_container_machine_runs_a_job_holding_only_its_token_and_is_removed_once_idle(
    client: Client,
    autoscalers: Running,  # noqa: F811
    tokens: list[str],
    image: str,
) -> None:
    # The host's network: the container reaches the test's Redis at 127.0.0.1, as its token says.
    provider = {"type": "docker", "image": image, "network": "host", "simulate_gpus": True}
    autoscalers.start(provider, limits={"machines": 1}, join_timeout=120)
    # The token, and the access its worker keeps in root's home: neither is the job's to read.
    probe = "cat /run/gpulayer/token /root/.gpulayer/access/worker.json 2>&1; id -un"
    job = client.submit(["sh", "-c", probe], gpus=1)
    try:
        assert job.wait(180).state is JobState.SUCCEEDED
        [machine] = client.machines()
        assert job.status().worker == machine.name
        lines = [line.text for line in job.logs()]
        assert len(lines) == 3, lines
        assert all("Permission denied" in line for line in lines[:2]), lines
        assert lines[-1] == "gpulayer", lines  # the job's user, not root
        [token] = tokens
        inspected = subprocess.run(
            ["docker", "inspect", container(machine.name)], capture_output=True, text=True, check=True
        ).stdout
        assert token not in inspected
        assert "GPULAYER_ACCESS_TOKEN" not in inspected
        wait_for(lambda: _ended(client), timeout=60, what="the idle machine to stop")
        assert client.machines()[0].state == "stopped"
        left = ["docker", "ps", "-aq", "--filter", f"label={MACHINE_LABEL}={machine.name}"]
        assert subprocess.run(left, capture_output=True, text=True, check=True).stdout == ""
    finally:
        for machine in client.machines():
            subprocess.run(["docker", "rm", "-f", container(machine.name)], capture_output=True, check=False)
