"""Containment against this machine's real cgroups, with real workers and jobs: a cgroup per job whose
processes all end with it, its memory, CPU and process limits, and its GPU devices fenced (with
simulated GPUs: CI has none, so device nodes with NVIDIA's major number stand in for real ones).

Where the machine has no writable cgroups (an unprivileged container, macOS), these are skipped,
unless GPULAYER_CGROUP_TESTS=required (as CI sets it): then they must run.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest

import gpulayer as gl
from gpulayer import Client, JobState
from gpulayer.worker.boxes import Limits
from gpulayer.worker.cgroup_v1 import NVIDIA_MAJOR
from gpulayer.worker.cgroups import open_containment
from tests.conftest import WAIT, Workers, wait_for


def _cgroups_here() -> str | None:
    """Why cgroups cannot be tested here, or None."""
    try:
        containment = open_containment("cgroup1", "probe", 1 << 30)
    except OSError as exc:
        return f"no writable cgroup v1 controllers here: {exc}"
    containment.close()
    return None


_WHY_NOT = _cgroups_here()
if _WHY_NOT and os.environ.get("GPULAYER_CGROUP_TESTS") == "required":
    raise RuntimeError(f"GPULAYER_CGROUP_TESTS=required, but {_WHY_NOT}")
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

# The calls below ship by value: workers cannot import the tests.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}

#: A job that leaves a daemon behind the way the report's did: double fork, a session of its own, an
#: empty environment (so no GPULAYER_JOB_ID to find it by); the daemon notes its pid in ``{pidfile}``.
ESCAPE = "setsid env -i sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 0.3; exit 0"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _daemon(pidfile: Path) -> int:
    wait_for(pidfile.exists, what="the daemon's pid")
    wait_for(lambda: pidfile.read_text().strip(), what="the daemon's pid written")
    return int(pidfile.read_text())


@pytest.mark.parametrize("mode", ["cgroup1", "cgroup2"])
def test_a_daemon_that_left_its_session_and_environment_ends_with_its_job(
    client: Client, workers: Workers, tmp_path: Path, mode: str
) -> None:
    workers.start("w1", 1, "--containment", mode)
    pidfile = tmp_path / "daemon.pid"
    record = client.submit(["sh", "-c", ESCAPE.format(pidfile=pidfile)]).wait(WAIT)
    assert record.state is JobState.SUCCEEDED, record.reason
    daemon = _daemon(pidfile)
    try:
        assert _gone(daemon), "the daemon outlived its job"
        logs = [line.text for line in client.get(record.id).logs()]
        assert any("stopped 1 process(es) the job left running" in line for line in logs), logs
    finally:
        if not _gone(daemon):
            os.kill(daemon, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["cgroup1", "cgroup2"])
def test_a_job_run_as_another_user_is_contained_too(client: Client, workers: Workers, mode: str) -> None:
    area = Path(tempfile.mkdtemp(prefix="gpulayer-area-", dir="/tmp"))  # the job user passes through
    try:
        workers.start("w1", 1, "--containment", mode, "--run-as", "nobody", "--workdir", str(area))
        script = "id -u; setsid env -i sh -c 'exec sleep 300' & echo daemon $!; sleep 0.3"
        record = client.submit(["sh", "-c", script]).wait(WAIT)
        assert record.state is JobState.SUCCEEDED, record.reason
        lines = [line.text for line in client.get(record.id).logs()]
        assert lines[0] == str(pwd.getpwnam("nobody").pw_uid)
        daemon = int(next(line.split()[1] for line in lines if line.startswith("daemon")))
        assert _gone(daemon), "the daemon outlived its job"
    finally:
        shutil.rmtree(area, ignore_errors=True)


def test_without_containment_the_same_daemon_escapes_which_is_what_the_cgroup_fixes(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("w1", 1, "--containment", "none")
    pidfile = tmp_path / "daemon.pid"
    record = client.submit(["sh", "-c", ESCAPE.format(pidfile=pidfile)]).wait(WAIT)
    daemon = _daemon(pidfile)
    try:
        assert record.state is JobState.SUCCEEDED
        assert not _gone(daemon)
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_a_job_over_its_memory_fails_saying_so_and_the_worker_goes_on(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 1)
    hog = [sys.executable, "-c", "x = bytearray(700 * 2**20); print('survived')"]
    record = client.submit(hog, memory="200MiB").wait(WAIT)
    assert record.state is JobState.FAILED
    assert record.reason == "used more than its 200.0 MiB of memory"
    assert "survived" not in [line.text for line in client.get(record.id).logs()]
    assert client.submit(["true"], memory="200MiB").wait(WAIT).state is JobState.SUCCEEDED


def test_a_job_that_asked_for_no_memory_is_held_to_what_its_worker_offers(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 1)
    own = "import pathlib; print(pathlib.Path('/proc/self/cgroup').read_text())"
    record = client.submit([sys.executable, "-c", own]).wait(WAIT)
    lines = [line.text for line in client.get(record.id).logs()]
    memory = next(line.split(":", 2)[2] for line in lines if ":memory:" in line)
    limit = int(Path(f"/sys/fs/cgroup/memory{memory}/memory.limit_in_bytes").read_text())
    offered = next(worker for worker in client.workers() if worker.name == "w1").memory
    # The page size rounds the limit down.
    assert offered - 4096 < limit <= offered


FORK_BOMB = """
import os, time
forked = 0
while forked < 500:
    try:
        if os.fork() == 0:
            os.setsid()  # out of the job's process group, which the job's end kills anyway
            time.sleep(300)
            os._exit(0)
    except OSError:
        break
    forked += 1
print("forked", forked, flush=True)
"""


def test_a_fork_bomb_is_held_by_the_pids_limit_and_all_of_it_killed_at_the_end(
    client: Client, workers: Workers, env: dict[str, str]
) -> None:
    workers.env = {**env, "GPULAYER_JOB_PIDS": "40"}
    workers.start("w1", 1)
    record = client.submit([sys.executable, "-c", FORK_BOMB]).wait(WAIT)
    assert record.state is JobState.SUCCEEDED, record.reason
    logs = [line.text for line in client.get(record.id).logs()]
    forked = int(next(line.split()[1] for line in logs if line.startswith("forked")))
    assert 0 < forked < 40
    assert any(f"stopped {forked} process(es)" in line for line in logs), logs


SPIN = """
import multiprocessing, resource, time

def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

if __name__ == "__main__":
    started = time.monotonic()
    spinners = [multiprocessing.Process(target=spin, args=(1.5,)) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    for spinner in spinners:
        spinner.join()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("cores", (used.ru_utime + used.ru_stime) / (time.monotonic() - started), flush=True)
"""


def test_cpus_are_a_quota_two_busy_processes_of_a_one_cpu_job_share_one_core(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 2)
    record = client.submit([sys.executable, "-c", SPIN], cpus=1).wait(WAIT)
    assert record.state is JobState.SUCCEEDED, record.reason
    logs = [line.text for line in client.get(record.id).logs()]
    cores = float(next(line.split()[1] for line in logs if line.startswith("cores")))
    assert cores < 1.2  # two spinners with a core each would show 2 (1.5 and more on a busy machine)


def _nvidia_nodes(folder: Path) -> Path:
    """``nvidia0`` and ``nvidia1``: character devices with NVIDIA's major number, as the driver makes."""
    folder.mkdir()
    for minor in (0, 1):
        os.mknod(folder / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
    return folder


OPEN_DEVICES = """
import errno, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    try:
        os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDWR))
        said = "opened"
    except OSError as exc:
        said = errno.errorcode[exc.errno]
    print(name, said, flush=True)
"""


def test_a_job_may_open_only_its_own_gpus_device_nodes(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    nodes = _nvidia_nodes(tmp_path / "dev")
    workers.start("w1", 1, "--fake-gpus", json.dumps([A100, A100]))
    results = {}
    for gpu in (0, 1):
        # One job at a time holds one GPU: each gets the free one, and says which by its CUDA index.
        script = f"echo visible $CUDA_VISIBLE_DEVICES; {sys.executable} -c '{OPEN_DEVICES}' {nodes}"
        record = client.submit(["sh", "-c", script], gpus=1).wait(WAIT)
        assert record.state is JobState.SUCCEEDED, record.reason
        lines = [line.text for line in client.get(record.id).logs()]
        visible = next(line.split()[1] for line in lines if line.startswith("visible"))
        results[visible] = dict(line.split() for line in lines if line.startswith("nvidia"))
        assert record.gpus == [int(visible)], gpu
    for visible, opened in results.items():
        other = "nvidia1" if visible == "0" else "nvidia0"
        # Its own: not refused by the cgroup (no driver behind a simulated GPU: ENXIO).
        assert opened[f"nvidia{visible}"] != "EPERM", opened
        assert opened[other] == "EPERM", opened
    # A job holding no GPU opens neither.
    record = client.submit([sys.executable, "-c", OPEN_DEVICES, str(nodes)]).wait(WAIT)
    lines = [line.text for line in client.get(record.id).logs()]
    assert dict(line.split() for line in lines if line.startswith("nvidia")) == {
        "nvidia0": "EPERM",
        "nvidia1": "EPERM",
    }


def daemon_and_pid(pidfile: str) -> int:
    """A call that leaves a daemon behind, out of its session and environment."""
    subprocess.Popen(["sh", "-c", ESCAPE.format(pidfile=pidfile)]).wait()
    return os.getpid()


def test_a_call_on_a_warm_executor_loses_its_daemon_and_the_executor_stays_warm(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    project = tmp_path / "project"
    project.mkdir()
    call = gl.remote(daemon_and_pid, client=client, source=project)
    first = call.remote(str(tmp_path / "one.pid")).result(timeout=WAIT)
    second = call.remote(str(tmp_path / "two.pid")).result(timeout=WAIT)
    assert first == second, "the executor was not kept warm"
    assert psutil.pid_exists(first)
    for pidfile in ("one.pid", "two.pid"):
        assert _gone(_daemon(tmp_path / pidfile))


def test_a_worker_killed_outright_leaves_nothing_running_once_another_starts(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    worker = workers.start("w1", 1)
    pidfile = tmp_path / "job.pid"
    client.submit(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"], retries=0)
    job = _daemon(pidfile)
    worker.kill()
    worker.wait()
    assert not _gone(job)  # the worker died; its job's process did not
    workers.start("w2", 1)  # not under its name: a worker that died may never come back
    wait_for(lambda: _gone(job), what="the dead worker's job to be killed by the next worker")


def test_workers_say_how_they_contain_jobs(client: Client, workers: Workers, cli: Any) -> None:
    workers.start("contained", 1)
    workers.start("loose", 1, "--containment", "none")
    shown = cli("workers").output
    assert "containment: cgroup v1 (memory, pids and CPU limits; GPU devices fenced)" in shown
    assert "containment: none — processes followed by session and environment (turned off)" in shown
    by_name = {worker.name: worker.containment for worker in client.workers()}
    assert str(by_name["contained"]).startswith("cgroup v1")


def test_a_containment_that_cannot_be_had_stops_the_worker_with_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpulayer", "worker", "start", "--name", "w1"],
        env={**env, "GPULAYER_CONTAINMENT": "cgroup3"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "GPULAYER_CONTAINMENT must be one of auto, cgroup2, cgroup1, none" in done.stderr


def test_a_warm_executor_holding_more_than_a_calls_limit_refuses_it_so_a_fresh_one_is_started() -> None:
    """What a call's job may use is written to its executor's cgroup: below what the executor already
    holds, the kernel refuses it (EBUSY), and the worker starts a fresh executor for the call."""
    containment = open_containment("cgroup1", "executor-limit", 2 << 30)
    box = containment.executor_box()
    try:
        with box.placing():
            holder = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; x = bytearray(b'1') * (300 << 20); print(1, flush=True); sys.stdin.read()",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert holder.stdout is not None
        holder.stdout.readline()
        box.limit(Limits(memory=400 << 20))  # above what it holds: taken
        with pytest.raises(OSError, match="busy") as refused:
            box.limit(Limits(memory=100 << 20))
        assert refused.value.errno == errno.EBUSY
        assert holder.poll() is None  # refused, not killed
    finally:
        box.release()
        containment.close()
    assert holder.wait(10) == -signal.SIGKILL


def test_a_contained_jobs_usage_counts_the_processes_it_did_not_wait_for(
    client: Client, workers: Workers
) -> None:
    """Read from the job's cgroup: a process that left its parent burns CPU and holds memory on the
    job's account (``wait4`` of the job's leader would have seen neither)."""
    workers.start("w1", 1)
    burn = (
        "import time; x = bytearray(b'1') * (200 << 20); end = time.monotonic() + 0.6\n"
        "while time.monotonic() < end: pass"
    )
    script = f'setsid {sys.executable} -c "{burn}" & sleep 1; exit 0'
    record = client.submit(["sh", "-c", script]).wait(WAIT)
    assert record.state is JobState.SUCCEEDED, record.reason
    assert record.usage is not None
    assert record.usage.cpu_seconds >= 0.4
    assert record.usage.peak_memory is not None
    assert record.usage.peak_memory >= 200 << 20
