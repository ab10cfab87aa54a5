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
from gpulayer.access import TOKEN_VARIABLE
from tests.conftest import WAIT, Workers, start_hub, wait_for

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
    hub = start_hub(tmp_path / "redis", bind=f"127.0.0.1 {host_ip}")
    redis_process = hub.process
    client = Client(settings=Settings(home=tmp_path / "home"), access=hub.installation.access("submitter"))
    fleet = Workers(client, {**env, TOKEN_VARIABLE: hub.worker.token()}, tmp_path / "logs")
    ledger = tmp_path / "ledger"
    isolated = None
    try:
        with open(tmp_path / "isolated.log", "wb") as log:
            isolated = subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, "-m", "gpulayer", "worker", "start",
                 "--name", "isolated", "--slots", "1", *FAST],
                env={**env, TOKEN_VARIABLE: hub.worker_on(host_ip).token()},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        fleet.wait_registered("isolated", isolated)
        script = f'echo "attempt $GPULAYER_ATTEMPT"; sleep 4; echo "attempt $GPULAYER_ATTEMPT" >> {ledger}'
        job = client.submit(["sh", "-c", script], retry_delay=0)
        # Cut once its first line is in: what it printed before the cut is kept, nothing after.
        wait_for(lambda: list(job.logs()), what="the job to start in the namespace and print")
        assert job.status().worker == "isolated"
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


def test_a_gang_job_s_ranks_reach_each_other_across_a_real_network(
    namespace: tuple[str, str, str], tmp_path: Path, env: dict[str, str]
) -> None:
    """One worker on the host, one in the namespace: rank 1 reaches rank 0 over the veth pair, at
    the address its worker advertises (its end of the route to Redis)."""
    pytest.importorskip("torch")
    name, host_link, host_ip = namespace
    hub = start_hub(tmp_path / "redis", bind=f"127.0.0.1 {host_ip}")
    redis_process = hub.process
    token = hub.worker_on(host_ip).token()
    client = Client(
        settings=Settings(home=tmp_path / "home"), access=hub.installation.access("submitter", host_ip)
    )
    # Gloo picks its interface by name; each side names its end of the veth pair.
    fleet = Workers(
        client, {**env, TOKEN_VARIABLE: token, "GLOO_SOCKET_IFNAME": host_link}, tmp_path / "logs"
    )
    inside = None
    try:
        fleet.start("a-host", 1)
        with open(tmp_path / "inside.log", "wb") as log:
            inside = subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, "-m", "gpulayer", "worker", "start",
                 "--name", "b-inside", "--slots", "1"],
                env={**env, TOKEN_VARIABLE: token, "GLOO_SOCKET_IFNAME": host_link.replace("glh", "gln")},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        fleet.wait_registered("b-inside", inside)
        source = tmp_path / "src"
        source.mkdir()
        (source / "job.py").write_text(
            "import os, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "total = torch.tensor([float(dist.get_rank() + 1)])\n"
            "dist.all_reduce(total)\n"
            "print('RESULT', dist.get_rank(), total.item(), os.environ['MASTER_ADDR'], flush=True)\n"
            "dist.barrier()\n"
            "dist.destroy_process_group()\n"
            "os._exit(0)\n"  # torch's teardown now and then aborts (see examples/distributed/ddp.py)
        )
        job = client.submit([sys.executable, "job.py"], source=source, nodes=2, timeout=120)
        record = job.wait(150)
        lines = sorted(line.text for line in job.logs() if line.text.startswith("RESULT"))
        assert record.state is JobState.SUCCEEDED, [line.text for line in job.logs()]
        assert [part.worker for part in record.parts] == ["a-host", "b-inside"]
        assert lines == [f"RESULT 0 3.0 {host_ip}", f"RESULT 1 3.0 {host_ip}"]
    finally:
        if inside is not None:
            # A worker whose gang job is stuck finishes it first on SIGTERM: it gets no such chance.
            inside.kill()
            inside.wait(30)
        fleet.stop_all()
        with contextlib.suppress(Exception):
            redis_process.kill()
            redis_process.wait()
