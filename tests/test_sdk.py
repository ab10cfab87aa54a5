"""The Python SDK against real workers and Redis: ``@gl.remote`` functions, ``.map``, handles,
exceptions, code shipping, signed payloads and warm executors.

Functions defined in this module travel by value (``register_pickle_by_value`` below), as a
``__main__`` script's do, so workers need not import the test suite; the code-shipping tests run
real scripts in their own project folders instead.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import redis

import gpulayer as gl
from gpulayer import Client, JobState, Settings
from gpulayer import access as accesses
from gpulayer.models import FunctionSpec, build_spec
from gpulayer.payloads import CALL, RESULT, load_result
from gpulayer.signing import Keyring, ResultSigner, SigningKey, WorkerKey, sign_result
from gpulayer.store.artifacts import BUNDLE_TTL
from gpulayer.store.jobs import JobStore
from gpulayer.store.scripts import Scripts
from gpulayer.unpickling import OwnCode, Policy

from .conftest import WAIT, Workers, commands_run, commands_since, kill_machine, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Custom(Exception):
    """An exception class of the caller's own."""


class Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("this exception refuses to be pickled")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README").write_text("the code bundle of the in-process tests\n")
    return folder


@pytest.fixture
def remote(client: Client, project: Path) -> Callable[..., Any]:
    """``gl.remote`` bound to the test's client and project folder."""

    def decorate(function: Callable[..., Any] | None = None, **options: Any) -> Any:
        options = {"client": client, "source": project, **options}
        return gl.remote(function, **options) if function is not None else gl.remote(**options)

    return decorate


def square(x: int) -> int:
    return x * x


def whoami(_: object = None) -> int:
    return os.getpid()


def nap(seconds: float) -> str:
    print("napping", flush=True)
    time.sleep(seconds)
    return "rested"


def run_script(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        cwd=script.parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


SCRIPT = """
import json, sys
import gpulayer as gl
from helpers import double, HelperError

OFFSET = 1000

@gl.remote
def add_offset(x):
    print("adding to", x)
    return x + OFFSET

def make_adder(n):
    @gl.remote
    def add(x):
        return x + n
    return add

@gl.remote
def raise_helper():
    raise HelperError("from the module")

if __name__ == "__main__":
    out = {
        "main": add_offset.remote(1).result(timeout=60),
        "module": gl.remote(double).remote(21).result(timeout=60),
        "closure": make_adder(5).remote(10).result(timeout=60),
        "lambda": gl.remote(lambda a, b: a * b).remote(6, 7).result(timeout=60),
        "logs": [line.text for line in add_offset.remote(2).logs(follow=True)],
    }
    try:
        raise_helper.remote().result(timeout=60)
    except HelperError as exc:
        out["helper_error"] = str(exc)
    json.dump(out, sys.stdout)
"""


def write_project(root: Path) -> Path:
    """A user's project: a script run from anywhere, and a module of theirs next to it."""
    folder = root / "myproject"
    folder.mkdir()
    (folder / "helpers.py").write_text(
        "class HelperError(Exception):\n    pass\n\ndef double(x):\n    return 2 * x\n"
    )
    (folder / "main.py").write_text(SCRIPT)
    return folder / "main.py"


@pytest.mark.slow
def test_script_module_closure_and_lambda_run_on_a_worker_that_never_saw_the_code(
    workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    workers.start("w1", 2)
    out = json.loads(run_script(write_project(tmp_path), env).stdout)
    assert out["main"] == 1001
    assert out["module"] == 42
    assert out["closure"] == 15
    assert out["lambda"] == 42
    assert out["logs"] == ["adding to 2"]
    assert out["helper_error"] == "from the module"


def monitor_writes(url: str, key: str) -> tuple[list[str], Callable[[], None]]:
    """Every command Redis runs on ``key`` from now on (MONITOR), until the returned stop is called."""
    seen: list[str] = []
    stop = threading.Event()
    connection = redis.Redis.from_url(url)

    def watch() -> None:
        with connection.monitor() as monitor:
            for command in monitor.listen():
                if key in command["command"]:
                    seen.append(command["command"].split()[0].upper())
                if stop.is_set():
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    time.sleep(0.2)

    def finish() -> None:
        stop.set()
        connection.ping()  # one more command, so the monitor loop sees the stop
        redis.Redis.from_url(url).ping()
        thread.join(10)

    return seen, finish


@pytest.mark.slow
def test_a_second_call_ships_no_new_code(
    workers: Workers, env: dict[str, str], tmp_path: Path, raw_redis: redis.Redis, home: Path, redis_url: str
) -> None:
    workers.start("w1", 2)
    script = write_project(tmp_path)
    run_script(script, env)
    [bundle_key] = [key.decode() for key in raw_redis.scan_iter("*:bundle:*")]
    assert 0 < raw_redis.ttl(bundle_key) <= BUNDLE_TTL
    seen, finish = monitor_writes(redis_url, bundle_key)
    run_script(script, env)  # a new process, the same code
    finish()
    assert seen, "the second run asked whether the bundle is there"
    assert not {"HSET", "DEL", "RENAME"} & set(seen), seen
    # The worker unpacked it once.
    assert len(list((home / "bundles").iterdir())) == 1


@pytest.mark.slow
def test_map_ordered_and_unordered_over_200_items_on_two_workers(
    workers: Workers, remote: Callable[..., Any], client: Client
) -> None:
    workers.start("w1", 2)
    workers.start("w2", 2)
    f = remote(square)
    assert list(f.map(range(200))) == [x * x for x in range(200)]
    unordered = list(f.map(range(200), ordered=False))
    assert sorted(unordered) == [x * x for x in range(200)]
    assert list(remote(pow).starmap([(2, 3), (3, 2)])) == [8, 9]
    ran_on = {record.worker for record in client.jobs(JobState.SUCCEEDED, limit=402)}
    assert ran_on == {"w1", "w2"}


def test_a_result_reads_the_job_record_once(
    workers: Workers, remote: Callable[..., Any], raw_redis: redis.Redis
) -> None:
    workers.start("w1", 1)
    handle = remote(square).remote(5)
    assert handle.job.wait(WAIT).state is JobState.SUCCEEDED
    before = commands_run(raw_redis)
    assert handle.result(WAIT) == 25
    spent = commands_since(raw_redis, before)
    # Its end and record in the wait's round trip, then its result: the record is not read again.
    assert spent["xread"] == 1, spent
    assert spent["hgetall"] == 2, spent


def test_calling_the_function_directly_runs_it_here(remote: Callable[..., Any]) -> None:
    assert remote(whoami)() == os.getpid()
    assert remote(square)(4) == 16


@pytest.mark.slow
def test_handle_status_logs_and_listing(
    workers: Workers, remote: Callable[..., Any], client: Client, cli: Callable[..., Any]
) -> None:
    workers.start("w1", 1)
    handle = remote(nap).remote(0.01)
    assert handle.result(timeout=WAIT) == "rested"
    record = handle.status()
    assert record.state is JobState.SUCCEEDED
    assert record.command == ["tests.test_sdk.nap"]
    assert record.spec.function is not None
    assert [line.text for line in handle.logs()] == ["napping"]
    # A function job is a job like any other.
    assert client.get(handle.id).status().worker == "w1"
    listing = cli("jobs").output
    assert handle.id in listing
    assert "tests.test_sdk.nap" in listing


@pytest.mark.slow
def test_remote_exceptions_are_raised_here_with_the_remote_traceback(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    workers.start("w1", 1)

    @remote
    def fail(kind: str) -> None:
        if kind == "builtin":
            raise KeyError("missing")
        if kind == "custom":
            raise Custom("mine")
        if kind == "unpicklable":
            raise Unpicklable("cannot travel")
        sys.exit(3)

    with pytest.raises(KeyError, match="missing") as builtin:
        fail.remote("builtin").result(timeout=WAIT)
    notes = "\n".join(getattr(builtin.value, "__notes__", []))
    assert "Remote traceback" in notes
    assert "in fail" in notes
    with pytest.raises(Custom, match="mine"):
        fail.remote("custom").result(timeout=WAIT)
    with pytest.raises(gl.RemoteError, match="cannot travel") as described:
        fail.remote("unpicklable").result(timeout=WAIT)
    assert described.value.remote_type.endswith("Unpicklable")
    assert "Remote traceback" in str(described.value)
    # Not an exception to raise in the caller: SystemExit would end the caller's program.
    with pytest.raises(gl.RemoteError, match="SystemExit"):
        fail.remote("exit").result(timeout=WAIT)
    # The traceback is in the job's log too, and the job failed with its one-line reason.
    handle = fail.remote("custom")
    with pytest.raises(Custom):
        handle.result(timeout=WAIT)
    assert handle.status().reason == "Custom: mine"
    assert handle.status().exit_code == 1
    assert any("Custom: mine" in line.text for line in handle.logs())


TRACEBACK_SCRIPT = """
import json, sys, traceback
from pathlib import Path
import gpulayer as gl


@gl.remote
def fail(x):
    raise ValueError(f"boom {x}")


@gl.remote(source=Path(__file__).resolve().parent.parent)
def fail_in_project(x):
    check = lambda: x > 0 and 1 / 0
    return check()


if __name__ == "__main__":
    out = {}
    for name, function in (("script", fail), ("project", fail_in_project)):
        try:
            function.remote(1).result(timeout=60)
        except Exception as exc:
            out[name] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    json.dump(out, sys.stdout)
"""


@pytest.mark.slow
def test_a_remote_traceback_names_the_script_and_shows_its_lines(
    workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    workers.start("w1", 2)
    script = tmp_path / "myproject" / "jobs" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text(TRACEBACK_SCRIPT)
    out = json.loads(run_script(script, env).stdout)
    lines = TRACEBACK_SCRIPT.splitlines()
    # By its path in the project that shipped with it: the script's folder, or the source given.
    raised = '    raise ValueError(f"boom {x}")'
    assert f'File "train.py", line {lines.index(raised) + 1}, in fail\n{raised}\n' in out["script"]
    divided = "    check = lambda: x > 0 and 1 / 0"
    assert (
        f'File "jobs/train.py", line {lines.index(divided) + 1}, in <lambda>\n{divided}\n' in out["project"]
    )
    assert "<dynamic-code>" not in out["script"] + out["project"]


@pytest.mark.slow
def test_map_raises_a_calls_exception_in_its_turn(workers: Workers, remote: Callable[..., Any]) -> None:
    workers.start("w1", 2)

    @remote
    def invert(x: int) -> float:
        return 1 / x

    results = remote(invert).map([1, 2, 0, 4])
    assert next(results) == 1.0
    assert next(results) == 0.5
    with pytest.raises(ZeroDivisionError):
        next(results)


@pytest.mark.slow
def test_map_with_return_exceptions_yields_each_calls_exception_in_its_place(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    workers.start("w1", 2)

    @remote
    def invert(x: int) -> float:
        return 1 / x

    results = list(remote(invert).map([1, 0, 4, 0], return_exceptions=True))
    assert results[::2] == [1.0, 0.25]
    assert all(isinstance(results[i], ZeroDivisionError) for i in (1, 3))
    unordered = remote(invert).map([0, 2], return_exceptions=True, ordered=False)
    assert sorted(type(value).__name__ for value in unordered) == ["ZeroDivisionError", "float"]


@pytest.mark.slow
def test_an_exception_without_a_message_is_named_with_its_repr(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    workers.start("w1", 1)

    @remote
    def fail() -> None:
        raise ValueError()

    handle = fail.remote()
    with pytest.raises(ValueError, match="Remote traceback"):
        handle.result(timeout=WAIT)
    assert handle.status().reason == "ValueError: ValueError()"


@pytest.mark.slow
def test_timeout_cancel_and_worker_lost_raise_distinct_errors(
    workers: Workers, remote: Callable[..., Any], client: Client
) -> None:
    w1 = workers.start("w1", 2, "--lease-ttl", "2", "--heartbeat", "0.5")
    with pytest.raises(gl.JobTimedOut, match=r"timed out after 0\.5 s"):
        remote(nap, timeout=0.5).remote(30).result(timeout=WAIT)
    # The executor that timed out was stopped; the next call gets a working one.
    assert remote(square).remote(3).result(timeout=WAIT) == 9

    handle = remote(nap).remote(30)
    wait_for(lambda: handle.status().state is JobState.RUNNING, what="the call to run")
    assert handle.cancel()
    with pytest.raises(gl.JobCancelled):
        handle.result(timeout=WAIT)

    lost = remote(nap, retries=0).remote(30)
    wait_for(lambda: lost.status().state is JobState.RUNNING, what="the call to run")
    workers.start("w2", 1, "--lease-ttl", "2", "--heartbeat", "0.5")  # its reaper notices w1 is gone
    kill_machine(w1.pid)
    with pytest.raises(gl.WorkerLost, match="worker was lost"):
        lost.result(timeout=WAIT)
    assert isinstance(lost.status(), gl.JobRecord)


@pytest.mark.slow
def test_leaving_a_map_early_cancels_the_calls_not_finished(
    workers: Workers, remote: Callable[..., Any], client: Client
) -> None:
    workers.start("w1", 1)
    results = remote(nap).map([0.01, 30, 30, 30])
    assert next(results) == "rested"
    results.close()
    wait_for(lambda: len(client.jobs(JobState.CANCELLED)) == 3, what="the other three calls to be cancelled")


def evil_payload(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    return cloudpickle.dumps(Evil())


@pytest.mark.slow
def test_a_call_signed_with_another_installations_key_is_refused_unpickled(
    workers: Workers, client: Client, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    marker = tmp_path / "pwned"
    payload = evil_payload(marker)
    spec = build_spec(command=["forged"], function=FunctionSpec(name="forged", bundle="0" * 64))
    # Signed, but not by a submitter of this installation: a key anyone can make.
    other = Keyring(job_key=SigningKey.generate())
    forger = JobStore(
        client.redis, client.keys, Scripts(client.redis, client.keys, client.settings), client.settings, other
    )
    digest = client.stores.artifacts.put_inputs("f0f0f0f0f0f0", "up", CALL, io.BytesIO(payload))
    assert forger.submit("f0f0f0f0f0f0", spec, "up", {CALL: digest}) == "f0f0f0f0f0f0"
    record = client.get("f0f0f0f0f0f0").wait(WAIT)
    assert record.state is JobState.FAILED
    assert record.reason == "refused: the job is signed with another installation's key; it was not run"
    assert not marker.exists()
    # The worker is fine, and runs real calls after it.
    assert gl.remote(square, client=client, source=tmp_path).remote(5).result(timeout=WAIT) == 25


@pytest.mark.slow
def test_a_forged_result_is_refused_by_the_client(
    workers: Workers, remote: Callable[..., Any], client: Client, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    handle = remote(square).remote(2)
    assert handle.result(timeout=WAIT) == 4
    marker = tmp_path / "pwned"
    key = client.keys.outputs(handle.id)
    raw_redis.delete(key)
    client.stores.artifacts.put_outputs(handle.id, 0, RESULT, io.BytesIO(evil_payload(marker)))
    raw_redis.rename(client.keys.staged_outputs(handle.id, 0), key)
    with pytest.raises(gl.UntrustedPayload):
        handle.result()
    assert not marker.exists()


@pytest.mark.slow
def test_numpy_arrays_round_trip(workers: Workers, remote: Callable[..., Any]) -> None:
    numpy = pytest.importorskip("numpy")
    workers.start("w1", 1)

    @remote
    def scale(array: Any, factor: float) -> Any:
        return array * factor

    array = numpy.arange(300_000, dtype=numpy.float64).reshape(600, 500)  # 2.4 MB: several chunks
    result = scale.remote(array, 2.0).result(timeout=WAIT)
    assert result.dtype == numpy.float64
    assert numpy.array_equal(result, array * 2.0)


def who_runs_me(_: object = None) -> tuple[int, str | None, str | None]:
    return os.getpid(), os.environ.get("GPULAYER_JOB_ID"), os.environ.get("GPULAYER_ATTEMPT")


@pytest.mark.slow
def test_each_call_in_a_warm_executor_sees_its_own_job(workers: Workers, remote: Callable[..., Any]) -> None:
    workers.start("w1", 1)
    seen = remote(who_runs_me)
    handles = [seen.remote() for _ in range(3)]
    values = [handle.result(timeout=WAIT) for handle in handles]
    assert len({pid for pid, _, _ in values}) == 1  # one executor ran them all
    assert [(job, attempt) for _, job, attempt in values] == [(handle.id, "1") for handle in handles]


def where_a_call_lives(_: object = None) -> dict[str, Any]:
    """What a call finds of its HOME, TMPDIR and thread variables; it leaves a file in its HOME."""
    home = os.environ["HOME"]
    found = os.listdir(home)
    Path(home, "left").write_text("by an earlier call")
    with tempfile.NamedTemporaryFile() as temporary:
        temp_folder = os.path.dirname(temporary.name)
    return {
        "pid": os.getpid(),
        "home": home,
        "found": found,
        "tmpdir": os.environ["TMPDIR"],
        "tempfile": temp_folder,
        "user_site": os.environ.get("PYTHONNOUSERSITE"),
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }


@pytest.mark.slow
def test_each_call_in_a_warm_executor_has_a_home_and_tmpdir_of_its_own_and_threads_for_its_cpus(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    workers.start("w1", 2)
    f = remote(where_a_call_lives)
    calls = [f.remote().result(timeout=WAIT) for _ in range(3)]
    assert len({call["pid"] for call in calls}) == 1  # one warm executor ran them all
    assert len({call["home"] for call in calls}) == 3
    for call in calls:
        assert call["found"] == []  # nothing an earlier call left
        assert call["tempfile"] == call["tmpdir"]
        assert (call["user_site"], call["threads"]) == ("1", "1")
        assert not Path(call["home"]).exists()
        assert not Path(call["tmpdir"]).exists()
    # Its libraries' thread counts are read once per process: a call asking for others gets another.
    wide = f.options(cpus=2).remote().result(timeout=WAIT)
    assert wide["threads"] == "2"
    assert wide["pid"] != calls[0]["pid"]


@pytest.mark.slow
def test_executors_stay_warm_unless_a_call_asks_for_a_fresh_one(
    workers: Workers, remote: Callable[..., Any]
) -> None:
    workers.start("w1", 1)
    warm = remote(whoami)
    first = warm.remote().result(timeout=WAIT)
    assert warm.remote().result(timeout=WAIT) == first
    assert first != os.getpid()
    fresh = warm.options(fresh_process=True)
    pids = {fresh.remote().result(timeout=WAIT) for _ in range(2)}
    assert len(pids) == 2
    assert first not in pids


@pytest.mark.slow
def test_a_call_leaves_no_process_behind(
    workers: Workers, remote: Callable[..., Any], tmp_path: Path
) -> None:
    workers.start("w1", 1)

    @remote
    def spawn_sleeper() -> int:
        return subprocess.Popen(["sleep", "300"]).pid

    pid = spawn_sleeper.remote().result(timeout=WAIT)
    wait_for(lambda: not _alive(pid), what="the call's child to be stopped")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_options_are_checked_when_the_function_is_decorated(remote: Callable[..., Any]) -> None:
    with pytest.raises(gl.InvalidJobSpec, match="gpus"):
        remote(square, gpus=-1)
    with pytest.raises(gl.InvalidJobSpec, match="unknown option"):
        remote(square).options(gpu=1)
    f = remote(square).options(gpus=2, gpu_memory="24GB", frameworks={"torch": ">=2.1"})
    spec = f._client()._calls.spec(square, f._call_options)
    assert spec.requirements.gpus == 2
    assert spec.requirements.frameworks == ("torch>=2.1",)


def test_an_argument_that_cannot_be_pickled_fails_at_once_and_writes_nothing(
    remote: Callable[..., Any], raw_redis: redis.Redis
) -> None:
    f = remote(square)
    f.remote(1)  # ships the bundle, so what follows would be the call's own writes
    before = set(raw_redis.keys())
    with pytest.raises(gl.InvalidJobSpec, match="cannot send a call of square"):
        f.remote(threading.Lock())
    with pytest.raises(gl.InvalidJobSpec):
        list(f.map([1, threading.Lock()]))
    assert set(raw_redis.keys()) == before


def test_without_a_key_the_client_says_how_to_get_one(redis_url: str, tmp_path: Path) -> None:
    client = Client(redis_url, settings=Settings(home=tmp_path / "empty-home"))
    with pytest.raises(gl.ConfigError, match="gpulayer up"):
        gl.remote(square, client=client, source=tmp_path).remote(1)


def test_a_worker_whose_access_is_no_identitys_refuses_to_start_saying_why(
    workers: Workers, env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    worker = accesses.load(home, "worker")
    assert worker is not None
    # As a token made before each machine had an identity: no name, no result key of its own.
    keys = {name: text for name, text in worker.keys.items() if name != "result_key"}
    accesses.save(tmp_path / "worker-home", worker.model_copy(update={"keys": keys, "identity": None}))
    done = subprocess.run(
        [sys.executable, "-m", "gpulayer", "worker", "start", "--name", "w1", "--burst"],
        env={**env, "GPULAYER_HOME": str(tmp_path / "worker-home")},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: this worker's access is no identity's (a token made before each machine had its own): "
        "get one with `gpulayer access add worker NAME` on the admin's machine"
    )


def test_connect_sets_the_default_client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = gl.connect(redis_url)
    try:
        assert gl.remote(square)._client() is client
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _no_default_client() -> Iterator[None]:
    yield
    gl.functions._default = None


def test_results_verify_before_unpickling_and_only_for_their_job_and_attempt(tmp_path: Path) -> None:
    key = SigningKey.generate()
    signer, checker = ResultSigner("gpu1", key), WorkerKey("gpu1", key.public)
    marker = tmp_path / "pwned"
    blob = sign_result(signer, "job1", 1, RESULT, pickle.dumps(3))
    policy = Policy(OwnCode(frozenset), allow_pickle=True)  # what is checked here is the signature
    assert load_result(checker, "job1", 1, RESULT, blob, policy) == 3
    evil = evil_payload(marker)
    another = ResultSigner("gpu2", SigningKey.generate())
    forged = [
        (evil, checker, "job1", 1, RESULT),  # unsigned
        (sign_result(another, "job1", 1, RESULT, evil), checker, "job1", 1, RESULT),  # another worker's
        (blob[:-1] + b"!", checker, "job1", 1, RESULT),  # changed after signing
        (blob, checker, "job2", 1, RESULT),  # moved to another job
        (blob, checker, "job1", 2, RESULT),  # to another attempt
        (blob, checker, "job1", 1, "error.pkl"),  # as another file
        (blob, WorkerKey("gpu2", key.public), "job1", 1, RESULT),  # for another identity, same key
    ]
    for stored, check, job_id, attempt, name in forged:
        with pytest.raises(gl.UntrustedPayload):
            load_result(check, job_id, attempt, name, stored, policy)
    assert not marker.exists()


@pytest.mark.slow
def test_the_remote_functions_example_runs(workers: Workers, env: dict[str, str]) -> None:
    workers.start("w1", 2)
    example = Path(__file__).resolve().parent.parent / "examples" / "remote_functions" / "squares.py"
    out = run_script(example, env).stdout
    assert "the first call ran on" in out
    assert "'count': 100" in out
    assert "raised remotely: -1 is negative" in out


@pytest.mark.slow
def test_map_keeps_at_most_max_in_flight_calls_unfinished(
    workers: Workers, remote: Callable[..., Any], client: Client
) -> None:
    workers.start("w1", 2)
    assert list(remote(square).map(range(20), max_in_flight=3)) == [x * x for x in range(20)]
    records = client.jobs(limit=20)
    for record in records:
        # When each call was submitted, at most two others were still unfinished.
        unfinished = [
            other
            for other in records
            if other.created_at < record.created_at and other.ended_at and other.ended_at > record.created_at
        ]
        assert len(unfinished) <= 2


def test_a_waiting_call_says_why_it_is_not_running(remote: Callable[..., Any], client: Client) -> None:
    handle = remote(square, gpus=1).remote(3)
    plan = client.get(handle.id).why()
    assert not plan.schedulable
    assert handle.status().state is JobState.QUEUED
