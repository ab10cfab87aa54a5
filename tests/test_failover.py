"""Redis Sentinel: an installation made through a Sentinel URL, two workers joined under identities of
their own, jobs running and queued, and the master killed with SIGKILL (benchmarks/_sentinels.py)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpulayer import Client, JobState, NotReplicated, Settings, sentinel, tls
from gpulayer import access as accesses
from gpulayer.store.connection import NoSentinelAnswered, connect
from tests.conftest import WAIT, gpulayer, wait_for

# The harness benchmarks/failover.py uses too, imported as the benchmarks import each other; appended,
# so that nothing there shadows a module the other tests import.
sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _sentinels import Replicated, start_replicated

RQ_QUEUE = "gpulayer.rq_tools.Queue"
#: A lease well past a failover (the sentinels take about 2 s), short enough for a quick test.
LEASE = ("--lease-ttl", "6", "--heartbeat", "1")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Replicated]:
    made = start_replicated(tmp_path / "nodes")
    yield made
    made.stop()


def _admin_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**env, "GPULAYER_HOME": str(tmp_path / "admin")}


def _join(env: dict[str, str], tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """A worker under an identity of its own, its token made by the admin."""
    added = gpulayer(_admin_env(env, tmp_path), "access", "add", "worker", name)
    assert added.returncode == 0, added.stderr
    log = (tmp_path / f"{name}.log").open("ab")
    worker_env = {**env, "GPULAYER_HOME": str(tmp_path / name), accesses.TOKEN_VARIABLE: added.stdout.strip()}
    command = [sys.executable, "-m", "gpulayer", "worker", "start", "--name", name, "--slots", "2", *LEASE]
    return subprocess.Popen(command, env=worker_env, stdout=log, stderr=subprocess.STDOUT)


def _client(tmp_path: Path, **settings: object) -> Client:
    submitter = accesses.load(tmp_path / "admin", "submitter")
    assert submitter is not None
    return Client(access=submitter, settings=Settings(home=tmp_path / "admin", **settings))  # type: ignore[arg-type]


def test_a_failover_costs_running_jobs_nothing_and_the_same_workers_go_on(
    nodes: Replicated, env: dict[str, str], tmp_path: Path
) -> None:
    made = gpulayer(_admin_env(env, tmp_path), "access", "init", "--redis-url", nodes.url(), "--apply")
    assert made.returncode == 0, made.stderr
    workers = [_join(env, tmp_path, name) for name in ("w1", "w2")]
    client = _client(tmp_path, submit_replicas=1)  # acknowledged: on the replica too
    try:
        wait_for(lambda: len(client.workers()) == 2, what="both workers")
        running = [client.submit(["sh", "-c", "sleep 4"]) for _ in range(4)]
        queued = [client.submit(["true"]) for _ in range(10)]
        wait_for(lambda: all(job.status().state is JobState.RUNNING for job in running), what="4 running")
        users = [set(acl_users(nodes, port)) for port in nodes.nodes]
        assert all({"gpulayer-submitter", "gpulayer~w1", "gpulayer~w2"} <= found for found in users)
        old = nodes.kill_master()
        records = [job.wait(WAIT) for job in [*running, *queued]]
        assert {record.state for record in records} == {JobState.SUCCEEDED}
        # Nothing but their leases: no running job was lost, none ran twice.
        assert {len(record.attempts) for record in records} == {1}
        assert nodes.master() != old
        assert [worker.poll() for worker in workers] == [None, None]
        # Its one replica is the master now: a submit waits for none.
        after = _client(tmp_path)
        assert after.submit(["echo", "after"]).wait(WAIT).state is JobState.SUCCEEDED
        assert {w.name for w in after.workers()} == {"w1", "w2"}
        after.close()
    finally:
        client.close()
        for worker in workers:
            worker.kill()
            worker.wait(10)


def test_a_submit_asking_for_more_replicas_than_answer_says_so_and_the_job_is_kept(
    nodes: Replicated, env: dict[str, str], tmp_path: Path
) -> None:
    made = gpulayer(_admin_env(env, tmp_path), "access", "init", "--redis-url", nodes.url(), "--apply")
    assert made.returncode == 0, made.stderr
    client = _client(tmp_path, submit_replicas=2, submit_replicas_timeout=0.2)  # one replica only
    try:
        asked = r"1 of the 2 replicas asked for \(GPULAYER_SUBMIT_REPLICAS\)"
        with pytest.raises(NotReplicated, match=asked):
            client.submit(["true"])
        with pytest.raises(NotReplicated):
            client.submit_many([["true"], ["true"]])
        assert len(client.jobs(state="queued")) == 3  # on the master, said to be not yet safe
    finally:
        client.close()
    waiting = {"GPULAYER_SUBMIT_REPLICAS": "2", "GPULAYER_SUBMIT_REPLICAS_TIMEOUT": "0.2"}
    submitted = gpulayer({**_admin_env(env, tmp_path), **waiting}, "submit", "--", "true")
    assert submitted.returncode == 1
    assert submitted.stderr.count("\n") == 1
    assert "1 of the 2 replicas" in submitted.stderr
    # RQ's own CLI, pointed at the master by the Sentinel URL, sees the installation's queue.
    submitter = accesses.load(tmp_path / "admin", "submitter")
    assert submitter is not None
    seen = subprocess.run(
        [
            sys.executable,
            "-m",
            "rq.cli",
            "info",
            "-c",
            "gpulayer.rq_tools",
            "--queue-class",
            "gpulayer.rq_tools.Queue",
        ],
        env={**env, "GPULAYER_REDIS_URL": submitter.redis_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert seen.returncode == 0, seen.stderr
    assert "1 queues, 4 jobs total" in seen.stdout, seen.stdout


def acl_users(nodes: Replicated, port: int) -> list[str]:
    node = nodes.node(port)
    try:
        return [name.decode() for name in node.execute_command("ACL", "USERS")]  # type: ignore[no-untyped-call]
    except redis.exceptions.RedisError:
        return []
    finally:
        node.close()


def test_a_sentinel_learns_no_password_of_any_role(
    nodes: Replicated, env: dict[str, str], tmp_path: Path
) -> None:
    # A listener on the first sentinel's address records what a client sends it: the client asks it
    # where the master is, gets nonsense, and asks the next, a real one; the role's password goes to
    # the master only.
    made = gpulayer(_admin_env(env, tmp_path), "access", "init", "--redis-url", nodes.url(), "--apply")
    assert made.returncode == 0, made.stderr
    heard: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def record() -> None:
        with contextlib.suppress(OSError):
            peer, _ = listener.accept()
            peer.settimeout(1)
            with peer, contextlib.suppress(OSError):
                heard.append(peer.recv(65536))
                peer.sendall(b"-ERR not a sentinel\r\n")

    recording = threading.Thread(target=record)
    recording.start()
    submitter = accesses.load(tmp_path / "admin", "submitter")
    assert submitter is not None
    password = sentinel.parse(submitter.redis_url).password
    assert password
    fake = f"127.0.0.1:{listener.getsockname()[1]}"
    url = submitter.redis_url.replace("@", f"@{fake},", 1)
    client = Client(access=submitter.with_url(url), settings=Settings(home=tmp_path / "admin"))
    try:
        assert client.submit(["true"]).status().state is JobState.QUEUED
    finally:
        client.close()
        recording.join(15)
        listener.close()
    assert heard
    assert b"AUTH" not in heard[0].upper()
    assert password.encode() not in heard[0]


def test_over_tls_sentinels_and_master_must_hold_certificates_the_installations_ca_signed(
    env: dict[str, str], tmp_path: Path
) -> None:
    files = tls.ensure(tmp_path / "ca", ["127.0.0.1", "localhost"])
    made = start_replicated(tmp_path / "nodes", tls=files)
    workers = []
    try:
        init = ("access", "init", "--redis-url", made.url(), "--apply", "--ca-file", str(files.ca))
        applied = gpulayer(_admin_env(env, tmp_path), *init)
        assert applied.returncode == 0, applied.stderr
        workers.append(_join(env, tmp_path, "w1"))
        client = _client(tmp_path)
        assert client.redis_url.startswith("rediss+sentinel://")
        assert client.submit(["echo", "over tls"]).wait(WAIT).state is JobState.SUCCEEDED
        made.kill_master()
        assert client.submit(["echo", "after"]).wait(WAIT).state is JobState.SUCCEEDED
        client.close()
        # Another CA's view: neither a sentinel nor a master it did not sign is believed.
        other = tls.ensure(tmp_path / "other-ca", ["127.0.0.1"]).ca.read_text()
        stranger = connect(client.redis_url, ca=other, retries=0)
        refused = r"^no sentinel answered for master 'gl': .*certificate verify failed"
        with pytest.raises(NoSentinelAnswered, match=refused):
            stranger.ping()
        stranger.close()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
        made.stop()
