"""A worker cut off from Redis by the network, for real: it runs in its own network namespace, joined
to the host by a veth pair that the test takes down. Needs root and `ip netns`; skipped elsewhere."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import Client, JobState, Settings
from gpulayer.server import free_port, start_redis, wait_ready
from tests.conftest import WAIT, Workers, wait_for

FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def namespace() -> Iterator[tuple[str, str, str]]:
    """A network namespace reachable from the host at 10.201.x.1 through a veth pair:
    (namespace, host-side link, host address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2")
    tag = os.getpid() % 250 + 1
    name, host_link, ns_link = f"gl-test-{tag}", f"glh{tag}", f"gln{tag}"
    if ip("netns", "add", name).returncode != 0:
        pytest.skip("network namespaces are not allowed here")
    host_ip, ns_ip = f"10.201.{tag}.1", f"10.201.{tag}.2"
    try:
        for command in (
            ["link", "add", host_link, "type", "veth", "peer", "name", ns_link],
            ["link", "set", ns_link, "netns", name],
            ["addr", "add", f"{host_ip}/24", "dev", host_link],
            ["link", "set", host_link, "up"],
            ["netns", "exec", name, "ip", "addr", "add", f"{ns_ip}/24", "dev", ns_link],
            ["netns", "exec", name, "ip", "link", "set", ns_link, "up"],
            ["netns", "exec", name, "ip", "link", "set", "lo", "up"],
        ):
            result = ip(*command)
            if result.returncode != 0:
                pytest.skip(f"cannot set up the namespace: {result.stderr.strip()}")
        yield name, host_link, host_ip
    finally:
        ip("link", "del", host_link)
        ip("netns", "del", name)


def test_a_worker_cut_off_past_its_lease_loses_its_job_and_writes_nothing_after(
    namespace: tuple[str, str, str], tmp_path: Path, env: dict[str, str]
) -> None:
    name, host_link, host_ip = namespace
    port = free_port()
    redis_process = start_redis(tmp_path / "redis", port, bind=f"127.0.0.1 {host_ip}", durable=False)
    wait_ready(f"redis://127.0.0.1:{port}/0", redis_process)
    client = Client(f"redis://127.0.0.1:{port}/0", settings=Settings(home=tmp_path / "home"))
    fleet = Workers(client, {**env, "GPULAYER_REDIS_URL": f"redis://127.0.0.1:{port}/0"}, tmp_path / "logs")
    ledger = tmp_path / "ledger"
    isolated = None
    try:
        with open(tmp_path / "isolated.log", "wb") as log:
            isolated = subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, "-m", "gpulayer", "worker", "start",
                 "--name", "isolated", "--slots", "1", *FAST],
                env={**env, "GPULAYER_REDIS_URL": f"redis://{host_ip}:{port}/0"},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        fleet.wait_registered("isolated", isolated)
        script = f'echo "attempt $GPULAYER_ATTEMPT"; sleep 4; echo "attempt $GPULAYER_ATTEMPT" >> {ledger}'
        job = client.submit(["sh", "-c", script], retry_delay=0)
        wait_for(lambda: job.status().worker == "isolated", what="the job to start in the namespace")
        assert ip("link", "set", host_link, "down").returncode == 0
        fleet.start("connected", 1, *FAST)
        wait_for(lambda: job.status().worker == "connected", what="the job to move to the connected worker")
        log_text = (tmp_path / "isolated.log").read_text
        wait_for(
            lambda: "leases expired; stopping every job" in log_text(), what="the cut-off worker to stop"
        )
        assert ip("link", "set", host_link, "up").returncode == 0
        record = job.wait(WAIT)
        assert (record.state, record.worker, record.attempt) == (JobState.SUCCEEDED, "connected", 2)
        assert [a.outcome for a in record.attempts] == ["lost", "succeeded"]
        assert ledger.read_text().split("\n")[:-1] == ["attempt 2"]
        assert [line.text for line in job.logs() if line.stream == "stdout"] == ["attempt 1", "attempt 2"]
    finally:
        if isolated is not None:
            isolated.kill()
            isolated.wait()
        fleet.stop_all()
        with contextlib.suppress(Exception):
            redis_process.kill()
            redis_process.wait()
