"""The HTTP API with Flask's test client over a real Redis (and real workers where jobs must run),
and `gpulayer server` as a real process."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import redis
import schemathesis
from click.testing import Result
from flask import Flask
from flask.testing import FlaskClient
from simple_websocket import Client as Client_
from simple_websocket import ConnectionClosed
from simple_websocket import ConnectionError as Refused

from gpulayer import Client, JobState
from gpulayer.models import Role
from gpulayer.network import free_port
from gpulayer.provisioned import Decision, Machine
from gpulayer.service import Service
from gpulayer.web.auth import ROLE_ATTRIBUTE
from tests.conftest import Workers, auth, wait_for

#: What a websocket route needs to be reached at all (without it, routing answers 400).
UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade"}


def routes(app: Flask) -> Iterator[tuple[str, str, Role, dict[str, str]]]:
    """Every (method, path, least role, headers to reach it) the app serves, ids filled in."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        view = app.view_functions[rule.endpoint]
        path = rule.rule.replace("<job_id>", "0123456789ab").replace("<name>", "nobody")
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            yield method, path, getattr(view, ROLE_ATTRIBUTE, None), UPGRADE if rule.websocket else {}


#: The routes anyone may call: logging in and out, the API's document, the dashboard's files.
PUBLIC = {
    ("POST", "/login"),
    ("POST", "/logout"),
    ("GET", "/api/v1/openapi.json"),
    # The dashboard's page and its scripts: they hold no data.
    ("GET", "/"),
    ("GET", "/static/<path:name>"),
}


def test_every_route_refuses_no_token_with_401_and_a_too_weak_role_with_403(
    app: Flask, http: FlaskClient, tokens: dict[str, str]
) -> None:
    everything = list(routes(app))
    assert {(method, path) for method, path, role, _ in everything if role is None} == PUBLIC
    served = [(method, path, role, reach) for method, path, role, reach in everything if role is not None]
    assert len(served) >= 13
    for number, (method, path, role, reach) in enumerate(served):

        def status(
            token: str | None = None,
            method: str = method,
            path: str = path,
            reach: dict[str, str] = reach,
            address: str = "127.0.0.1",
        ) -> int:
            headers = {**reach, **(auth(token) if token else {})}
            answer = http.open(path, method=method, headers=headers, environ_base={"REMOTE_ADDR": address})
            return answer.status_code

        assert status() == 401, (method, path)
        # A wrong token counts toward its address's limit on guesses: each route's from one of its own.
        assert status("glt_not-a-token", address=f"192.0.2.{number}") == 401, (method, path)
        if role in ("submitter", "admin", "metrics"):
            assert status(tokens["viewer"]) == 403, (method, path)
        if role == "admin":
            assert status(tokens["submitter"]) == 403, (method, path)
        if role != "metrics":
            # A metrics token reads /metrics, nothing else.
            assert status(tokens["metrics"]) == 403, (method, path)
    # Every mutation needs more than a viewer; but MCP's own messages, which carry reads too (its
    # server then offers a viewer no tool that changes anything: tests/test_agents.py).
    assert all(role != "viewer" for method, path, role, _ in served if method != "GET" and path != "/mcp")


def test_a_revoked_or_expired_token_stops_working_at_once(
    web_client: Client, http: FlaskClient, tokens: dict[str, str]
) -> None:
    viewer = auth(tokens["viewer"])
    assert http.get("/api/v1/jobs", headers=viewer).status_code == 200
    assert http.delete("/api/v1/tokens/t-viewer", headers=auth(tokens["admin"])).status_code == 200
    answer = http.get("/api/v1/jobs", headers=viewer)
    assert (answer.status_code, answer.json) == (401, {"error": "the token is unknown, revoked or expired"})
    brief, _ = Service(web_client).create_token("brief", "viewer", expires_in=0.2)
    assert http.get("/api/v1/jobs", headers=auth(brief)).status_code == 200
    time.sleep(0.3)
    assert http.get("/api/v1/jobs", headers=auth(brief)).status_code == 401
    # Shorter than Redis counts (a millisecond) is made, and is over at once.
    instant, _ = Service(web_client).create_token("instant", "viewer", expires_in=0.0001)
    time.sleep(0.01)
    assert http.get("/api/v1/jobs", headers=auth(instant)).status_code == 401


def test_jobs_are_listed_newest_first_a_page_at_a_time(
    client: Client, http: FlaskClient, tokens: dict[str, str]
) -> None:
    ids = [client.submit(["echo", str(n)]).id for n in range(5)]
    viewer = auth(tokens["viewer"])
    first = http.get("/api/v1/jobs?limit=2", headers=viewer).json
    assert first is not None
    assert [job["id"] for job in first["jobs"]] == ids[::-1][:2]
    assert first["next_offset"] == 2
    rest = http.get("/api/v1/jobs?limit=10&offset=2&state=queued", headers=viewer).json
    assert rest is not None
    assert ([job["id"] for job in rest["jobs"]], rest["next_offset"]) == (ids[::-1][2:], None)
    assert rest["jobs"][0]["spec"] == {"command": ["echo", "2"]}
    for query, message in (
        ("state=lost", "state must be one of queued, scheduled"),
        ("limit=0", "limit must be a whole number from 1 to 1000"),
        ("offset=-1", "offset must be a whole number"),
    ):
        answer = http.get(f"/api/v1/jobs?{query}", headers=viewer)
        assert answer.status_code == 400
        assert answer.json is not None
        assert answer.json["error"].startswith(message)


def test_submit_validates_with_the_same_models_and_writes_nothing_when_refused(
    http: FlaskClient, tokens: dict[str, str], raw_redis: redis.Redis
) -> None:
    submitter = auth(tokens["submitter"])
    before = raw_redis.dbsize()
    for body, status, message in (
        ({}, 400, "invalid request: command: Field required"),
        (
            {"command": ["true"], "colour": "red"},
            400,
            "invalid request: colour: Extra inputs are not permitted",
        ),
        ({"command": ["true"], "requirements": {"gpus": -1}}, 400, "invalid request: gpus: "),
        ({"command": [""]}, 400, "invalid job: command: the command is empty"),
        (
            {"command": ["true"], "fail_if_unschedulable": True},
            409,
            "no connected worker could ever run this job",
        ),
    ):
        answer = http.post("/api/v1/jobs", json=body, headers=submitter)
        assert answer.status_code == status, answer.json
        assert answer.json is not None
        assert answer.json["error"].startswith(message), answer.json
        assert "\n" not in answer.json["error"]
    assert http.post("/api/v1/jobs", data="not json", headers=submitter).status_code == 400
    assert raw_redis.dbsize() == before
    created = http.post(
        "/api/v1/jobs",
        json={"command": "echo hi", "requirements": {"cpus": 2}, "priority": 3},
        headers=submitter,
    )
    assert created.status_code == 201
    assert created.json is not None
    detail = http.get(f"/api/v1/jobs/{created.json['id']}", headers=auth(tokens["viewer"])).json
    assert detail is not None
    assert (detail["state"], detail["command"], detail["spec"]["priority"]) == ("queued", ["echo", "hi"], 3)
    assert detail["reasons"] == [
        {"worker": None, "reason": "no workers are connected", "codes": ["no_workers"]}
    ]


def test_a_list_of_jobs_is_queued_together_or_refused_whole(
    http: FlaskClient, tokens: dict[str, str], raw_redis: redis.Redis
) -> None:
    submitter = auth(tokens["submitter"])
    before = raw_redis.dbsize()
    for body, message in (
        ([], "a list of jobs holds 1 to 10000 of them"),
        (
            [{"command": ["true"]}, {"command": ["true"], "priority": 2}],
            "the jobs of a list must differ only",
        ),
        ([{"command": ["true"]}, {"command": [""]}], "invalid job: command: the command is empty"),
        (
            [{"command": ["true"], "idempotency_key": "k"}],
            "invalid job: a list of jobs takes no idempotency_key",
        ),
        ([{"command": ["true"]}, {"colour": "red"}], "invalid request: command: Field required"),
    ):
        answer = http.post("/api/v1/jobs", json=body, headers=submitter)
        assert answer.status_code == 400, answer.json
        assert answer.json is not None
        assert answer.json["error"].startswith(message), answer.json
    assert raw_redis.dbsize() == before
    body = [{"command": ["echo", str(index)], "requirements": {"cpus": 2}} for index in range(5)]
    created = http.post("/api/v1/jobs", json=body, headers=submitter)
    assert created.status_code == 201
    assert created.json is not None
    viewer = auth(tokens["viewer"])
    details = [http.get(f"/api/v1/jobs/{job_id}", headers=viewer).json for job_id in created.json["ids"]]
    assert [(detail["command"], detail["spec"]["requirements"]["cpus"]) for detail in details] == [
        (["echo", str(index)], 2) for index in range(5)
    ]


def test_a_missing_job_is_404_and_cancelling_an_ended_one_is_409(
    client: Client, http: FlaskClient, tokens: dict[str, str]
) -> None:
    submitter = auth(tokens["submitter"])
    assert http.get("/api/v1/jobs/0123456789ab", headers=submitter).status_code == 404
    job = client.submit(["true"])
    answer = http.post(f"/api/v1/jobs/{job.id}/cancel", headers=submitter)
    assert (answer.status_code, answer.json) == (200, {"id": job.id, "state": "cancelled"})
    again = http.post(f"/api/v1/jobs/{job.id}/cancel", headers=submitter)
    assert again.status_code == 409
    assert http.get("/api/v1/nowhere", headers=submitter).json == {
        "error": "The requested URL was not found on the server. If you entered the URL manually please "
        "check your spelling and try again."
    }
    assert http.put(f"/api/v1/jobs/{job.id}", headers=submitter).status_code == 405


def test_logs_page_by_cursor_and_outputs_download(
    client: Client, workers: Workers, http: FlaskClient, tokens: dict[str, str], tmp_path: Path
) -> None:
    workers.start("w1", 1)
    viewer = auth(tokens["viewer"])
    job = client.submit(
        ["sh", "-c", "for n in 1 2 3; do echo line $n; done; echo made > out.txt"], outputs=["out.txt"]
    )
    assert job.wait(30).state is JobState.SUCCEEDED
    first = http.get(f"/api/v1/jobs/{job.id}/logs?limit=2", headers=viewer).json
    assert first is not None
    assert [line["text"] for line in first["lines"]] == ["line 1", "line 2"]
    rest = http.get(f"/api/v1/jobs/{job.id}/logs?after={first['next_after']}", headers=viewer).json
    assert rest is not None
    assert [line["text"] for line in rest["lines"]] == ["line 3"]
    assert http.get(f"/api/v1/jobs/{job.id}/logs?after=x", headers=viewer).status_code == 400
    archive = http.get(f"/api/v1/jobs/{job.id}/outputs", headers=viewer)
    assert (archive.status_code, archive.mimetype) == (200, "application/gzip")
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        member = tar.extractfile("out.txt")
        assert member is not None
        assert member.read() == b"made\n"
    waiting = client.submit(["true"], labels={"zone": "mars"})
    assert http.get(f"/api/v1/jobs/{waiting.id}/outputs", headers=viewer).status_code == 409
    plain = client.submit(["true"])
    assert plain.wait(30).state is JobState.SUCCEEDED
    assert http.get(f"/api/v1/jobs/{plain.id}/outputs", headers=viewer).status_code == 404


def test_workers_queues_and_tokens(
    client: Client, web_client: Client, workers: Workers, http: FlaskClient, tokens: dict[str, str]
) -> None:
    workers.start("w1", 2)
    viewer, admin = auth(tokens["viewer"]), auth(tokens["admin"])
    listed = http.get("/api/v1/workers", headers=viewer).json
    assert listed is not None
    assert [(w["name"], w["slots"]) for w in listed["workers"]] == [("w1", 2)]
    client.submit(["true"], labels={"zone": "mars"})
    client.submit(["true"], nodes=2)
    queues = http.get("/api/v1/queues", headers=viewer).json
    assert queues is not None
    assert [(q["requirements"]["labels"], q["depth"]) for q in queues["queues"]] == [({"zone": "mars"}, 1)]
    assert queues["gangs_waiting"] == 1
    made = http.post(
        "/api/v1/tokens", json={"name": "ci", "role": "submitter", "expires": "30d"}, headers=admin
    )
    assert made.status_code == 201
    assert made.json is not None
    assert made.json["token"].startswith("glt_")
    assert Service(web_client).check_token(made.json["token"]) is not None
    listed_tokens = http.get("/api/v1/tokens", headers=admin).json
    assert listed_tokens is not None
    assert "ci" in [t["name"] for t in listed_tokens["tokens"]]
    assert all("token" not in t for t in listed_tokens["tokens"])
    taken = http.post("/api/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=admin)
    assert (taken.status_code, taken.json) == (400, {"error": "a token named 'ci' exists; revoke it first"})
    assert http.post("/api/v1/tokens", json={"name": "x", "role": "root"}, headers=admin).status_code == 400
    assert http.delete("/api/v1/tokens/ci", headers=admin).status_code == 200
    assert http.delete("/api/v1/tokens/ci", headers=admin).status_code == 404


def test_the_machines_the_autoscaler_started_and_its_decision_for_a_queued_job(
    client: Client, http: FlaskClient, tokens: dict[str, str]
) -> None:
    viewer = auth(tokens["viewer"])
    assert http.get("/api/v1/machines", headers=viewer).json == {"machines": []}
    now = datetime.now(timezone.utc)
    offer: dict[str, object] = {"name": "a100x1", "accelerator": "cuda", "gpus": 1}
    running = Machine(
        name="sim-a100x1-aaaaaa", provider="sim", kind="a100x1", offer=offer, state="running",
        created=now - timedelta(hours=2), price_per_hour=1.5, gpus=1, wanted_by="q",
    )  # fmt: skip
    failed = Machine(
        name="sim-a100x1-bbbbbb", provider="sim", kind="a100x1", offer=offer, state="failed",
        created=now - timedelta(hours=3), ended=now - timedelta(hours=2), reason="its worker did not join",
    )  # fmt: skip
    client.stores.capacity.put(failed)
    client.stores.capacity.put(running)
    listed = http.get("/api/v1/machines", headers=viewer).json
    assert listed is not None
    [first, second] = listed["machines"]  # the newest first
    assert (first["name"], first["state"], first["provider"]) == (running.name, "running", "sim")
    assert first["age"] == pytest.approx(7200, abs=60)
    assert first["cost"] == pytest.approx(3.0, abs=0.05)  # two hours at 1.5 an hour
    assert (second["state"], second["reason"], second["age"], second["cost"]) == (
        "failed", "its worker did not join", 3600, None,
    )  # fmt: skip
    waiting = client.submit(["true"], labels={"zone": "mars"})
    record = http.get(f"/api/v1/jobs/{waiting.id}", headers=viewer).json
    assert record is not None
    assert record["capacity"] is None  # no autoscaler decided anything
    said = "no provider offers a worker with label zone=mars"
    queue = client.keys.queue_for(waiting.status().spec.queue)
    client.stores.capacity.decide({queue: Decision(text=said, at=now, unmet=True)})
    record = http.get(f"/api/v1/jobs/{waiting.id}", headers=viewer).json
    assert record is not None
    assert record["capacity"] == said
    assert record["reasons"]
    waiting.cancel()
    record = http.get(f"/api/v1/jobs/{waiting.id}", headers=viewer).json
    assert record is not None
    assert (record["reasons"], record["capacity"]) == ([], None)


def test_tokens_from_the_command_line(cli: Callable[..., Result], web_client: Client) -> None:
    made = cli("token", "create", "--name", "laptop", "--role", "viewer", "--expires", "1d")
    assert made.exit_code == 0
    secret = made.stdout.strip()
    assert secret.startswith("glt_")
    info = Service(web_client).check_token(secret)
    assert info is not None
    assert (info.name, info.role) == ("laptop", "viewer")
    assert "laptop  viewer" in cli("token", "list").output
    again = cli("token", "create", "--name", "laptop", "--role", "viewer")
    assert (again.exit_code, again.output.strip()) == (
        2,
        "Error: a token named 'laptop' exists; revoke it first",
    )
    bad = cli("token", "create", "--name", "bad name", "--role", "viewer")
    assert bad.exit_code == 2
    assert bad.output.startswith("Error: invalid token: name: String should match pattern")
    assert cli("token", "revoke", "laptop").exit_code == 0
    assert Service(web_client).check_token(secret) is None
    assert cli("token", "revoke", "laptop").exit_code == 2


def test_the_server_command_serves_the_api_with_gunicorn(env: dict[str, str], web_client: Client) -> None:
    token, _ = Service(web_client).create_token("served", "viewer")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/jobs", headers=auth(token))

        def answers() -> Any:
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    return json.load(response)
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                return None

        wait_for(answers, what="the server to answer")
        assert answers() == {"jobs": [], "next_offset": None}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=2)
        assert refused.value.code == 401
    finally:
        server.terminate()
        server.wait(20)


def receive_all(ws: Any, timeout: float = 30) -> list[dict[str, Any]]:
    """Messages until the end message (included) or the socket closes."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            message = ws.receive(timeout=1)
        except ConnectionClosed:
            return got
        if message is None:
            continue
        got.append(json.loads(message))
        if "end" in got[-1]:
            return got
    raise AssertionError(f"no end after {timeout} s: {got}")


def test_a_log_websocket_sends_the_stored_lines_then_the_new_ones_as_printed(
    app: Flask, client: Client, workers: Workers, served: str, tokens: dict[str, str]
) -> None:
    workers.start("w1", 1)
    job = client.submit(["sh", "-c", "echo first; sleep 1; echo second; sleep 0.5; echo third"])
    wait_for(lambda: [line.text for line in job.logs()] == ["first"], what="the first line")
    ws = Client_.connect(f"ws://{served}/ws/jobs/{job.id}/logs", headers=auth(tokens["viewer"]))
    got = receive_all(ws)
    assert [m.get("text") for m in got] == ["first", "second", "third", None]
    assert got[-1] == {"end": "succeeded"}
    assert all(m["id"] for m in got[:-1])
    # A browser's session cookie opens one too.
    cookie = app.test_client().post("/login", json={"token": tokens["viewer"]}).headers["Set-Cookie"]
    browser = Client_.connect(
        f"ws://{served}/ws/jobs/{job.id}/logs", headers={"Cookie": cookie.split(";", 1)[0]}
    )
    assert [m.get("text") for m in receive_all(browser)] == ["first", "second", "third", None]
    # A job that already ended: its whole log, then the end.
    again = Client_.connect(
        f"ws://{served}/ws/jobs/{job.id}/logs?after={got[0]['id']}", headers=auth(tokens["viewer"])
    )
    assert [m.get("text") for m in receive_all(again)] == ["second", "third", None]


def test_a_log_websocket_refuses_another_origin_and_closes_when_its_token_is_revoked(
    client: Client, web_client: Client, served: str, tokens: dict[str, str]
) -> None:
    job = client.submit(["true"], labels={"zone": "mars"})  # waits: nothing ends it
    url = f"ws://{served}/ws/jobs/{job.id}/logs"
    with pytest.raises(Refused):
        Client_.connect(url, headers={**auth(tokens["viewer"]), "Origin": "http://evil.example"})
    with pytest.raises(Refused):
        Client_.connect(url)
    with pytest.raises(Refused):
        Client_.connect(url, headers=auth(tokens["metrics"]))
    ws = Client_.connect(url, headers={**auth(tokens["viewer"]), "Origin": f"http://{served}"})
    time.sleep(0.3)
    Service(web_client).revoke_token("t-viewer")
    started = time.monotonic()

    def drain() -> None:
        while time.monotonic() - started < 10:
            ws.receive(timeout=1)

    with pytest.raises(ConnectionClosed):
        drain()
    assert time.monotonic() - started < 3


def test_metrics_for_prometheus(
    client: Client, workers: Workers, http: FlaskClient, tokens: dict[str, str]
) -> None:
    workers.start("w1", 2, "--fake-gpus", json.dumps([{"name": "NVIDIA A100", "memory_gb": 80}]))
    assert client.submit(["true"]).wait(30).state is JobState.SUCCEEDED
    client.submit(["true"], labels={"zone": "mars"})
    for role in ("metrics", "admin"):
        answer = http.get("/metrics", headers=auth(tokens[role]))
        assert answer.status_code == 200
    text = answer.get_data(as_text=True)
    assert answer.mimetype == "text/plain"
    lines = set(text.splitlines())
    assert 'gpulayer_jobs{state="succeeded"} 1.0' in lines
    assert 'gpulayer_jobs{state="queued"} 1.0' in lines
    assert "gpulayer_workers 1.0" in lines
    assert 'gpulayer_worker_cpu_slots{use="free",worker="w1"} 2.0' in lines
    assert 'gpulayer_worker_gpus{use="free",worker="w1"} 1.0' in lines
    assert any(line.startswith("gpulayer_queue_depth{queue=") and line.endswith(" 1.0") for line in lines)
    assert http.get("/metrics", headers=auth(tokens["viewer"])).status_code == 403


def test_a_browser_logs_in_with_a_token_and_its_session_needs_csrf_for_changes(
    web_client: Client, http: FlaskClient, tokens: dict[str, str]
) -> None:
    assert http.post("/login", json={"token": "glt_wrong"}).status_code == 401
    answer = http.post("/login", data={"token": tokens["submitter"]})
    assert answer.status_code == 200
    assert answer.json is not None
    csrf = answer.json["csrf_token"]
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert tokens["submitter"] not in cookie
    assert http.get("/api/v1/jobs").status_code == 200
    refused = http.post("/api/v1/jobs", json={"command": ["true"]})
    assert (refused.status_code, refused.json) == (
        403,
        {"error": "missing or wrong CSRF token (X-CSRF-Token header or csrf_token field)"},
    )
    assert (
        http.post("/api/v1/jobs", json={"command": ["true"]}, headers={"X-CSRF-Token": "nope"}).status_code
        == 403
    )
    assert (
        http.post("/api/v1/jobs", json={"command": ["true"]}, headers={"X-CSRF-Token": csrf}).status_code
        == 201
    )
    Service(web_client).revoke_token("t-submitter")
    assert http.get("/api/v1/jobs").status_code == 401
    assert http.post("/logout").status_code == 200


def test_failed_logins_are_limited_per_address(http: FlaskClient, tokens: dict[str, str]) -> None:
    for _ in range(10):
        assert http.post("/login", json={"token": "glt_guess"}).status_code == 401
    answer = http.post("/login", json={"token": tokens["viewer"]})
    assert answer.status_code == 429
    assert answer.json is not None
    assert answer.json["error"].startswith("too many failed logins from 127.0.0.1")


def test_the_openapi_document_lists_exactly_the_routes_the_app_serves(app: Flask, http: FlaskClient) -> None:
    document = http.get("/api/v1/openapi.json").json
    assert document is not None
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    served = {
        (method, path.replace("0123456789ab", "{job_id}").replace("nobody", "{name}"))
        for method, path, role, _ in routes(app)
        if path.startswith("/api/v1/") and role is not None
    }
    assert listed == served


def test_every_route_answers_as_its_document_says_whatever_it_is_sent(
    app: Flask, tokens: dict[str, str]
) -> None:
    """Schemathesis sends each operation what its document allows (and more): no 5xx, only
    documented statuses and content types, answers that match their schemas."""
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 15
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=25, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck)
        )
        def fuzz(case: Any) -> None:
            # A job is checked further than a JSON schema says (NUL bytes, variable names, output
            # paths...): a schema-valid body may still be a 400. Everything else is held to.
            case.call_and_validate(
                headers=auth(tokens["admin"]), excluded_checks=[schemathesis.checks.positive_data_acceptance]
            )

        fuzz()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_multipart_submit_ships_the_source_folder_and_input_files(
    app: Flask, client: Client, workers: Workers, http: FlaskClient, tokens: dict[str, str]
) -> None:
    workers.start("w1", 1)
    spec = json.dumps({"command": "sh run.sh", "name": "uploaded"})
    source = tar_gz(
        {"run.sh": b"cat lib/greeting.txt data.txt\n", "lib/greeting.txt": b"hello from source\n"}
    )

    def post(**fields: Any) -> Any:
        return http.post(
            "/api/v1/jobs", headers=auth(tokens["submitter"]), data=fields, content_type="multipart/form-data"
        )

    answer = post(
        spec=spec,
        source=(io.BytesIO(source), "project.tar.gz"),
        inputs=[(io.BytesIO(b"and an input\n"), "data.txt")],
    )
    assert answer.status_code == 201, answer.json
    job = client.get(answer.json["id"])
    assert job.wait(30).state is JobState.SUCCEEDED
    assert [line.text for line in job.logs()] == ["hello from source", "and an input"]

    # Refused whole, one line each, and no job written.
    escaping = tar_gz({"../outside.sh": b"true\n"})
    refusals = {
        "spec": post(spec="not json"),
        "source": post(spec=spec, source=(io.BytesIO(escaping), "bad.tar.gz")),
        "garbled": post(spec=spec, source=(io.BytesIO(b"not an archive"), "bad.tar.gz")),
        "twice": post(spec=spec, inputs=[(io.BytesIO(b"1"), "a.txt"), (io.BytesIO(b"2"), "a.txt")]),
    }
    for what, refused in refusals.items():
        assert refused.status_code == 400, what
        assert "\n" not in refused.json["error"], what
    assert "outside" in refusals["source"].json["error"]
    app.config["MAX_CONTENT_LENGTH"] = 1000
    assert post(spec=spec, inputs=[(io.BytesIO(b"x" * 5000), "big.bin")]).status_code == 413
    assert [record.id for record in client.jobs()] == [job.id]
