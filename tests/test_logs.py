"""Log lines are kept in Redis, bounded, and followed live until the job ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from gpulayer import Client, JobState, LogLine, Settings
from tests.conftest import Workers, wait_for


def test_stdout_and_stderr_lines_are_kept_in_order_with_their_stream(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo one; sleep 0.1; echo two >&2; sleep 0.1; echo three"])
    job.wait(30)
    assert [(line.stream, line.text) for line in job.logs()] == [
        ("stdout", "one"),
        ("stderr", "two"),
        ("stdout", "three"),
    ]
    assert {line.attempt for line in job.logs()} == {1}


def test_follow_sees_a_line_while_the_job_is_still_running_and_stops_when_it_ends(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start()
    release = tmp_path / "release"
    job = client.submit(["sh", "-c", f"echo first; while [ ! -e {release} ]; do sleep 0.05; done; echo last"])
    seen: list[tuple[LogLine, JobState]] = []

    def follow() -> None:
        for line in job.logs(follow=True):
            seen.append((line, job.status().state))

    follower = threading.Thread(target=follow)
    follower.start()
    wait_for(lambda: seen, what="the first line")
    release.touch()
    follower.join(30)

    assert not follower.is_alive()
    assert [line.text for line, _ in seen] == ["first", "last"]
    assert seen[0][1] is JobState.RUNNING


def test_follow_of_a_job_that_already_ended_prints_everything_and_returns(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "for i in 1 2 3; do echo $i; done"])
    job.wait(30)
    assert [line.text for line in job.logs(follow=True)] == ["1", "2", "3"]


def test_a_job_keeps_only_its_last_lines_and_splits_overlong_ones(
    redis_url: str, home: Path, workers: Workers
) -> None:
    workers.env["GPULAYER_LOG_MAX_LINES"] = "100"
    workers.env["GPULAYER_LOG_LINE_MAX_BYTES"] = "1000"
    workers.start()
    settings = Settings(home=home, log_max_lines=100, log_line_max_bytes=1000)
    client = Client(redis_url, settings=settings)
    job = client.submit(["sh", "-c", "seq 1 500; head -c 2500 /dev/zero | tr '\\0' x; echo"])
    job.wait(30)
    lines = [line.text for line in job.logs()]
    assert len(lines) == 100
    assert lines[-3:] == ["x" * 1000, "x" * 1000, "x" * 500]
    assert lines[:3] == ["404", "405", "406"]


def test_a_line_printed_is_stored_without_waiting_for_the_job_to_end(
    client: Client, workers: Workers
) -> None:
    workers.start()
    job = client.submit(["sh", "-c", "echo now; sleep 30"])
    wait_for(lambda: list(job.logs()), what="the line")
    assert job.status().state is JobState.RUNNING
    job.cancel()


#: What a hostile job prints, a line per kind of control a terminal acts on, each beside the text
#: that must still show; the colour and the progress bar's return and tab are kept.
HOSTILE = [
    "\x1b[1;31mred\x1b[0m",
    "\x1b]0;owned-title\x07after-title",
    "\x1b]52;c;Y3VybCBldmlsfHNo\x1b\\after-clipboard",
    "\x1b]8;;https://evil.example/\x1b\\link-text\x1b]8;;\x1b\\",
    "\x1b[2A\x1b[10;5Hafter-cursor",
    "\x1b[2J\x1b[Kafter-erase",
    "\x1b[6n\x1b[21tafter-report",
    "\x1bP1$tqdcs-payload\x1b\\after-dcs",
    "bell\x07back\x08space\x1bcafter-reset",
    "\u009b2J\u009d0;c1-title\u009cafter-c1",
    "10%\r20%\tdone",
]
#: What the terminal must show of them.
SHOWN = [
    "\x1b[1;31mred\x1b[0m",
    "after-title",
    "after-clipboard",
    "link-text",
    "after-cursor",
    "after-erase",
    "after-report",
    "after-dcs",
    "bellbackspaceafter-reset",
    "after-c1",
    "10%\r20%\tdone",
]
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def on_a_terminal(env: dict[str, str], *args: str) -> str:
    """What ``gpulayer ARGS`` wrote to its terminal, its stdout and stderr a pseudo-terminal's (whose
    newlines arrive as CR LF, turned back here)."""
    main, side = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", *args], env=env, stdin=subprocess.DEVNULL, stdout=side, stderr=side
    )
    os.close(side)
    received = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: no process holds the terminal's other side any more
            break
        if not chunk:
            break
        received += chunk
    process.wait(30)
    os.close(main)
    return received.decode().replace("\r\n", "\n")


def test_job_output_reaches_a_terminal_with_its_colours_and_no_other_control_sequence(
    env: dict[str, str], workers: Workers
) -> None:
    workers.start()
    printed = "\n".join(HOSTILE) + "\n"
    script = f"import sys; text = bytes.fromhex('{printed.encode().hex()}').decode()"
    script += "; sys.stdout.write(text); sys.stderr.write(text)"
    submitted = on_a_terminal(env, "submit", "--wait", "--", "python3", "-c", script)
    [job_id] = re.findall(r"job ([0-9a-f]{12}) queued", submitted)
    for shown in (submitted, on_a_terminal(env, "logs", job_id), on_a_terminal(env, "logs", "-f", job_id)):
        plain = _SGR.sub("", shown)
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", plain), repr(shown)
        for hidden in ("owned-title", "Y3VybCBldmlsfHNo", "evil.example", "dcs-payload", "c1-title"):
            assert hidden not in shown
        lines = shown.split("\n")  # not splitlines(), which splits at the progress bar's return too
        assert all(lines.count(line) == 2 for line in SHOWN), repr(shown)  # stdout's and stderr's
    # To a pipe, as printed.
    piped = subprocess.run(
        [sys.executable, "-m", "gpulayer", "logs", job_id],
        env=env,
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert (piped.stdout.decode(), piped.stderr.decode()) == (printed, printed)
