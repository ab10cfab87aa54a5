"""`gpulayer up` and `down` on the embedded default: a real redis-server with an append-only file,
a local worker in the background, and every other command finding them without flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil

from gpulayer import access as accesses
from gpulayer import home as local
from gpulayer.server import redis_server_binary
from gpulayer.signing import SigningKey
from tests.conftest import gpulayer


def test_up_starts_an_embedded_redis_and_a_worker_that_other_commands_find(up_env: dict[str, str]) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    up = gpulayer(up_env, "up", "--name", "laptop", "--slots", "2")
    assert up.returncode == 0, up.stderr
    assert "GPUlayer is up." in up.stdout
    state = json.loads((home / "server.json").read_text())
    installation = json.loads((home / "installation.json").read_text())
    # Another machine gets an identity of its own: `up` says how, and prints no password.
    assert any(line.endswith(" access add worker NAME") for line in up.stdout.splitlines())
    for role in ("admin", "web", "submitter", "viewer"):
        assert installation["passwords"][role] not in up.stdout
    # The local worker runs under one, named after it.
    assert installation["identities"]["laptop"]["identity"]["role"] == "worker"
    local_worker = accesses.load(home, "worker")
    assert local_worker is not None
    assert local_worker.identity == "laptop"
    added = gpulayer(up_env, "access", "add", "worker", "gpu2")
    assert added.returncode == 0, added.stderr
    worker = accesses.Access.from_token(added.stdout.strip())
    assert (worker.role, worker.identity) == ("worker", "gpu2")
    assert worker.redis_url.startswith("redis://gpulayer~gpu2:")
    assert "GPULAYER_ACCESS_TOKEN=<token> gpulayer join" in added.stderr

    redis_process = psutil.Process(state["redis_pid"])
    assert redis_process.exe() == os.path.realpath(redis_server_binary())
    config = (home / "redis" / "redis.conf").read_text().splitlines()
    for line in ("appendonly yes", "appendfsync everysec", "bind 127.0.0.1", f"dir {home / 'redis'}"):
        assert line in config
    assert f"aclfile {home / 'redis' / 'users.acl'}" in config

    run = gpulayer(up_env, "submit", "--wait", "--", "echo", "hello from up")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hello from up\n"
    jobs = gpulayer(up_env, "jobs", "--json")
    assert [job["worker"] for job in json.loads(jobs.stdout)] == ["laptop"]

    again = gpulayer(up_env, "up")
    assert again.returncode == 0
    assert "already up" in again.stdout

    # The API answers, with the admin token `up` printed (once: not again above).
    token = up.stdout.split("An admin token for the API and dashboard")[1].split()[-1]
    assert token.startswith("glt_")
    assert token not in again.stdout
    request = urllib.request.Request(
        f"http://127.0.0.1:{state['web_port']}/api/v1/workers", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert [worker["name"] for worker in json.load(response)["workers"]] == ["laptop"]
    # So does the dashboard, which `gpulayer dashboard` names.
    dashboard = gpulayer(up_env, "dashboard", "--print")
    assert dashboard.stdout == f"http://127.0.0.1:{state['web_port']}/\n"
    with urllib.request.urlopen(dashboard.stdout.strip(), timeout=10) as response:
        assert b'<script type="module"' in response.read()


def test_down_stops_both_and_the_next_up_finds_the_jobs_again(up_env: dict[str, str]) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    assert gpulayer(up_env, "up").returncode == 0
    job_id = gpulayer(up_env, "submit", "--", "true").stdout.strip()
    assert gpulayer(up_env, "wait", job_id).returncode == 0
    pids = [
        json.loads((home / "server.json").read_text())[key] for key in ("redis_pid", "worker_pid", "web_pid")
    ]

    down = gpulayer(up_env, "down")
    assert down.returncode == 0, down.stderr
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)
    after = gpulayer(up_env, "jobs")
    assert after.returncode == 1
    assert gpulayer(up_env, "dashboard").stderr.startswith("Error: no dashboard is served from this machine")
    assert after.stderr.strip() == (
        "Error: the Redis that `gpulayer up` started is not running: run `gpulayer up` again"
    )

    assert gpulayer(up_env, "up").returncode == 0
    status = json.loads(gpulayer(up_env, "status", job_id, "--json").stdout)
    assert status["state"] == "succeeded"


def test_up_after_its_worker_died_keeps_the_web_server_and_down_stops_it(up_env: dict[str, str]) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    assert gpulayer(up_env, "up", "--name", "laptop").returncode == 0
    first = json.loads((home / "server.json").read_text())
    psutil.Process(first["worker_pid"]).kill()
    psutil.Process(first["worker_pid"]).wait(10)

    changed = gpulayer(up_env, "up", "--slots", "3")
    assert changed.returncode == 1
    assert changed.stderr == (
        "Error: part of GPUlayer still runs here: run `gpulayer down` first to change it\n"
    )
    again = gpulayer(up_env, "up")
    assert again.returncode == 0, again.stderr
    second = json.loads((home / "server.json").read_text())
    assert (second["web_pid"], second["web_port"], second["redis_pid"]) == (
        first["web_pid"], first["web_port"], first["redis_pid"]
    )  # fmt: skip
    assert second["worker_pid"] != first["worker_pid"]
    assert second["worker_name"] == "laptop"
    assert gpulayer(up_env, "submit", "--wait", "--", "true").returncode == 0

    assert gpulayer(up_env, "down").returncode == 0
    assert not any(local.alive(second[key]) for key in ("redis_pid", "worker_pid", "web_pid"))


def test_an_installation_from_before_identities_is_brought_up_to_date_by_the_next_up(
    up_env: dict[str, str],
) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    assert gpulayer(up_env, "up", "--name", "old").returncode == 0
    assert gpulayer(up_env, "down").returncode == 0
    # As it was kept before each machine had an identity: a worker user and a result key all shared.
    kept = json.loads((home / "installation.json").read_text())
    shared = SigningKey.generate()
    kept["keys"] = {
        "job_key": kept["keys"]["job_key"],
        "job_verify": kept["keys"]["job_verify"],
        "result_key": shared.text,
        "result_verify": shared.public.text,
    }
    kept["passwords"]["worker"], kept["identities"] = "shared-password", {}
    (home / "installation.json").write_text(json.dumps(kept))
    worker = accesses.load(home, "worker")
    assert worker is not None
    url = worker.redis_url.replace("gpulayer~old:", "gpulayer-worker:", 1).split("@", 1)[1]
    legacy = {"role": "worker", "redis_url": f"redis://gpulayer-worker:shared-password@{url}", "keys": {}}
    (home / "access" / "worker.json").write_text(json.dumps(legacy))

    again = gpulayer(up_env, "up", "--name", "old")
    assert again.returncode == 0, again.stderr
    upgraded = json.loads((home / "installation.json").read_text())
    assert {"identity_key", "identity_verify"} <= set(upgraded["keys"])
    assert not {"result_key", "result_verify"} & set(upgraded["keys"])
    assert "worker" not in upgraded["passwords"]
    assert accesses.load(home, "worker").identity == "old"  # type: ignore[union-attr]
    admin = accesses.load(home, "admin")
    assert admin is not None
    assert "identity_key" in admin.keys
    assert "user gpulayer-worker " not in (home / "redis" / "users.acl").read_text()
    run = gpulayer(up_env, "submit", "--wait", "--", "echo", "upgraded")
    assert (run.returncode, run.stdout) == (0, "upgraded\n")


def test_up_from_a_folder_that_holds_a_gpulayer_folder_starts_the_installed_package(
    up_env: dict[str, str], tmp_path: Path
) -> None:
    # A checkout's parent: its gpulayer/ would be what `python -m gpulayer` imports, from the current folder.
    shadow = tmp_path / "parent" / "gpulayer"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise SystemExit('the shadowing gpulayer/ was imported')\n")
    (shadow / "__main__.py").write_text("")
    script = Path(sys.executable).with_name("gpulayer")  # the console script: PATH's gpulayer
    up = subprocess.run(
        [str(script), "up", "--slots", "1"],
        env=up_env,
        cwd=shadow.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stderr + up.stdout
    run = gpulayer(up_env, "submit", "--wait", "--", "echo", "not shadowed", cwd=tmp_path)
    assert run.stdout == "not shadowed\n", run.stderr
