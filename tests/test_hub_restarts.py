"""The roles of an installation on a Redis of the user's own outlive its restarts: `access init --apply`
keeps the users where that Redis can (its config file, here), and `access apply` makes them again on a
Redis that lost them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gpulayer import Client
from gpulayer import access as accesses
from gpulayer.models import JobState
from gpulayer.network import free_port
from gpulayer.server import redis_server_binary, shutdown_redis, start_redis, wait_ready
from tests.conftest import WAIT, gpulayer


class OwnRedis:
    """A Redis the user runs from a config file (no ACL file), its data in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port, self.binary = folder, free_port(), redis_server_binary()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process = start_redis(folder, self.port, durable=True, binary=self.binary)
        wait_ready(self.url, self.process)

    def restart(self, admin_url: str, ready_url: str | None = None) -> None:
        """SHUTDOWN (its append-only file synced), then the same binary, config file and data again,
        until ``ready_url`` (the admin's) answers."""
        shutdown_redis(admin_url)
        self.process.wait(10)
        self.process = subprocess.Popen(
            [self.binary, str(self.folder / "redis.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(ready_url or admin_url, self.process)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    started = OwnRedis(tmp_path / "redis")
    yield started
    started.stop()


def every_role_runs_a_job(home: Path, env: dict[str, str], tmp_path: Path, worker: str) -> None:
    """A submitter submits, a worker joined under an identity of its own runs it, and the viewer, the
    web role and the admin each read it."""
    added = gpulayer(env, "access", "add", "worker", worker)
    assert added.returncode == 0, added.stderr
    worker_home = tmp_path / f"{worker}-home"
    accesses.save(worker_home, accesses.Access.from_token(added.stdout.strip()))
    clients = {
        role: Client(access=accesses.load(home, role)) for role in ("submitter", "viewer", "web", "admin")
    }
    try:
        job = clients["submitter"].submit(["echo", "after the restart"])
        ran = gpulayer({**env, "GPULAYER_HOME": str(worker_home)}, "worker", "start", "--burst")
        assert ran.returncode == 0, ran.stderr
        record = job.wait(WAIT)
        assert (record.state, record.identity) == (JobState.SUCCEEDED, worker)
        for role in ("viewer", "web", "admin"):
            assert clients[role].get(job.id).status().state is JobState.SUCCEEDED, role
    finally:
        for client in clients.values():
            client.close()


def test_access_init_apply_keeps_the_roles_in_the_config_file_across_a_restart(
    own_redis: OwnRedis, tmp_path: Path, env: dict[str, str]
) -> None:
    home = tmp_path / "admin-home"
    admin_env = {**env, "GPULAYER_HOME": str(home)}
    made = gpulayer(admin_env, "access", "init", "--redis-url", own_redis.url, "--apply")
    assert made.returncode == 0, made.stderr
    assert "note:" not in made.stderr  # kept: nothing to warn about
    config = (own_redis.folder / "redis.conf").read_text()
    assert config.count("\nuser gpulayer-") == 4
    admin = accesses.load(home, "admin")
    assert admin is not None

    own_redis.restart(admin.redis_url)

    every_role_runs_a_job(home, admin_env, tmp_path, "after-restart")


def test_access_apply_with_a_login_url_brings_every_role_back_to_a_redis_that_lost_them(
    own_redis: OwnRedis, tmp_path: Path, env: dict[str, str]
) -> None:
    home = tmp_path / "admin-home"
    admin_env = {**env, "GPULAYER_HOME": str(home)}
    assert gpulayer(admin_env, "access", "init", "--redis-url", own_redis.url, "--apply").returncode == 0
    added = gpulayer(admin_env, "access", "add", "worker", "kept")
    assert added.returncode == 0, added.stderr
    admin = accesses.load(home, "admin")
    assert admin is not None
    # Restarted from a config file that never held them (as its operator's own file would be).
    (own_redis.folder / "redis.conf").write_text(
        "".join(line + "\n" for line in (own_redis.folder / "redis.conf").read_text().splitlines()
                if not line.startswith("user "))
    )  # fmt: skip
    own_redis.restart(admin.redis_url, own_redis.url)  # the default user's, with no password yet
    default = redis.Redis.from_url(own_redis.url)
    default.execute_command("ACL", "SETUSER", "default", ">their-own-password")
    default.close()
    assert not any(
        line.startswith("user gpulayer")
        for line in (own_redis.folder / "redis.conf").read_text().splitlines()
    )

    locked = gpulayer(admin_env, "access", "apply")
    assert locked.returncode == 1
    assert len(locked.stderr.splitlines()) == 1
    assert "refused its admin" in locked.stderr
    assert "gpulayer access apply --redis-url" in locked.stderr
    wrong = gpulayer(admin_env, "access", "apply", "--redis-url", own_redis.url.replace("/0", "/3"))
    assert (wrong.returncode, len(wrong.stderr.splitlines())) == (1, 1)
    assert "names database '3'" in wrong.stderr

    login = f"redis://default:their-own-password@127.0.0.1:{own_redis.port}"
    for _ in range(2):  # idempotent
        applied = gpulayer(admin_env, "access", "apply", "--redis-url", login)
        assert applied.returncode == 0, applied.stderr
        assert "note:" not in applied.stderr
    assert gpulayer(admin_env, "access", "list").stdout.startswith("kept  worker  user gpulayer~kept ")

    own_redis.restart(admin.redis_url)  # kept this time: in the config file

    every_role_runs_a_job(home, admin_env, tmp_path, "after-apply")


def test_a_redis_that_cannot_keep_its_users_is_said_in_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    process = subprocess.Popen(  # no config file: nowhere to keep users
        [
            redis_server_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(url, process)
        made = gpulayer(
            {**env, "GPULAYER_HOME": str(tmp_path / "home")}, "access", "init", "--redis-url", url, "--apply"
        )
        assert made.returncode == 0, made.stderr  # made, and working until Redis restarts
        notes = [line for line in made.stderr.splitlines() if line.startswith("note:")]
        assert len(notes) == 1
        assert "cannot keep its users across a restart" in notes[0]
        assert "gpulayer access apply --redis-url ADMIN_URL" in notes[0]
        assert "docs/security.md" in notes[0]
    finally:
        process.kill()
        process.wait(10)
