"""The command line as a newcomer meets it (issue 17): docs/cli.md names every command and exactly
those that take ``--redis-url``; a bad Redis URL or setting is one line; the server's banner is one
plain line; outputs come back at their paths in the job's folder, or, where they cannot be written,
not at all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import click
import pytest
from click.testing import Result

from gpulayer import Client, JobState
from gpulayer import access as accesses
from gpulayer.cli import main
from gpulayer.installation import Installation
from gpulayer.network import free_port

from .conftest import WAIT, Workers, gpulayer

CLI_DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def commands(group: click.Group = main, words: tuple[str, ...] = ()) -> dict[str, click.Command]:
    """Every command a user runs, by its words (``worker stop``): groups walked down to their leaves."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(commands(command, (*words, name)))
        else:
            found[" ".join((*words, name))] = command
    return found


def takes_redis_url(command: click.Command) -> bool:
    return any("--redis-url" in param.opts for param in command.params)


def run(
    env: dict[str, str], *args: str, cwd: Path | None = None, unprivileged: bool = False
) -> subprocess.CompletedProcess[str]:
    """``gpulayer ARGS`` as a process; ``unprivileged``: as root, without the capabilities that let root
    write where file modes say it may not (as any other user runs it)."""
    prefix: list[str] = []
    if unprivileged and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and no setpriv to drop root's file capabilities")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    return gpulayer(env, *args, cwd=cwd, prefix=prefix)


@pytest.fixture
def bare_env(tmp_path: Path) -> dict[str, str]:
    """A machine that holds nothing of GPUlayer's: what fails here fails before Redis is asked."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")
    return env


# --- docs/cli.md ------------------------------------------------------------------------------------
def test_the_command_list_of_docs_cli_names_every_command_and_only_those() -> None:
    text = CLI_DOC.read_text()
    listing = text.split("\nCommands: ", 1)[1].split("\n\n", 1)[0]
    links = dict(re.findall(r"\[`([^`]+)`\]\(#([a-z0-9-]+)\)", listing))
    assert sorted(links) == sorted(commands())
    sections = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^## (.+)$", text, re.MULTILINE)
    }
    assert set(links.values()) <= sections, "each command links to its section"


def test_docs_cli_names_exactly_the_commands_without_redis_url() -> None:
    text = " ".join(CLI_DOC.read_text().split())
    exceptions = text.split("Every command takes it but ", 1)[1].split(", which", 1)[0]
    without = {words for words, command in commands().items() if not takes_redis_url(command)}
    assert set(re.findall(r"`([^`]+)`", exceptions)) == without


# --- a bad Redis URL or setting: one line ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://localhost:99999/0", "its port 99999 is over 65535"),
        ("redis://localhost:abc/0", "its port 'abc' is not a number"),
    ],
)
@pytest.mark.parametrize(
    "args",
    [
        ["jobs", "--redis-url", "URL"],
        ["submit", "--redis-url", "URL", "--", "true"],
        ["worker", "start", "--redis-url", "URL"],
        ["up", "--redis-url", "URL"],
        ["access", "init", "--redis-url", "URL"],
        ["status", "0123456789ab"],  # the URL from GPULAYER_REDIS_URL
    ],
)
def test_a_bad_port_in_a_redis_url_is_one_line_and_nothing_is_started(
    bare_env: dict[str, str], tmp_path: Path, url: str, why: str, args: list[str]
) -> None:
    env = {**bare_env, "GPULAYER_REDIS_URL": url} if "URL" not in args else bare_env
    done = run(env, *[url if arg == "URL" else arg for arg in args])
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: not a Redis URL: {url} ({why})\n"
    assert not (tmp_path / "home" / "installation.json").exists()
    assert not (tmp_path / "home" / "server.json").exists()


def test_a_redis_urls_password_stays_out_of_its_error(bare_env: dict[str, str]) -> None:
    done = run(bare_env, "jobs", "--redis-url", "redis://me:s3cret@db:70000/0")
    assert done.stderr == "Error: not a Redis URL: redis://me:***@db:70000/0 (its port 70000 is over 65535)\n"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "GPULAYER_LOG_MAX_LINES",
            "lots",
            "GPULAYER_LOG_MAX_LINES: not a whole number: 'lots' (examples: 500, 10000)",
        ),
        ("GPULAYER_LOG_MAX_LINES", "0", "GPULAYER_LOG_MAX_LINES must be above 0, not 0"),
        (
            "GPULAYER_MAX_JOB_BYTES",
            "huge",
            "GPULAYER_MAX_JOB_BYTES: not a size: 'huge' (examples: 512MB, 24GB, 1GiB)",
        ),
    ],
)
@pytest.mark.parametrize("args", [["jobs"], ["worker", "start"], ["dashboard", "--print"]])
def test_a_bad_setting_is_one_line_naming_its_variable(
    bare_env: dict[str, str], variable: str, value: str, message: str, args: list[str]
) -> None:
    done = run({**bare_env, variable: value}, *args)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"Error: {message}\n")


# --- gpulayer server ----------------------------------------------------------------------------------
def test_the_servers_banner_is_one_plain_line(env: dict[str, str], installation: Installation) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        banner = server.stderr.readline()
    finally:
        server.terminate()
        server.wait(WAIT)
    redis = urlsplit(installation.url("web"))
    assert banner == (
        f"serving the GPUlayer API and dashboard on http://127.0.0.1:{port}/, as web "
        f"(Redis user {redis.username} at redis://127.0.0.1:{redis.port})\n"
    )


def test_an_access_is_described_in_words_whatever_its_url() -> None:
    def described(url: str) -> str:
        return accesses.describe(accesses.Access(redis_url=url))

    assert described("unix:///run/redis.sock") == "a bare URL (Redis user default at unix:///run/redis.sock)"
    assert described("redis://me:pw@[::1]:6380/0") == "a bare URL (Redis user me at redis://[::1]:6380)"
    assert described("rediss://db/0") == "a bare URL (Redis user default at rediss://db:6379, TLS)"


# --- gpulayer outputs ---------------------------------------------------------------------------------
MAKES_OUTPUTS = "mkdir results && echo a > results/a.txt && echo top > top.txt"


def finished_job(env: dict[str, str], client: Client, workers: Workers) -> str:
    """A job that made ``results/a.txt`` and ``top.txt`` and declared ``results/*`` and ``top.txt``."""
    workers.start("w1", 1)
    submitted = run(
        env, "submit", "--output", "results/*", "--output", "top.txt", "--", "sh", "-c", MAKES_OUTPUTS
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert client.get(job_id).wait(WAIT).state is JobState.SUCCEEDED
    return job_id


def files_under(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if not path.is_dir())


@pytest.mark.slow
def test_outputs_land_under_dest_at_their_paths_in_the_jobs_folder(
    env: dict[str, str], client: Client, workers: Workers, tmp_path: Path
) -> None:
    job_id = finished_job(env, client, workers)
    done = run(env, "outputs", job_id, "--dest", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert files_under(tmp_path / "out") == ["results/a.txt", "top.txt"]
    assert sorted(done.stdout.splitlines()) == [
        str(tmp_path / "out/results/a.txt"),
        str(tmp_path / "out/top.txt"),
    ]
    # `--dest .` puts them back where the job had them.
    here = tmp_path / "here"
    here.mkdir()
    assert run(env, "outputs", job_id, "--dest", ".", cwd=here).returncode == 0
    assert (here / "results" / "a.txt").read_text() == "a\n"
    assert files_under(here) == ["results/a.txt", "top.txt"]


@pytest.mark.slow
def test_a_dest_that_cannot_be_written_is_one_line_and_nothing_is_written(
    env: dict[str, str], client: Client, workers: Workers, tmp_path: Path
) -> None:
    job_id = finished_job(env, client, workers)
    locked = tmp_path / "locked"
    locked.mkdir()
    partial = tmp_path / "partial"
    (partial / "results").mkdir(parents=True)
    for folder in (locked, partial / "results"):
        folder.chmod(0o555)
    try:
        # A folder to make inside one that may not be written; one that may not be written; a
        # writable one whose results/ may not be (top.txt must not land alone).
        for dest, refused in (
            (locked / "out", locked),
            (locked, locked),
            (partial, partial / "results"),
        ):
            done = run(env, "outputs", job_id, "--dest", str(dest), unprivileged=True)
            assert (done.returncode, done.stdout) == (1, "")
            assert done.stderr == f"Error: cannot write to {refused}: permission denied\n"
        assert files_under(locked) == []
        assert files_under(partial) == []
    finally:
        for folder in (locked, partial / "results"):
            folder.chmod(0o755)


# --- what the command line shows, in its own terms (issue 38) -----------------------------------


def test_a_bad_option_is_named_by_its_flag_and_a_duration_as_one(cli: Callable[..., Result]) -> None:
    too_long = cli("submit", "--retry-delay", "2h", "--", "true")
    assert too_long.exit_code == 2
    assert too_long.output.strip().splitlines()[-1] == "Error: invalid job: --retry-delay: at most 1h"
    assert "--kill-grace: more than 0s" in cli("submit", "--kill-grace", "0", "--", "true").output
    empty_output = cli("submit", "--output", "", "--", "true").output
    assert "Error: invalid job: --output: String should have at least 1 character" in empty_output
    assert "Error: invalid job: --gpu-memory: " in cli("submit", "--gpu-memory", "lots", "--", "true").output


def test_commands_are_shown_quoted_as_a_shell_would(cli: Callable[..., Result], client: Client) -> None:
    job_id = cli("submit", "--", "sh", "-c", "echo try; exit 1").output.strip().splitlines()[0]
    assert "command:    sh -c 'echo try; exit 1'\n" in cli("status", job_id).output
    [row] = [line for line in cli("jobs").output.splitlines() if line.startswith(job_id)]
    assert row.endswith("sh -c 'echo try; exit 1'")
