"""Bad input: one line naming the problem, a non-zero exit, and nothing written to Redis."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import Result

from gpulayer import Client, InputNotFound, Settings, SourceError, errors
from gpulayer import access as accesses
from gpulayer.network import free_port

Cli = Callable[..., Result]


def one_line_error(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0].removeprefix("Error: ")


def test_an_unreachable_redis_is_one_line_naming_it(cli: Cli) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (
        ["jobs"],
        ["submit", "--redis-url", url, "--", "true"],
        ["status", "abc"],
        ["worker", "start"],
    ):
        result = cli(*args, "--redis-url", url) if "--" not in args else cli(*args)
        assert result.exit_code == 1
        assert one_line_error(result).startswith(f"cannot reach Redis at {url}: ")


def test_the_password_in_a_url_is_never_printed(cli: Cli) -> None:
    result = cli("jobs", "--redis-url", f"redis://:sekrit@127.0.0.1:{free_port()}/0")
    assert "sekrit" not in result.output
    assert ":***@127.0.0.1" in one_line_error(result)


def test_no_installation_known_says_how_to_get_one(cli: Cli, env: dict[str, str], tmp_path: Path) -> None:
    env["GPULAYER_HOME"] = str(tmp_path / "empty-home")
    result = cli("jobs")
    assert result.exit_code == 1
    assert one_line_error(result).startswith("no installation to talk to: run `gpulayer up`")


def test_a_command_beyond_this_machines_role_says_which_role_it_needs(
    cli: Cli, env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    submitter = accesses.load(home, "submitter")
    assert submitter is not None
    accesses.save(tmp_path / "laptop", submitter)
    env["GPULAYER_HOME"] = str(tmp_path / "laptop")
    result = cli("token", "list")
    assert result.exit_code == 1
    assert one_line_error(result).startswith(
        "this needs the admin or web role's access; this machine holds only the submitter role's"
    )


def test_a_missing_source_folder_is_named_and_nothing_is_written(
    cli: Cli, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    result = cli("submit", "--source", str(tmp_path / "nope"), "--", "true")
    assert result.exit_code == 1
    assert one_line_error(result) == f"source folder not found: {tmp_path / 'nope'}"
    assert raw_redis.dbsize() == 0


def test_a_missing_input_is_named_and_nothing_is_written(
    cli: Cli, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    result = cli("submit", "--input", str(tmp_path / "data.csv"), "--", "true")
    assert result.exit_code == 1
    assert one_line_error(result) == f"input not found: {tmp_path / 'data.csv'}"
    assert raw_redis.dbsize() == 0


@pytest.mark.parametrize("command", [[], [""], ["  "]])
def test_an_empty_command_is_refused(cli: Cli, raw_redis: redis.Redis, command: list[str]) -> None:
    result = cli("submit", "--", *command)
    assert result.exit_code == 2
    assert one_line_error(result) == "invalid job: command: the command is empty"
    assert raw_redis.dbsize() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "1BAD=x"], "invalid job: --env: '1BAD' is not a valid environment variable name"),
        (
            ["--env", "GPULAYER_JOB_ID=x"],
            "invalid job: --env: GPULAYER_JOB_ID is set by the worker for each job; "
            "a job's env may not set it",
        ),
        (
            ["--output", "/etc/passwd"],
            "invalid job: --output: output '/etc/passwd' must be a path inside the "
            "job's folder (relative, no '..')",
        ),
        (
            ["--output", "../up.txt"],
            "invalid job: --output: output '../up.txt' must be a path inside the "
            "job's folder (relative, no '..')",
        ),
    ],
)
def test_an_invalid_job_is_one_line_and_writes_nothing(
    cli: Cli, raw_redis: redis.Redis, args: list[str], message: str
) -> None:
    result = cli("submit", *args, "--", "true")
    assert result.exit_code == 2
    assert one_line_error(result) == message
    assert raw_redis.dbsize() == 0


def test_an_unknown_job_id_is_named_by_every_command(cli: Cli, tmp_path: Path) -> None:
    for args in (
        ["status", "feedbeef"],
        ["logs", "feedbeef"],
        ["wait", "feedbeef"],
        ["cancel", "feedbeef"],
        ["outputs", "feedbeef", "--dest", str(tmp_path)],
    ):
        result = cli(*args)
        assert result.exit_code == 1, args
        assert one_line_error(result) == "no job 'feedbeef' (never submitted, or past its retention)"


def test_outputs_of_a_job_that_did_not_produce_them_exits_non_zero(
    client: Client,
    workers,
    cli: Cli,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    workers.start()
    job = client.submit(["true"], outputs=["model.pt"])
    job.wait(30)
    result = cli("outputs", job.id, "--dest", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert one_line_error(result) == "output not produced: model.pt"


def test_outputs_of_a_job_still_queued_says_so(client: Client, cli: Cli, tmp_path: Path) -> None:
    job = client.submit(["true"], outputs=["x"])
    result = cli("outputs", job.id, "--dest", str(tmp_path))
    assert result.exit_code == 1
    assert one_line_error(result) == f"job {job.id} is queued; outputs are uploaded when it ends"


def test_a_source_folder_over_the_cap_is_refused_before_anything_is_sent(
    redis_url: str, home: Path, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"\0" * 5000)
    (source / ".gitignore").write_text("*.ckpt\n")
    (source / "old.ckpt").write_bytes(b"\0" * 50_000)
    client = Client(redis_url, settings=Settings(home=home, max_source_bytes=4000))
    with pytest.raises(SourceError, match=r"holds 4\.9 KiB after the ignore rules, above the 3\.9 KiB cap"):
        client.submit(["true"], source=source)
    assert raw_redis.dbsize() == 0
    # What .gitignore ignores does not count.
    Client(redis_url, settings=Settings(home=home, max_source_bytes=6000)).submit(["true"], source=source)


def test_a_submit_that_fails_midway_leaves_nothing_in_redis(
    client: Client, raw_redis: redis.Redis, tmp_path: Path
) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(__import__("os").urandom(8 * 1024 * 1024))
    used = int(raw_redis.info("memory")["used_memory"])
    raw_redis.config_set("maxmemory", used + 2 * 1024 * 1024)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.submit(["true"], inputs=[data])
    finally:
        raw_redis.config_set("maxmemory", 0)
    assert raw_redis.dbsize() == 0


def test_two_inputs_with_one_name_are_refused(client: Client, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.csv").write_text("1")
    (tmp_path / "b" / "x.csv").write_text("2")
    with pytest.raises(InputNotFound, match=r"two inputs are named 'x\.csv'"):
        client.submit(["true"], inputs=[tmp_path / "a" / "x.csv", tmp_path / "b" / "x.csv"])


def test_revoking_a_token_that_does_not_exist_exits_as_a_token_error_did(cli: Cli) -> None:
    result = cli("token", "revoke", "ghost")
    assert result.exit_code == 2
    assert one_line_error(result) == "no token named 'ghost'"


#: A row of the tree drawn in ``gpulayer/errors.py``: the branches, the name, exit code, status and what
#: it is (where a second base is named: "also a TokenError").
_ROW = re.compile(
    r"^    (?P<branches>[│├└─ ]*)(?P<name>[A-Z]\w+) +(?P<exit>\d+) +(?P<status>\d+)  (?P<about>.*)$"
)

#: A class as the tree draws it: its bases (the one it is drawn under first), exit code and status.
Drawn = tuple[tuple[str, ...], int, int]


def drawn_tree() -> dict[str, Drawn]:
    """Each class the docstring of ``gpulayer.errors`` draws."""
    drawn: dict[str, Drawn] = {}
    ancestors: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        row = _ROW.match(line)
        if row is None:
            continue
        depth = len(row["branches"]) // 4  # each level indents by "│   " or "├── "
        ancestors[depth:] = [row["name"]]
        bases = (ancestors[depth - 1],) if depth else ()
        bases += tuple(re.findall(r"also an? (\w+)", row["about"]))
        drawn[row["name"]] = (bases, int(row["exit"]), int(row["status"]))
    return drawn


def test_the_drawn_error_tree_is_the_class_tree() -> None:
    actual = {
        name: (
            tuple(base.__name__ for base in error.__bases__ if base is not Exception),
            error.exit_code,
            error.http_status,
        )
        for name, error in vars(errors).items()
        if isinstance(error, type) and issubclass(error, errors.GpulayerError)
    }
    assert drawn_tree() == actual


def test_the_statuses_scripts_and_http_clients_rely_on_stay() -> None:
    # What scripts and HTTP clients rely on: moving an error to another group must not change it.
    kept = {
        errors.InvalidJobSpec: (2, 400),
        errors.TokenError: (2, 400),
        errors.TokenNotFound: (2, 404),
        errors.SourceError: (1, 400),
        errors.ArtifactTooLarge: (1, 413),
        errors.JobNotFound: (1, 404),
        errors.OutputNotProduced: (1, 409),
        errors.WaitTimeout: (75, 503),
        errors.UntrustedPayload: (1, 502),
        errors.RedisUnavailable: (1, 503),
    }
    assert {error: (error.exit_code, error.http_status) for error in kept} == kept
