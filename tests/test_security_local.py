"""The red-team suite, on a machine: what `gpulayer up` leaves on disk and on process listings, what
`join` takes its token from, and Redis over TLS when other machines may reach it."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psutil
import pytest
import redis

from gpulayer import access as accesses
from gpulayer.installation import Installation
from gpulayer.store.connection import connect
from gpulayer.tls import ensure
from tests.conftest import WAIT, gpulayer


def up(env: dict[str, str], *args: str) -> tuple[Path, Installation]:
    done = gpulayer(env, "up", "--name", "box", "--slots", "1", *args)
    assert done.returncode == 0, done.stderr
    home = Path(env["GPULAYER_HOME"])
    return home, Installation.model_validate_json((home / "installation.json").read_text())


def secrets_of(installation: Installation, home: Path) -> list[str]:
    """The installation's, and those of the local worker's identity."""
    worker = accesses.load(home, "worker")
    assert worker is not None
    password = urlsplit(worker.redis_url).password or ""
    return [*installation.passwords.values(), *installation.keys.values(), *worker.keys.values(), password]


def add_worker(env: dict[str, str], name: str) -> accesses.Access:
    """A worker identity of its own for another machine, as the admin makes one."""
    done = gpulayer(env, "access", "add", "worker", name)
    assert done.returncode == 0, done.stderr
    return accesses.Access.from_token(done.stdout.strip())


def test_up_keeps_everything_it_writes_readable_by_its_owner_only(up_env: dict[str, str]) -> None:
    home, installation = up(up_env)
    assert gpulayer(up_env, "submit", "--wait", "--", "true").returncode == 0
    found = 0
    for path in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, f"{path} is {oct(mode)}"
        else:
            assert mode == 0o600, f"{path} is {oct(mode)}"
            found += 1
    names = {path.name for path in home.rglob("*")}
    # Among them: the installation, each role's access, Redis's config, users, log and append-only file.
    assert {"installation.json", "admin.json", "worker.json", "redis.conf", "users.acl", "redis.log"} <= names
    assert any(name.startswith("appendonly") for name in names)
    assert found > 10
    # No password in Redis's files in the clear: the ACL file holds their hashes.
    users = (home / "redis" / "users.acl").read_text()
    assert not any(secret in users for secret in secrets_of(installation, home))
    assert "user gpulayer~box " in users  # the local worker's identity, saved as `up` made it


def test_nothing_up_starts_has_a_secret_on_its_command_line_or_in_its_environment(
    up_env: dict[str, str],
) -> None:
    home, installation = up(up_env)
    state = json.loads((home / "server.json").read_text())
    secrets = secrets_of(installation, home)
    for key in ("redis_pid", "worker_pid", "web_pid"):
        process = psutil.Process(state[key])
        listed = " ".join(process.cmdline()) + " " + json.dumps(process.environ())
        assert not any(secret in listed for secret in secrets), key


def test_a_source_folder_holding_the_home_ships_none_of_it_nor_any_installations_keys(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    """`GPULAYER_HOME` inside the folder shipped (here the home `up` made is in it), and a copy of a
    home's keys elsewhere in it: a job listing and printing every file it got finds none of them."""
    home, installation = up(up_env)
    assert home.parent == tmp_path
    backup = tmp_path / "backup"
    shutil.copytree(home / "access", backup / "access")
    shutil.copy(home / "installation.json", backup / "installation.json")
    (backup / "readme.txt").write_text("kept\n")
    (tmp_path / "project.txt").write_text("shipped\n")
    everything = "find . -type f | sort; find . -type f | sort | xargs cat"
    done = gpulayer(up_env, "submit", "--source", str(tmp_path), "--wait", "--", "sh", "-c", everything)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["./backup/readme.txt", "./project.txt", "kept", "shipped"]
    [job_id] = [line.split()[1] for line in done.stderr.splitlines() if line.endswith(" queued")]
    logs = gpulayer(up_env, "logs", job_id)
    for secret in secrets_of(installation, home):
        assert secret not in done.stdout + done.stderr + logs.stdout + logs.stderr


def test_join_takes_its_token_from_stdin_a_file_or_the_environment_and_never_argv(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    _, installation = up(up_env)
    token = add_worker(up_env, "joiner").token()
    machine = {**up_env, "GPULAYER_HOME": str(tmp_path / "other-machine")}
    token_file = tmp_path / "join.token"
    token_file.write_text(token + "\n")
    ways = [
        (["--token-file", "-"], token, {}),
        (["--token-file", str(token_file)], None, {}),
        ([], None, {accesses.TOKEN_VARIABLE: token}),
    ]
    for index, (args, stdin, extra) in enumerate(ways):
        done = gpulayer(
            {**machine, **extra}, "join", *args, "--name", f"joined-{index}", "--burst", input=stdin
        )
        assert done.returncode == 0, done.stderr
        assert "joined as worker (Redis user gpulayer~joiner" in done.stderr
    kept = tmp_path / "other-machine" / "access" / "worker.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # Once kept, a later join needs nothing.
    assert gpulayer(machine, "join", "--name", "joined-again", "--burst").returncode == 0
    # A token of another role is no worker's.
    submitter = installation.access("submitter").token()
    refused = gpulayer({**machine, accesses.TOKEN_VARIABLE: submitter}, "join", "--burst")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "Error: this access token is a submitter's, not a worker's"


def test_a_damaged_access_token_is_one_line(up_env: dict[str, str], tmp_path: Path) -> None:
    machine = {**up_env, "GPULAYER_HOME": str(tmp_path / "other-machine")}
    for token, said in [
        ("redis://:pw@host:6379/0", "not a GPUlayer access token (they start with gla1_)"),
        ("gla1_eyJyb2xlIjoid29y", "the access token is damaged (cut short when copied?)"),
    ]:
        done = gpulayer({**machine, accesses.TOKEN_VARIABLE: token}, "join", "--burst")
        assert done.returncode == 1
        assert done.stderr.strip() == f"Error: {said}"


def test_up_for_other_machines_serves_redis_over_tls_only_and_pins_its_own_ca(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    _, installation = up(up_env, "--bind", "0.0.0.0")
    assert installation.endpoint.startswith("rediss://")
    port = int(installation.endpoint.rsplit(":", 1)[1].split("/")[0])
    worker = add_worker(up_env, "remote")
    assert worker.redis_url.startswith("rediss://")
    assert worker.ca == installation.ca
    # Over TLS with the installation's CA: in. Plain TCP, or TLS trusting any other CA: out.
    assert connect(worker.redis_url, ca=worker.ca).ping()
    user = urlsplit(worker.redis_url)
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(port=port, username=unquote(user.username or ""), password=user.password).ping()
    other_ca = ensure(tmp_path / "elsewhere", ["localhost"]).ca.read_text()
    with pytest.raises(redis.exceptions.ConnectionError):
        connect(worker.redis_url, ca=other_ca).ping()
    with pytest.raises(redis.exceptions.ConnectionError):
        connect(worker.redis_url).ping()  # the system's CAs know nothing of it
    # And everything works over it: the local worker runs a job.
    done = gpulayer(up_env, "submit", "--wait", "--", "echo", "over tls")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "over tls\n"
    joined = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "join", "--name", "remote", "--burst"],
        env={**up_env, "GPULAYER_HOME": str(tmp_path / "remote"), accesses.TOKEN_VARIABLE: worker.token()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert joined.wait(WAIT) == 0  # a worker of another machine's joined, over TLS, and left
