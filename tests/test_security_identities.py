"""The red-team suite, for machine identities: each worker a Redis user and a result key of its own, a
registry of identities the admin signs, revocation and expiry, and outputs signed by the worker that
ran the job and filtered by the client. Each test tries the attack against a real redis-server, real
worker processes and the real CLI and API (docs/security.md's threat table names them)."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import redis
from flask.testing import FlaskClient

import gpulayer as gl
from gpulayer import Client, JobState
from gpulayer.access import TOKEN_VARIABLE, Access
from gpulayer.installation import Installation
from gpulayer.models import Identity
from gpulayer.payloads import RESULT
from gpulayer.signing import ResultSigner, SigningKey, seal_archive, sign_identity, sign_result
from gpulayer.store.artifacts import CHECKPOINT_ARCHIVE, OUTPUTS_ARCHIVE
from gpulayer.store.connection import connect
from gpulayer.store.stores import Stores
from tests.conftest import WAIT, Hub, Workers, auth, enrol, gpulayer, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(x: int) -> int:
    return x * x


def poison(marker: Path) -> bytes:
    """A pickle that runs a command as it is loaded: what a forged result carries."""
    return f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()


def add_identity(admin_env: dict[str, str], role: str, name: str, *options: str) -> Access:
    """`gpulayer access add ROLE NAME`: the token it prints, once."""
    done = gpulayer(admin_env, "access", "add", role, name, *options)
    assert done.returncode == 0, done.stderr
    return Access.from_token(done.stdout.strip())


def store_as(
    connection: redis.Redis, client: Client, job_id: str, name: str, data: bytes, **seal: Any
) -> None:
    """Put ``data`` in place of the job's stored ``name``, through ``connection``'s Redis user."""
    connection.delete(client.keys.outputs(job_id))
    Stores.open(connection, client.settings).artifacts.put_outputs(job_id, 0, name, io.BytesIO(data), **seal)
    connection.rename(client.keys.staged_outputs(job_id, 0), client.keys.outputs(job_id))


def tar_of(entries: dict[str, bytes]) -> bytes:
    """A gzip-compressed tar archive of files by name, whatever the names say."""
    file = io.BytesIO()
    with tarfile.open(fileobj=file, mode="w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return file.getvalue()


# --- results -----------------------------------------------------------------------------------------
def test_a_result_another_worker_identity_signs_for_a_job_it_did_not_run_is_refused_unpickled(
    client: Client, workers: Workers, installation: Installation, tmp_path: Path
) -> None:
    intruder = enrol(installation, "worker", "intruder")
    workers.start("w1", 1)
    handle = gl.remote(square, client=client, source=tmp_path).remote(3)
    assert handle.result(timeout=WAIT) == 9
    attempt = handle.job.status().attempt
    assert intruder.keyring.result_key is not None
    marker = tmp_path / "pwned"
    as_intruder = connect(intruder.redis_url)
    # Signed with its own key, under its own name and under the name of the worker that ran it.
    for name in ("intruder", "worker"):
        forged = sign_result(ResultSigner(name, intruder.keyring.result_key), handle.id, attempt, RESULT,
                             poison(marker))  # fmt: skip
        store_as(as_intruder, client, handle.id, RESULT, forged)
        with pytest.raises(
            gl.UntrustedPayload, match=r"not signed by the worker that ran this job and attempt \(worker\)"
        ):
            handle.result()
    assert not marker.exists()


def test_a_result_signed_under_a_revoked_identity_is_refused(
    client: Client, admin_env: dict[str, str], env: dict[str, str], tmp_path: Path
) -> None:
    leaving = add_identity(admin_env, "worker", "leaving")
    fleet = Workers(client, {**env, TOKEN_VARIABLE: leaving.token()}, tmp_path / "logs")
    try:
        fleet.start("leaving-1", 1)
        handle = gl.remote(square, client=client, source=tmp_path).remote(4)
        assert handle.result(timeout=WAIT) == 16
        revoked = gpulayer(admin_env, "access", "revoke", "leaving")
        assert revoked.returncode == 0, revoked.stderr
        with pytest.raises(
            gl.UntrustedPayload, match="worker identity 'leaving' is not in the installation's registry"
        ):
            handle.result()
    finally:
        fleet.stop_all()


def test_revoking_a_worker_cuts_it_off_and_its_running_job_runs_again_on_another(
    client: Client, workers: Workers, admin_env: dict[str, str], env: dict[str, str], tmp_path: Path
) -> None:
    doomed, spare = add_identity(admin_env, "worker", "doomed"), add_identity(admin_env, "worker", "spare")
    bystander = workers.start("bystander", 1, "--label", "pool=b")
    fleet = Workers(client, {**env, TOKEN_VARIABLE: doomed.token()}, tmp_path / "logs")
    spares = Workers(client, {**env, TOKEN_VARIABLE: spare.token()}, tmp_path / "logs")
    try:
        cut_off = fleet.start("doomed-1", 1, "--label", "pool=a", "--lease-ttl", "3", "--heartbeat", "1")
        script = 'if [ "$GPULAYER_ATTEMPT" = 1 ]; then sleep 120; fi; echo "ran attempt $GPULAYER_ATTEMPT"'
        job = client.submit(["sh", "-c", script], labels={"pool": "a"})
        wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run on doomed-1")
        other = client.submit(["sh", "-c", "sleep 2; echo untouched"], labels={"pool": "b"})
        spares.start("spare-1", 1, "--label", "pool=a")

        revoked = gpulayer(admin_env, "access", "revoke", "doomed")
        assert revoked.returncode == 0, revoked.stderr
        assert revoked.stdout == (
            "identity 'doomed' revoked: its Redis user is deleted; "
            "1 running job(s) went back to their queues\n"
        )
        with pytest.raises(redis.exceptions.AuthenticationError):
            connect(doomed.redis_url).ping()
        assert cut_off.wait(WAIT) is not None  # it found itself cut off, and stopped
        assert "Redis refused its user: identity doomed was revoked" in fleet.log("doomed-1")

        record = job.wait(WAIT)
        assert (record.state, record.worker, record.identity) == (JobState.SUCCEEDED, "spare-1", "spare")
        assert [(ended.outcome, ended.identity) for ended in record.attempts] == [
            ("lost", "doomed"), ("succeeded", "spare")
        ]  # fmt: skip
        assert [line.text for line in job.logs() if line.stream == "stdout"] == ["ran attempt 2"]
        # Nothing else was touched: the other worker ran its job, and is still there.
        assert other.wait(WAIT).state is JobState.SUCCEEDED
        assert bystander.poll() is None
        assert "bystander" in {worker.name for worker in client.workers()}
    finally:
        fleet.stop_all()
        spares.stop_all()


def test_an_expired_identitys_signatures_are_refused_and_its_worker_stops_taking_jobs(
    client: Client, admin_env: dict[str, str], env: dict[str, str], tmp_path: Path
) -> None:
    brief = add_identity(admin_env, "worker", "brief", "--expires", "8s")
    fleet = Workers(client, {**env, TOKEN_VARIABLE: brief.token()}, tmp_path / "logs")
    try:
        process = fleet.start("brief-1", 1)
        handle = gl.remote(square, client=client, source=tmp_path).remote(5)
        assert handle.result(timeout=WAIT) == 25  # while it is valid
        assert process.wait(WAIT) is not None  # it stops at its expiry, on its own
        assert "identity brief expired at" in fleet.log("brief-1")
        with pytest.raises(gl.UntrustedPayload, match="worker identity 'brief' expired at"):
            handle.result()
        # The next admin command removes its Redis user; the identity stays listed, as expired.
        listed = gpulayer(admin_env, "access", "list")
        assert listed.returncode == 0, listed.stderr
        [line] = [line for line in listed.stdout.splitlines() if line.startswith("brief ")]
        assert line.startswith("brief  worker  user gpulayer~brief  created ")
        assert "  expired  last seen " in line
        with pytest.raises(redis.exceptions.AuthenticationError):
            connect(brief.redis_url).ping()
    finally:
        fleet.stop_all()


def test_an_identity_record_forged_or_edited_in_the_registry_is_ignored(
    client: Client,
    workers: Workers,
    session_hub: Hub,
    raw_redis: redis.Redis,
    tmp_path: Path,
) -> None:
    workers.start("w1", 1)
    handle = gl.remote(square, client=client, source=tmp_path).remote(6)
    assert handle.result(timeout=WAIT) == 36
    attempt, registry = handle.job.status().attempt, client.keys.identities
    # A worker's (or any role's) Redis user may not write the registry at all: only the admin.
    with pytest.raises(redis.exceptions.NoPermissionError):
        connect(session_hub.worker.redis_url).hset(registry, "worker", "{}")
    genuine = raw_redis.hget(registry, "worker")
    assert genuine is not None
    record = json.loads(genuine)
    attacker = SigningKey.generate()
    edited = {**json.loads(record["record"]), "result_key": attacker.public.text}
    made, other = session_hub.installation.enrol("worker", "other")
    assert other.keyring.result_key is not None
    other_record = made.identities["other"].signed
    forgeries = [
        # Its result key swapped for the attacker's, the admin's signature kept.
        (json.dumps({"record": json.dumps(edited), "sig": record["sig"]}), attacker),
        # Signed by a key that is not the admin's.
        (sign_identity(SigningKey.generate(), Identity.model_validate(edited)), attacker),
        # Another identity's genuine record, filed under this name.
        (other_record, other.keyring.result_key),
    ]
    marker = tmp_path / "pwned"
    for forged, key in forgeries:
        raw_redis.hset(registry, "worker", forged)
        signed = sign_result(ResultSigner("worker", key), handle.id, attempt, RESULT, poison(marker))
        store_as(raw_redis, client, handle.id, RESULT, signed)
        with pytest.raises(
            gl.UntrustedPayload, match="worker identity 'worker' is not in the installation's registry"
        ):
            handle.result()
    assert not marker.exists()


# --- outputs -----------------------------------------------------------------------------------------
HOOK = ".git/hooks/pre-commit"


@pytest.mark.parametrize("role", ["submitter", "worker"])
def test_outputs_another_role_put_in_place_of_a_jobs_are_refused_by_gpulayer_outputs_and_the_api(
    role: str,
    client: Client,
    workers: Workers,
    installation: Installation,
    env: dict[str, str],
    http: FlaskClient,
    tokens: dict[str, str],
    tmp_path: Path,
) -> None:
    workers.start("w1", 1)
    job = client.submit(["sh", "-c", "echo data > result.txt"], outputs=["result.txt"])
    assert job.wait(WAIT).state is JobState.SUCCEEDED
    archive = tar_of({"result.txt": b"mine\n", HOOK: b"#!/bin/sh\ntouch pwned\n"})
    if role == "submitter":  # unsigned: a submitter holds no worker's key
        store_as(connect(installation.url("submitter")), client, job.id, OUTPUTS_ARCHIVE, archive)
        said = "Error: the job's outputs.tar.gz is not signed by a worker"
    else:  # signed by a worker, but not the one that ran the job
        intruder = enrol(installation, "worker", "intruder")
        assert intruder.keyring.result_key is not None
        signer = ResultSigner("intruder", intruder.keyring.result_key)

        def seal(sha256: str) -> str:
            return seal_archive(signer, job.id, 1, OUTPUTS_ARCHIVE, sha256)

        store_as(connect(intruder.redis_url), client, job.id, OUTPUTS_ARCHIVE, archive, seal=seal)
        said = "Error: the job's outputs.tar.gz is not signed by the worker that ran attempt 1"
    repo = tmp_path / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    done = gpulayer(env, "outputs", job.id, "--dest", str(repo))
    assert (done.returncode, done.stderr.strip()) == (1, said)
    assert sorted(path.name for path in repo.rglob("*")) == [".git", "hooks"]  # nothing written
    served = http.get(f"/api/v1/jobs/{job.id}/outputs", headers=auth(tokens["viewer"]))
    assert (served.status_code, served.json) == (502, {"error": said.removeprefix("Error: ")})


def test_outputs_signed_by_the_worker_that_ran_the_job_write_only_its_declared_outputs_inside_dest(
    client: Client, workers: Workers, session_hub: Hub, env: dict[str, str], tmp_path: Path
) -> None:
    workers.start("w1", 1)
    job = client.submit(["sh", "-c", "mkdir out && echo data > out/result.txt"], outputs=["out/*.txt"])
    record = job.wait(WAIT)
    assert record.state is JobState.SUCCEEDED
    # What that worker's key could sign (a worker taken over, or a job that reached its key): the
    # declared output, and beside it a hook, a file above the folder, and one at an absolute path.
    escape = tmp_path / "escaped"
    archive = tar_of({
        "out/result.txt": b"signed\n", HOOK: b"#!/bin/sh\n", "out/../../x": b"x", str(escape): b"x",
        "out/sub/y.txt": b"not declared: out/*.txt is one level",
    })  # fmt: skip
    key = session_hub.worker.keyring.result_key
    assert key is not None

    def seal(sha256: str) -> str:
        return seal_archive(ResultSigner("worker", key), job.id, record.attempt, OUTPUTS_ARCHIVE, sha256)

    store_as(connect(session_hub.worker.redis_url), client, job.id, OUTPUTS_ARCHIVE, archive, seal=seal)
    repo = tmp_path / "elsewhere" / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    done = gpulayer(env, "outputs", job.id, "--dest", str(repo))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(repo / "out" / "result.txt")]
    assert (repo / "out" / "result.txt").read_text() == "signed\n"
    written = tmp_path / "elsewhere"
    assert sorted(p.relative_to(written).as_posix() for p in written.rglob("*") if p.is_file()) == [
        "repo/out/result.txt"
    ]  # fmt: skip
    assert not escape.exists()


# --- checkpoints -------------------------------------------------------------------------------------
def test_a_checkpoint_no_worker_of_the_job_signed_is_not_restored(
    client: Client, workers: Workers, installation: Installation
) -> None:
    workers.start("w1", 1)
    counts = (
        'f="$GPULAYER_CHECKPOINT_DIR/tries"; echo x >> "$f"; n=$(wc -l < "$f"); echo "try $n"; [ "$n" -ge 3 ]'
    )
    job = client.submit(["sh", "-c", counts], retries=1, retry_on="exit", retry_delay=5)
    wait_for(lambda: job.status().attempts, what="the first attempt to end")
    # A submitter's Redis user plants a checkpoint that would make the next try pass.
    as_submitter = connect(installation.url("submitter"))
    planted = io.BytesIO(tar_of({"tries": b"x\nx\n"}))
    Stores.open(as_submitter, client.settings).artifacts.put_checkpoint(job.id, 9, planted, lambda sha: "{}")
    as_submitter.rename(client.keys.staged_checkpoint(job.id, 9), client.keys.checkpoint(job.id))
    record = job.wait(WAIT)
    assert record.state is JobState.FAILED
    lines = [line.text for line in job.logs()]
    assert [line for line in lines if line.startswith("try")] == ["try 1", "try 1"]
    assert any(
        line.startswith("the checkpoint folder an earlier attempt kept is not restored: the job's "
                        f"{CHECKPOINT_ARCHIVE} has a garbled signature") for line in lines
    )  # fmt: skip


def test_no_role_but_the_admin_writes_the_identity_registry(
    installation: Installation, session_hub: Hub, redis_url: str
) -> None:
    registry = installation.prefix + "#identities"
    roles: dict[str, Callable[[], str]] = {
        "web": lambda: installation.url("web"),
        "submitter": lambda: installation.url("submitter"),
        "viewer": lambda: installation.url("viewer"),
        "worker": lambda: session_hub.worker.redis_url,
    }
    session_hub.publish()
    for role, url in roles.items():
        connection = connect(url())
        assert connection.hget(registry, "worker") is not None, role  # every role reads it
        for command in [("HSET", registry, "worker", "{}"), ("DEL", registry), ("HDEL", registry, "worker")]:
            with pytest.raises(redis.exceptions.NoPermissionError):
                connection.execute_command(*command)
        connection.close()


def test_a_bad_taken_or_unknown_identity_name_is_one_line_and_changes_nothing(
    admin_env: dict[str, str], raw_redis: redis.Redis, tmp_path: Path
) -> None:
    kept = tmp_path / "admin-home" / "installation.json"

    def state() -> tuple[str, list[bytes], dict[bytes, bytes]]:
        return kept.read_text(), sorted(raw_redis.acl_users()), raw_redis.hgetall("gpulayer#identities")

    before = state()
    refusals = {
        ("add", "worker", "two words"): "Error: not a valid identity: name: String should match pattern",
        ("add", "worker", "worker"): "Error: an identity named 'worker' exists: revoke it first",
        ("add", "worker", "soon", "--expires", "0s"): "Error: an identity's lifetime must be positive",
        ("revoke", "ghost"): "Error: no identity named 'ghost' (`gpulayer access list` shows them)",
        ("export", "worker"): "Error: a worker's token is its own: `gpulayer access add worker NAME`",
    }
    for args, said in refusals.items():
        done = gpulayer(admin_env, "access", *args)
        assert done.returncode == 1, args
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(said), done.stderr
        assert done.stdout == ""
        assert state() == before
    # Redis out of reach: nothing made, nothing kept.
    text = kept.read_text()
    gone = json.loads(text)
    gone["endpoint"] = "redis://127.0.0.1:1/0"
    kept.write_text(json.dumps(gone))
    done = gpulayer(admin_env, "access", "add", "worker", "offline")
    assert done.returncode == 1
    assert done.stderr.startswith(
        "Error: cannot reach the installation's Redis at redis://gpulayer-admin:***@"
    )
    assert json.loads(kept.read_text())["identities"].keys() == gone["identities"].keys()
