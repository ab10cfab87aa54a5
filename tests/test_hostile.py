"""The hostile-input suite: archives built to escape their folder or fill the disk, tried against the
one unpacking every part uses, and through the real API, a real worker and `gpulayer outputs`.

Each archive is made here, by the test: the CVE-2025-4517 one (a chain of links whose expansion
passes PATH_MAX, so a check that resolves paths gives up), a tar bomb, hard links, ``..`` chains,
links that lead out through other links, and writes through a link.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from schemathesis.generation import GenerationMode

from gpulayer import ArchiveError, Client, JobState
from gpulayer.models import build_spec
from gpulayer.service import Service
from gpulayer.signing import ResultSigner, seal_archive
from gpulayer.store.artifacts import INPUTS_ARCHIVE, OUTPUTS_ARCHIVE, SOURCE_ARCHIVE
from gpulayer.store.keys import Keys
from gpulayer.unpacking import extract
from tests.conftest import WAIT, Hub, Workers, auth, wait_for

MiB = 1024 * 1024


class Builder:
    """A tar archive, entry by entry."""

    def __init__(self, mode: str = "w") -> None:
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode=mode)  # noqa: SIM115  # closed by done()

    def folder(self, name: str) -> Builder:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o777
        self.tar.addfile(info)
        return self

    def link(self, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> Builder:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        self.tar.addfile(info)
        return self

    def file(self, name: str, data: bytes = b"x", size: int | None = None) -> Builder:
        info = tarfile.TarInfo(name)
        info.size = len(data) if size is None else size
        self.tar.addfile(info, io.BytesIO(data) if size is None else Zeros(size))
        return self

    def done(self) -> io.BytesIO:
        self.tar.close()
        self.buffer.seek(0)
        return self.buffer


class Zeros(io.RawIOBase):
    """``size`` zero bytes, made as they are read (a bomb's payload, never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def cve_2025_4517(dest: Path) -> io.BytesIO:
    """The archive of CVE-2025-4517: folders and links that expand, as realpath() sees them, past
    PATH_MAX, then a link back to the top that realpath() stops expanding, a link through it out of
    the folder, a hard link to a file outside, and writes through both."""
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf("/", "PC_PATH_MAX") - len(str(dest)) - 1) // (len(steps) + 1))
    arc, path = Builder(), ""
    for step in steps:
        arc.folder(os.path.join(path, component)).link(os.path.join(path, step), component)
        path = os.path.join(path, component)
    top = os.path.join(*steps, "l" * 254)
    arc.link(top, os.path.join(*[".."] * len(steps)))
    arc.link("escape", os.path.join(top, ".."))
    arc.link("flaglink", os.path.join("escape", "flag"), tarfile.LNKTYPE)
    return arc.file("flaglink", b"overwrite").file("escape/newfile", b"new").done()


def bomb() -> io.BytesIO:
    """About 300 KiB of gzip that would unpack to 300 MiB, over the default 256 MiB cap."""
    return Builder("w:gz").file("zeros", size=300 * MiB).done()


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A folder holding the destination and a file it must not touch: what else appears in it, or
    changes, was written outside."""
    (tmp_path / "box" / "dest").mkdir(parents=True)
    (tmp_path / "box" / "flag").write_text("untouched")
    return tmp_path / "box"


def untouched(box: Path) -> bool:
    return (
        sorted(p.name for p in box.iterdir()) == ["dest", "flag"]
        and (box / "flag").read_text() == "untouched"
    )


HOSTILE: dict[str, tuple[Callable[[Path], io.BytesIO], str]] = {
    "cve_2025_4517": (cve_2025_4517, "is a hard link"),
    "link_out_through_a_link": (
        # d1/d2/b points at "../../r" (inside); "up" reads d1/d2/b/../../.. , inside by its letters,
        # outside once b is followed.
        lambda _: (
            Builder()
            .folder("d1")
            .folder("d1/d2")
            .folder("r")
            .link("d1/d2/b", "../../r")
            .link("up", "d1/d2/b/../../..")
            .file("up/evil")
            .done()
        ),
        "unsafe archive entry: ",
    ),
    "write_through_a_link": (
        lambda _: Builder().folder("inside").link("here", "inside").file("here/x").done(),
        "is written through the link 'here'",
    ),
    "dotdot_chain": (lambda _: Builder().file("a/b/../../../evil").done(), "would land outside its folder"),
    "link_cycle": (
        lambda _: Builder().link("a", "b").link("b", "a").done(),
        "goes through too many links",
    ),
    "hard_link_out": (lambda _: Builder().link("h", "../flag", tarfile.LNKTYPE).done(), "is a hard link"),
    "absolute_link": (lambda _: Builder().link("l", "/etc/passwd").done(), "points to an absolute path"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_archive_is_refused_and_nothing_lands_outside(box: Path, case: str) -> None:
    make, message = HOSTILE[case]
    with pytest.raises(ArchiveError, match=message):
        extract(make(box / "dest"), box / "dest", max_bytes=256 * MiB)
    assert untouched(box)
    assert list((box / "dest").iterdir()) == []  # nothing written at all: it was refused whole


def test_a_tar_bomb_is_refused_before_a_byte_of_it_is_written(box: Path) -> None:
    archive = bomb()
    assert len(archive.getvalue()) < MiB
    with pytest.raises(ArchiveError, match=r"unpacks to more than 256\.0 MiB, the cap"):
        extract(archive, box / "dest", max_bytes=256 * MiB)
    assert list((box / "dest").iterdir()) == []


def test_an_archive_of_too_many_entries_is_refused(box: Path) -> None:
    arc = Builder()
    for index in range(11):
        arc.file(f"f{index}")
    with pytest.raises(ArchiveError, match="holds more than 10 entries"):
        extract(arc.done(), box / "dest", max_bytes=MiB, max_members=10)
    assert list((box / "dest").iterdir()) == []


def test_links_that_stay_inside_are_kept_even_through_other_links(box: Path) -> None:
    arc = Builder().folder("pkg").file("pkg/m.py", b"x = 1\n").file("f.txt", b"hello")
    arc.link("pkg/up", "../f.txt").link("alias", "pkg").link("through", "alias/m.py").link("self", ".")
    written = extract(arc.done(), box / "dest", max_bytes=MiB)
    dest = box / "dest"
    assert sorted(path.name for path in written) == ["f.txt", "m.py"]
    assert (dest / "through").read_text() == "x = 1\n"
    assert (dest / "pkg" / "up").read_text() == "hello"
    assert untouched(box)


def test_a_folder_that_already_holds_a_link_is_never_written_through(box: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (box / "dest" / "sub").symlink_to(outside)
    with pytest.raises(ArchiveError, match="is already there, and not a folder"):
        extract(Builder().file("sub/evil").done(), box / "dest", max_bytes=MiB, replace=True)
    assert list(outside.iterdir()) == []


def test_a_file_already_there_is_replaced_only_when_asked(box: Path) -> None:
    (box / "dest" / "run.sh").write_text("the source's")
    with pytest.raises(ArchiveError, match="would replace what is already there"):
        extract(Builder().file("run.sh", b"an input's").done(), box / "dest", max_bytes=MiB)
    assert (box / "dest" / "run.sh").read_text() == "the source's"
    extract(Builder().file("run.sh", b"downloaded again").done(), box / "dest", max_bytes=MiB, replace=True)
    assert (box / "dest" / "run.sh").read_text() == "downloaded again"


# --- through the parts that unpack ----------------------------------------------------------------
def test_the_api_refuses_a_hostile_source_upload(
    http: FlaskClient, tokens: dict[str, str], box: Path
) -> None:
    for archive in (cve_2025_4517(box / "dest"), bomb()):
        answer = http.post(
            "/api/v1/jobs",
            data={"spec": '{"command": ["true"]}', "source": (archive, "src.tar.gz")},
            headers=auth(tokens["submitter"]),
            content_type="multipart/form-data",
        )
        assert answer.status_code == 400
        assert answer.get_json()["error"].startswith("source: ")


@pytest.mark.parametrize("name", ["../../x", "a/b", ".."])
def test_the_api_refuses_an_upload_name_rather_than_renaming_it(
    http: FlaskClient, tokens: dict[str, str], raw_redis: redis.Redis, name: str
) -> None:
    answer = http.post(
        "/api/v1/jobs",
        data={"spec": '{"command": ["true"]}', "inputs": (io.BytesIO(b"1"), name)},
        headers=auth(tokens["submitter"]),
        content_type="multipart/form-data",
    )
    assert answer.status_code == 400
    assert "is not a plain file name" in answer.get_json()["error"]
    assert not raw_redis.keys(Keys("gpulayer").job("*"))


def test_outputs_a_worker_replaced_with_a_hostile_archive_write_nothing_outside_the_destination(
    client: Client,
    workers: Workers,
    raw_redis: redis.Redis,
    cli: Callable[..., Any],
    box: Path,
    session_hub: Hub,
) -> None:
    workers.start("w1", 1)
    # Every name is a declared output: what stops the archive is its unpacking, not the filter.
    job = client.submit(["sh", "-c", "echo hi > out.txt"], outputs=["*"])
    record = job.wait(WAIT)
    assert record.state is JobState.SUCCEEDED
    # As the worker that ran it could (signed with its key): the outputs are that worker's to store.
    raw_redis.delete(client.keys.outputs(job.id))
    archive = cve_2025_4517(box / "dest")
    key = session_hub.worker.keyring.result_key
    assert key is not None
    signer = ResultSigner("worker", key)

    def seal(sha256: str) -> str:
        return seal_archive(signer, job.id, record.attempt, OUTPUTS_ARCHIVE, sha256)

    client.stores.artifacts._put(client.keys.outputs(job.id), OUTPUTS_ARCHIVE, archive, 3600, seal=seal)
    result = cli("outputs", job.id, "--dest", str(box / "dest"))
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "is a hard link" in result.output
    assert untouched(box)


@pytest.fixture
def signed_inputs(client: Client) -> Callable[[io.BytesIO], str]:
    """Submit a job whose inputs are the archive given, signed as a submitter would (an archive a
    submitter made is trusted to be what it is, not to be safe)."""

    def submit(archive: io.BytesIO) -> str:
        job_id = os.urandom(6).hex()
        digest = client.stores.artifacts.put_inputs(job_id, "up", INPUTS_ARCHIVE, archive)
        spec = build_spec(command=["true"], inputs=["x"])
        assert client.stores.jobs.submit(job_id, spec, "up", {INPUTS_ARCHIVE: digest}) == job_id
        return job_id

    return submit


def test_a_worker_fails_a_job_whose_archive_is_hostile_and_goes_on(
    client: Client, workers: Workers, signed_inputs: Callable[[io.BytesIO], str], tmp_path: Path
) -> None:
    process = workers.start("w1", 1, "--workdir", str(tmp_path / "box" / "work"))
    (tmp_path / "box" / "flag").write_text("untouched")
    for archive, said in [(cve_2025_4517(tmp_path / "box" / "work"), "is a hard link"), (bomb(), "the cap")]:
        record = client.get(signed_inputs(archive)).wait(WAIT)
        assert record.state is JobState.FAILED
        assert record.reason is not None
        assert record.reason.startswith("cannot unpack the job's files: ")
        assert said in record.reason
    assert (tmp_path / "box" / "flag").read_text() == "untouched"
    assert sorted(path.name for path in (tmp_path / "box").iterdir()) == ["flag", "work"]
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED
    assert process.poll() is None


def test_an_input_may_not_replace_a_source_file(
    client: Client, workers: Workers, cli: Callable[..., Any], tmp_path: Path, raw_redis: redis.Redis
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "run.sh").write_text("echo source\n")
    (tmp_path / "run.sh").write_text("echo input\n")
    refused = cli(
        "submit", "--source", str(source), "--input", str(tmp_path / "run.sh"), "--", "sh", "run.sh"
    )
    assert refused.exit_code == 2
    assert (
        refused.output.strip() == "Error: invalid job: the input 'run.sh' would replace the source's 'run.sh'"
    )
    assert raw_redis.dbsize() == 0
    # A job signed with both anyway (a client of its own) fails on the worker, not overwriting it.
    workers.start("w1", 1)
    source_id = os.urandom(6).hex()
    archives = {
        SOURCE_ARCHIVE: Builder("w:gz").file("run.sh", b"echo source\n").done(),
        INPUTS_ARCHIVE: Builder("w:gz").file("run.sh", b"echo input\n").done(),
    }
    artifacts = client.stores.artifacts
    files = {name: artifacts.put_inputs(source_id, "up", name, data) for name, data in archives.items()}
    spec = build_spec(command=["sh", "run.sh"], source=True, inputs=["run.sh"])
    assert client.stores.jobs.submit(source_id, spec, "up", files) == source_id
    record = client.get(source_id).wait(WAIT)
    assert (
        record.reason
        == "cannot unpack the job's files: archive entry 'run.sh' would replace what is already there"
    )


# --- records --------------------------------------------------------------------------------------
GARBLED = "garbled\xff{".encode("latin-1")
#: Every field of a queued job's hash, with what it is garbled to (None: removed).
QUEUED_FIELDS: list[tuple[str, bytes | None]] = [
    *[
        (field, GARBLED)
        for field in (
            "gl_state", "gl_attempt", "gl_spec", "gl_seal", "origin", "created_at", "enqueued_at",
            "gl_retries", "gl_retry_on", "gl_retry_delay", "gl_retried", "gl_attempts", "gl_queued_ms",
            "result_ttl", "timeout", "status", "description", "gl_idempotency", "gl_batch", "gl_nodes",
            "worker_name", "gl_gpus", "gl_cpus", "gl_memory", "gl_gpu_uuids", "gl_exit_code",
            "gl_reason", "gl_outputs", "gl_parts", "gl_retry_at", "started_at", "ended_at", "gl_score",
        )
    ],
    *[(field, None) for field in ("gl_attempt", "gl_spec", "gl_seal", "origin", "created_at")],
    ("gl_spec", b"x" * 2_000_000),
    ("gl_score", b"nan"),  # a number to Lua, not to ZADD
]  # fmt: skip
#: Fields of a running job's hash garbled while its worker runs it.
RUNNING_FIELDS = ["gl_attempt", "gl_attempts", "gl_cpus", "gl_memory", "gl_gpu_uuids", "gl_running_ms",
                  "gl_retried", "worker_name", "gl_queued_ms"]  # fmt: skip
FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")


def garble(connection: redis.Redis, key: str, field: str, value: bytes | None) -> None:
    if value is None:
        connection.hdel(key, field)
    else:
        connection.hset(key, field, value)


def test_every_field_of_a_job_garbled_in_turn_ends_that_job_and_no_worker_exits(
    client: Client,
    workers: Workers,
    raw_redis: redis.Redis,
    cli: Callable[..., Any],
    http: FlaskClient,
    tokens: dict[str, str],
) -> None:
    queued = []
    for field, value in QUEUED_FIELDS:
        job = client.submit(["true"], name=f"{field}-{'gone' if value is None else 'garbled'}")
        garble(raw_redis, client.keys.job(job.id), field, value)
        queued.append(job.id)
    processes = [workers.start("w1", 2, *FAST), workers.start("w2", 2, *FAST)]
    running = []
    for field in RUNNING_FIELDS:
        job = client.submit(["sleep", "1"], retries=1, retry_delay=0)
        wait_for(lambda job=job: job.status().state is JobState.RUNNING, what=f"a job to run ({field})")
        garble(raw_redis, client.keys.job(job.id), field, GARBLED)
        running.append(job.id)
    for job_id in queued + running:
        wait_for(
            lambda job_id=job_id: (
                raw_redis.hget(client.keys.job(job_id), "gl_state")
                in (b"succeeded", b"failed", b"cancelled", b"timed_out")
            ),
            what=f"job {job_id} to end",
        )
    assert all(process.poll() is None for process in processes)
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED
    # Every listing still reads, each corrupt record shown as such.
    records = {record.id: record for record in client.jobs(limit=1000)}
    assert set(queued + running) <= set(records)
    by_name = {record.name: record for record in records.values()}
    assert by_name["gl_state-garbled"].reason == "corrupt record: gl_state is not a state"
    assert by_name["gl_attempt-gone"].reason == "corrupt record: gl_attempt is not a whole number"
    assert by_name["created_at-garbled"].corrupt == "unreadable created_at"
    assert by_name["gl_seal-garbled"].reason == "refused: the job's signature is garbled; it was not run"
    listed = cli("jobs", "--limit", "1000")
    assert listed.exit_code == 0
    assert "failed (corrupt)" in listed.output
    assert http.get("/api/v1/jobs?limit=1000", headers=auth(tokens["viewer"])).status_code == 200
    for job_id in queued + running:
        # A garbled origin too: the installation's index of jobs says whose it is.
        assert http.get(f"/api/v1/jobs/{job_id}", headers=auth(tokens["viewer"])).status_code == 200
        assert client.get(job_id).wait(WAIT).state.is_terminal


def test_a_garbled_queue_or_worker_record_is_left_out_and_no_worker_exits(
    client: Client, workers: Workers, raw_redis: redis.Redis, cli: Callable[..., Any]
) -> None:
    raw_redis.hset(client.keys.queues, "gpulayer:bogus", GARBLED)
    raw_redis.hset(client.keys.rq_worker("ghost"), mapping={"gl_offer": GARBLED, "birth": "x"})
    raw_redis.sadd(client.keys.rq_workers, client.keys.rq_worker("ghost"))
    process = workers.start("w1", 1)
    assert client.submit(["true"]).wait(WAIT).state is JobState.SUCCEEDED
    assert [worker.name for worker in client.workers()] == ["w1"]
    assert [queue.name for queue in Service(client).queues()[0]] == ["gpulayer:default"]
    assert cli("workers").exit_code == 0
    assert process.poll() is None


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('{"command": ["true"], "timeout": 1e309}', "timeout"),
        ('{"command": ["true"], "retry_delay": NaN}', "retry_delay"),
        ("[" * 100_000 + "]" * 100_000, "nests too deep"),
        ('{"command": ["true"], "env": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001, "nests too deep"),
    ],
)
def test_what_once_gave_a_500_is_a_400_with_one_line(
    http: FlaskClient, tokens: dict[str, str], raw_redis: redis.Redis, body: str, said: str
) -> None:
    answer = http.post(
        "/api/v1/jobs", data=body, headers=auth(tokens["submitter"]), content_type="application/json"
    )
    assert answer.status_code == 400, answer.get_data(as_text=True)
    message = answer.get_json()["error"]
    assert said in message
    assert "\n" not in message
    assert raw_redis.dbsize() == len(raw_redis.keys("gpulayer#auth:*"))  # no job, nothing half-written


def test_every_route_sent_what_its_document_forbids_answers_without_a_server_error(
    app: Flask, tokens: dict[str, str]
) -> None:
    """Schemathesis, past the schema: wrong types, missing fields, values out of range. Every answer is
    a 4xx, never a 5xx."""
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    for result in schema.get_all_operations():
        operation = result.ok()

        @hypothesis.given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        @hypothesis.settings(
            max_examples=30, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck)
        )
        def fuzz(case: Any) -> None:
            response = case.call(headers=auth(tokens["admin"]))
            assert response.status_code < 500, (case.method, case.path, response.text[:300])

        fuzz()
