"""A private installation: with none configured, the first client of a process starts a Redis and a
local worker of its own, and stops both when the process exits or is stopped, leaving nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import session_server, wait_for

#: Two clients and a job, then its pids: Redis's, the worker's, and a job's left running.
SCRIPT = """
import json, sys, time
import gpulayer as gl

client = gl.Client()
assert gl.Client().redis_url == client.redis_url  # the second client finds the same installation
job = client.submit(["echo", "hello"])
job.wait(30)
assert [line.text for line in job.logs()] == ["hello"]
left = client.submit(["sh", "-c", "echo $$; exec sleep 600"])
while not [line for line in left.logs() if line.stream == "stdout"]:
    time.sleep(0.05)
[job_pid] = [int(line.text) for line in left.logs() if line.stream == "stdout"]
[worker] = client.workers()
pids = {"redis": client.redis.info("server")["process_id"], "worker": worker.pid, "job": job_pid}
print(json.dumps(pids), flush=True)
if sys.argv[1] == "stay":
    time.sleep(600)
"""


@pytest.fixture
def bare(tmp_path: Path) -> dict[str, str]:
    """A machine where nothing of GPUlayer's is configured; its temporary files in a folder of their own."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPULAYER_")}
    (tmp_path / "tmp").mkdir()
    env.update(session_server(), GPULAYER_HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"))
    return env


def run(env: dict[str, str], how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, how],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_nothing_left(pids: dict[str, int], tmp_path: Path) -> None:
    for name, pid in pids.items():
        assert not psutil.pid_exists(pid), name
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "home").exists()


def test_a_client_with_no_installation_starts_a_private_one_and_leaves_nothing_at_exit(
    bare: dict[str, str], tmp_path: Path
) -> None:
    process = run(bare, "exit")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert err.count("gpulayer: no installation is configured here; started a private one") == 1, err
    assert_nothing_left(json.loads(out), tmp_path)


def test_sigterm_of_the_process_stops_its_private_installation_and_its_jobs(
    bare: dict[str, str], tmp_path: Path
) -> None:
    process = run(bare, "stay")
    assert process.stdout is not None
    pids = json.loads(process.stdout.readline())
    assert all(psutil.pid_exists(pid) for pid in pids.values())
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == -signal.SIGTERM
    wait_for(lambda: not any(psutil.pid_exists(pid) for pid in pids.values()), 10, "nothing left")
    assert_nothing_left(pids, tmp_path)


def test_where_a_private_installation_is_off_or_cannot_start_the_error_is_one_line(
    bare: dict[str, str], tmp_path: Path
) -> None:
    off = subprocess.run(
        [sys.executable, "-c", "import gpulayer; gpulayer.Client()"],
        env={**bare, "GPULAYER_AUTOSTART": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert off.returncode == 1
    assert (
        off.stderr.strip()
        .splitlines()[-1]
        .endswith("set GPULAYER_REDIS_URL (GPULAYER_AUTOSTART=0: no private one is started)")
    )
    missing = tmp_path / "no-redis-server"
    cannot = subprocess.run(
        [sys.executable, "-c", "import gpulayer; gpulayer.Client()"],
        env={**bare, "GPULAYER_REDIS_SERVER": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cannot.stderr.strip().splitlines()[-1] == (
        "gpulayer.errors.NoInstallation: no installation to talk to, and none could be started for "
        f"this process: cannot start {missing}: No such file or directory"
    )
    assert list((tmp_path / "tmp").iterdir()) == []
