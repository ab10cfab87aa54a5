"""Red-team tests of the HTTP server's sessions and transport, against the real app, a real Redis and
`gpulayer server` as a real process: what an attacker holding a copy of Redis, a saved cookie, an
expiring token or a forged header can and cannot do."""

from __future__ import annotations

import datetime
import gzip
import http.client
import json
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx2
import psutil
import pytest
import redis
from click.testing import Result
from flask import Flask
from flask.sessions import SecureCookieSessionInterface
from flask.testing import FlaskClient
from simple_websocket import Client as WebSocket
from simple_websocket import ConnectionClosed
from werkzeug.test import TestResponse

from gpulayer import Client, tls
from gpulayer import access as accesses
from gpulayer.network import free_port
from gpulayer.requirements import Requirements
from gpulayer.service import Service
from gpulayer.store.tokens import SESSION_LIFETIME, token_hash
from gpulayer.web import create_app
from gpulayer.web.api import SubmitRequest
from gpulayer.web.auth import SESSION_COOKIE
from tests.conftest import auth, submit_keywords, wait_for

#: A generous wait (s) for a socket to close or a server to answer.
WAIT = 30.0


def session_cookie(answer: TestResponse) -> str:
    """The session id a login answered with."""
    morsel = SimpleCookie(answer.headers["Set-Cookie"])[SESSION_COOKIE]
    return morsel.value


def with_cookie(app: Flask, value: str) -> FlaskClient:
    """A fresh browser that holds only this session cookie."""
    browser = app.test_client()
    browser.set_cookie(SESSION_COOKIE, value)
    return browser


def session_keys(raw_redis: redis.Redis, web_client: Client) -> list[bytes]:
    return list(raw_redis.scan_iter(match=web_client.keys.session("*")))


# --- what a copy of Redis is worth -----------------------------------------------------------------
def everything_under_auth(raw_redis: redis.Redis, web_client: Client) -> set[str]:
    """Every piece of text Redis holds in the auth namespace: each key's last part, each value, each
    hash field, each string inside a JSON value. What someone with a copy of the AOF would try."""
    found: set[str] = set()
    for raw_key in raw_redis.scan_iter(match=web_client.keys.auth + "*"):
        key = raw_key.decode()
        found.update({key, key.rsplit(":", 1)[-1]})
        kind = cast(bytes, raw_redis.type(key)).decode()
        if kind == "string":
            values = [cast(bytes, raw_redis.get(key))]
        elif kind == "hash":
            pairs = cast(dict[bytes, bytes], raw_redis.hgetall(key))
            values = [*pairs, *pairs.values()]
        else:
            raise AssertionError(f"{key} is a {kind}: read it here too")
        for value in values:
            text = value.decode()
            found.add(text)
            found.update(json_strings(text))
    return found


def json_strings(text: str) -> list[str]:
    try:
        data = json.loads(text)
    except ValueError:
        return []
    return [str(v) for v in data.values()] if isinstance(data, dict) else []


def flask_cookie(secret: str, token_digest: str) -> str:
    """The session cookie the old server would have taken, signed with ``secret``."""
    forger = Flask("forger")
    forger.secret_key = secret
    serializer = SecureCookieSessionInterface().get_signing_serializer(forger)
    assert serializer is not None
    return serializer.dumps({"token": token_digest, "csrf": "forged"})


def test_a_cookie_forged_from_everything_a_copy_of_redis_holds_does_not_log_in_while_the_real_one_does(
    app: Flask, http: FlaskClient, tokens: dict[str, str], web_client: Client, raw_redis: redis.Redis
) -> None:
    real = session_cookie(http.post("/login", json={"token": tokens["admin"]}))
    http.post("/login", json={"token": "glt_wrong"})  # a login-failure counter, too
    loot = everything_under_auth(raw_redis, web_client)
    assert session_keys(raw_redis, web_client), "the session's record is in Redis"
    assert real not in loot, "Redis holds the cookie itself"
    admin_digest = token_hash(tokens["admin"])
    assert admin_digest in loot  # what the old server's cookies carried, signed
    for guess in sorted(loot):
        forged = [guess, flask_cookie(guess, admin_digest)]
        for cookie in forged:
            answer = with_cookie(app, cookie).get("/api/v1/session")
            assert answer.status_code == 401, (guess, answer.json)
            assert with_cookie(app, cookie).get("/api/v1/tokens").status_code == 401
    who = with_cookie(app, real).get("/api/v1/session")
    assert who.status_code == 200
    assert who.json is not None
    assert (who.json["name"], who.json["role"]) == ("t-admin", "admin")


def test_the_session_cookie_is_httponly_strict_and_lasts_twelve_hours_at_most_never_past_its_token(
    http: FlaskClient, web_client: Client, raw_redis: redis.Redis
) -> None:
    forever, _ = Service(web_client).create_token("forever", "viewer")
    answer = http.post("/login", json={"token": forever})
    morsel = SimpleCookie(answer.headers["Set-Cookie"])[SESSION_COOKIE]
    assert (morsel["httponly"], morsel["samesite"], morsel["path"], morsel["secure"]) == (
        True,
        "Strict",
        "/",
        "",
    )
    assert int(morsel["max-age"]) == SESSION_LIFETIME
    [key] = session_keys(raw_redis, web_client)
    assert SESSION_LIFETIME * 1000 - 60_000 < raw_redis.pttl(key) <= SESSION_LIFETIME * 1000
    assert set(json.loads(cast(bytes, raw_redis.get(key)))) == {"token", "csrf_token"}
    # A token with a minute left makes a session of a minute at most.
    brief, _ = Service(web_client).create_token("brief", "viewer", expires_in=60)
    short = SimpleCookie(http.post("/login", json={"token": brief}).headers["Set-Cookie"])[SESSION_COOKIE]
    assert int(short["max-age"]) <= 60
    [key] = session_keys(raw_redis, web_client)  # logging in again ended the browser's first session
    assert 0 < raw_redis.pttl(key) <= 60_000


# --- sessions end on the server --------------------------------------------------------------------
def test_logout_ends_the_session_on_the_server_so_a_cookie_saved_before_gets_401_after(
    app: Flask, http: FlaskClient, tokens: dict[str, str], web_client: Client, raw_redis: redis.Redis
) -> None:
    answer = http.post("/login", json={"token": tokens["submitter"]})
    saved, csrf = session_cookie(answer), cast(dict[str, str], answer.json)["csrf_token"]
    assert with_cookie(app, saved).get("/api/v1/jobs").status_code == 200
    out = http.post("/logout")
    assert out.status_code == 200
    cleared = SimpleCookie(out.headers["Set-Cookie"])[SESSION_COOKIE]
    assert (cleared.value, cleared["max-age"]) == ("", "0")
    assert session_keys(raw_redis, web_client) == []
    assert with_cookie(app, saved).get("/api/v1/jobs").status_code == 401
    refused = with_cookie(app, saved).post(
        "/api/v1/jobs", json={"command": ["true"]}, headers={"X-CSRF-Token": csrf}
    )
    assert refused.status_code == 401
    assert refused.json == {"error": "the session has ended (logged out or too old); log in again"}


def test_revoking_a_token_ends_every_session_opened_with_it(
    app: Flask, tokens: dict[str, str], web_client: Client, raw_redis: redis.Redis
) -> None:
    laptop, phone = app.test_client(), app.test_client()
    for browser in (laptop, phone):
        assert browser.post("/login", json={"token": tokens["viewer"]}).status_code == 200
        assert browser.get("/api/v1/session").status_code == 200
    assert len(session_keys(raw_redis, web_client)) == 2
    Service(web_client).revoke_token("t-viewer")
    for browser in (laptop, phone):
        answer = browser.get("/api/v1/session")
        assert (answer.status_code, answer.json) == (
            401,
            {"error": "the session's token is revoked or expired; log in again"},
        )
        assert SimpleCookie(answer.headers["Set-Cookie"])[SESSION_COOKIE].value == ""
    assert session_keys(raw_redis, web_client) == []


# --- websockets do not outlive what let them in ----------------------------------------------------
def closed(ws: Any) -> ConnectionClosed:
    """Read (and drop) messages until the server closes the socket; the close."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            ws.receive(timeout=1)
        except ConnectionClosed as close:
            return close
    raise AssertionError(f"the socket was still open after {WAIT} s")


def test_a_websocket_opened_with_a_token_that_expires_is_closed_with_1008_once_it_has(
    served: str, web_client: Client
) -> None:
    brief, info = Service(web_client).create_token("brief", "viewer", expires_in=2)
    assert info.expires_at is not None
    ws = WebSocket.connect(f"ws://{served}/ws/events", headers=auth(brief))
    assert ws.receive(timeout=0.2) is None  # let in, and open
    close = closed(ws)
    assert datetime.datetime.now(datetime.timezone.utc) >= info.expires_at
    assert (close.reason, close.message) == (1008, "token expired")


def test_a_websocket_opened_through_a_browser_session_is_closed_with_1008_when_it_logs_out(
    app: Flask, served: str, tokens: dict[str, str]
) -> None:
    browser = app.test_client()
    cookie = session_cookie(browser.post("/login", json={"token": tokens["viewer"]}))
    ws = WebSocket.connect(f"ws://{served}/ws/events", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
    assert ws.receive(timeout=0.2) is None
    assert browser.post("/logout").status_code == 200
    close = closed(ws)
    assert (close.reason, close.message) == (1008, "session ended")


# --- the login limit and proxies -------------------------------------------------------------------
def test_failed_logins_are_counted_by_socket_address_so_a_new_x_forwarded_for_each_time_dodges_nothing(
    http: FlaskClient, tokens: dict[str, str], web_client: Client, raw_redis: redis.Redis
) -> None:
    for n in range(10):
        forged = {"X-Forwarded-For": f"198.51.100.{n}"}
        assert http.post("/login", json={"token": "glt_guess"}, headers=forged).status_code == 401
    answer = http.post(
        "/login", json={"token": tokens["viewer"]}, headers={"X-Forwarded-For": "198.51.100.99"}
    )
    assert answer.status_code == 429
    assert cast(dict[str, str], answer.json)["error"].startswith("too many failed logins from 127.0.0.1")
    counted = raw_redis.scan_iter(match=web_client.keys.login_failures("*"))
    assert [key.decode() for key in counted] == [web_client.keys.login_failures("127.0.0.1")]


def test_behind_a_proxy_failed_logins_are_counted_by_the_address_it_forwards_and_cookies_are_secure(
    web_client: Client, tokens: dict[str, str], raw_redis: redis.Redis
) -> None:
    http = create_app(web_client, behind_proxy=True).test_client()

    def through_proxy(client_address: str, claimed: str = "") -> dict[str, str]:
        # The proxy appends the address it saw to whatever the client sent: only the last is trusted.
        forwarded = f"{claimed}, {client_address}" if claimed else client_address
        return {"X-Forwarded-For": forwarded, "X-Forwarded-Proto": "https"}

    for n in range(10):
        headers = through_proxy("203.0.113.7", claimed=f"10.0.0.{n}")
        assert http.post("/login", json={"token": "glt_guess"}, headers=headers).status_code == 401
    refused = http.post("/login", json={"token": tokens["viewer"]}, headers=through_proxy("203.0.113.7"))
    assert refused.status_code == 429
    assert cast(dict[str, str], refused.json)["error"].startswith("too many failed logins from 203.0.113.7")
    other = http.post("/login", json={"token": tokens["viewer"]}, headers=through_proxy("203.0.113.8"))
    assert other.status_code == 200
    assert SimpleCookie(other.headers["Set-Cookie"])[SESSION_COOKIE]["secure"] is True
    counted = raw_redis.scan_iter(match=web_client.keys.login_failures("*"))
    assert [key.decode() for key in counted] == [web_client.keys.login_failures("203.0.113.7")]


def test_failed_bearer_tokens_count_toward_the_login_limit_and_past_it_both_get_429(
    web_server: tuple[str, Client], raw_redis: redis.Redis
) -> None:
    address, web = web_server
    viewer, _ = Service(web).create_token("viewer", "viewer")

    def jobs(token: str) -> int:
        return status_of(urllib.request.Request(f"http://{address}/api/v1/jobs", headers=auth(token)))

    def login(token: str) -> int:
        body = json.dumps({"token": token}).encode()
        headers = {"Content-Type": "application/json"}
        return status_of(urllib.request.Request(f"http://{address}/login", data=body, headers=headers))

    assert (jobs(viewer), login(viewer)) == (200, 200)
    for guess in range(5):
        assert jobs(f"glt_guess-{guess}") == 401
        assert login(f"glt_guess-login-{guess}") == 401
    # Ten wrong guesses, half of each kind: the right token, sent either way, is refused for the window.
    assert (jobs(viewer), login(viewer), jobs("glt_another-guess")) == (429, 429, 429)
    assert int(cast(bytes, raw_redis.get(web.keys.login_failures("127.0.0.1")))) == 10


def status_of(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


# --- login CSRF ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sent",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame's, or a data: page's
        {"Origin": "http://localhost.evil.example"},
        {"Referer": "http://evil.example/login-csrf.html"},
    ],
)
def test_a_login_posted_by_another_sites_page_is_refused_and_sets_no_cookie(
    http: FlaskClient,
    tokens: dict[str, str],
    web_client: Client,
    raw_redis: redis.Redis,
    sent: dict[str, str],
) -> None:
    """Login CSRF: a page elsewhere posts the attacker's own token to /login, and the browser would
    then use the attacker's session (what it submits, the attacker reads). A browser names the page
    it posts from in Origin (or, older ones, in Referer)."""
    answer = http.post("/login", data={"token": tokens["viewer"]}, headers=sent)
    assert answer.status_code == 403
    assert cast(dict[str, str], answer.json)["error"].startswith("logins from ")
    assert "Set-Cookie" not in answer.headers
    assert session_keys(raw_redis, web_client) == []
    # The server's own page (the Flask test client's host is localhost), and a program sending none.
    for own in ({"Origin": "http://localhost"}, {"Referer": "http://localhost/"}, {}):
        answer = http.post("/login", data={"token": tokens["viewer"]}, headers=own)
        assert answer.status_code == 200, own
        assert session_cookie(answer)


# --- what a request can reach ----------------------------------------------------------------------
def post_json(url: str, token: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={**auth(token), "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def test_a_submit_naming_the_servers_own_files_is_refused_and_queues_nothing(
    web_server: tuple[str, Client], raw_redis: redis.Redis
) -> None:
    """The exploit as reported: a submitter's API token named files of the web server's machine
    (its own access, the home, /etc/shadow) among a job's requirements, and the server packed them
    into the job."""
    address, web = web_server
    token, _ = Service(web).create_token("attacker", "submitter")
    home = web.settings.home
    assert (home / "access" / "web.json").exists()
    before = (raw_redis.dbsize(), web.jobs())
    for body in (
        {"command": ["cat", "web.json"], "requirements": {"inputs": [str(home / "access" / "web.json")]}},
        {"command": ["cat", "shadow"], "requirements": {"inputs": ["/etc/shadow"]}},
        {"command": ["ls", "-R"], "requirements": {"source": str(home)}},
        {"command": ["ls", "-R"], "source": str(home)},
        {"command": ["cat", "shadow"], "inputs": ["/etc/shadow"]},
        [{"command": ["cat", "shadow"], "requirements": {"inputs": ["/etc/shadow"]}}],
    ):
        status, answer = post_json(f"http://{address}/api/v1/jobs", token, body)
        assert status == 400, (body, answer)
        assert "\n" not in answer["error"]
        assert "Extra inputs are not permitted" in answer["error"], answer
    assert (raw_redis.dbsize(), web.jobs()) == before


def test_no_keyword_of_client_submit_passes_where_the_api_body_does_not_carry_it(
    http: FlaskClient, tokens: dict[str, str], web_client: Client, raw_redis: redis.Redis
) -> None:
    """Inside requirements, only Requirements' fields; at the top level, only the body's own: not
    source or inputs (files come only as uploads), nor a requirement. For a single job, a list, and
    the multipart form's spec alike."""
    path = str(web_client.settings.home / "access" / "web.json")  # what each keyword is sent
    inside = submit_keywords() - set(Requirements.model_fields)
    on_top = submit_keywords() - set(SubmitRequest.model_fields)
    assert {"source", "inputs", "requirements", "command"} <= inside
    assert {"source", "inputs", "gpus", "labels"} <= on_top
    bodies = [{"command": ["true"], "requirements": {keyword: path}} for keyword in sorted(inside)]
    bodies += [{"command": ["true"], keyword: path} for keyword in sorted(on_top)]
    submitter = auth(tokens["submitter"])
    before = raw_redis.dbsize()
    for body in bodies:
        for answer in (
            http.post("/api/v1/jobs", json=body, headers=submitter),
            http.post("/api/v1/jobs", json=[{"command": ["true"]}, body], headers=submitter),
            http.post(
                "/api/v1/jobs",
                data={"spec": json.dumps(body)},
                headers=submitter,
                content_type="multipart/form-data",
            ),
        ):
            assert answer.status_code == 400, (body, answer.json)
            error = cast(dict[str, str], answer.json)["error"]
            assert "Extra inputs are not permitted" in error, (body, error)
            assert "\n" not in error
    assert raw_redis.dbsize() == before
    assert web_client.jobs() == []


def long_name_bomb(size: int) -> bytes:
    """A gzip tar archive whose one header says a GNU long name of ``size`` bytes follows, and does:
    gzip members of 1 MiB each, made once (what tarfile read into one bytes object, whole)."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, size
    mebibyte = gzip.compress(b"a" * (1 << 20), 9)
    return gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT)) + mebibyte * (size >> 20)


def server_processes(port: int) -> list[psutil.Process]:
    """The `gpulayer server --port PORT` this test started, and its gunicorn worker."""
    for child in psutil.Process().children():
        try:
            command = child.cmdline()
        except psutil.Error:  # another test's process, ended and not yet reaped
            continue
        if command[-2:] == ["--port", str(port)]:
            return [child, *child.children(recursive=True)]
    raise AssertionError(f"no server on port {port} among this test's processes")


def peak_rise(processes: list[psutil.Process], action: Callable[[], object]) -> int:
    """How far (bytes) the processes' memory, together, rose above where it rested while ``action``
    ran: each one's peak resident size (VmHWM, reset first) less its resident size before."""
    resting = {process.pid: process.memory_info().rss for process in processes}
    for process in processes:
        Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # the peak is now what it holds
    action()
    return sum(peak(process.pid) - resting[process.pid] for process in processes)


def peak(pid: int) -> int:
    [line] = [
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:")
    ]
    return int(line.split()[1]) * 1024


def test_a_megabyte_upload_holding_a_gibibyte_long_name_is_refused_in_a_few_megabytes_of_memory(
    web_server: tuple[str, Client], raw_redis: redis.Redis
) -> None:
    address, web = web_server
    token, _ = Service(web).create_token("uploader", "submitter")
    bomb = long_name_bomb(1 << 30)
    assert len(bomb) < 1_200_000
    answers: list[httpx2.Response] = []

    def upload(archive: bytes) -> None:
        files = {"source": ("source.tar.gz", archive, "application/gzip")}
        answers.append(
            httpx2.post(
                f"http://{address}/api/v1/jobs",
                headers=auth(token),
                data={"spec": json.dumps({"command": ["true"]})},
                files=files,
                timeout=WAIT * 4,
            )
        )

    upload(long_name_bomb(1 << 20))  # the same path once first: what it imports is part of its rest
    before = raw_redis.dbsize()
    rise = peak_rise(server_processes(int(address.rsplit(":", 1)[1])), lambda: upload(bomb))
    assert [answer.status_code for answer in answers] == [400, 400]
    assert answers[-1].json() == {
        "error": "source: an archive header carries 1.0 GiB of metadata, above the 64.0 KiB cap"
    }
    assert rise < 100 * 1024 * 1024, f"{rise / 2**20:.0f} MiB"
    assert raw_redis.dbsize() == before


# --- `gpulayer server` -----------------------------------------------------------------------------
def test_the_server_refuses_plain_http_on_a_public_address_in_one_line_unless_told_it_is_safe(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    for args in (["--host", "0.0.0.0"], ["--host", "::"], ["--host", "192.0.2.1", "--port", "8443"]):
        refused = cli("server", *args)
        assert refused.exit_code != 0, args
        assert len(refused.output.strip().splitlines()) == 1, refused.output
        assert refused.output.startswith("Error: refusing to serve plain HTTP on "), refused.output
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate")
    for args in (["--tls-cert", str(cert)], ["--tls-cert", str(cert), "--tls-key", str(cert)]):
        refused = cli("server", "--host", "0.0.0.0", *args)
        assert refused.exit_code != 0, args
        assert len(refused.output.strip().splitlines()) == 1, refused.output


def started(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:
        return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)


def stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    server.wait(20)


def answers(url: str, server: subprocess.Popen[bytes], log: Path, **options: Any) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, **options):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, ConnectionError):
        assert server.poll() is None, log.read_text()
        return False


def test_insecure_lets_the_server_serve_plain_http_on_every_address(
    env: dict[str, str], tmp_path: Path
) -> None:
    port, log = free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "gpulayer", "server", "--host", "0.0.0.0", "--port", str(port)]
    server = started([*command, "--insecure"], env, log)
    try:
        url = f"http://127.0.0.1:{port}/api/v1/openapi.json"
        wait_for(lambda: answers(url, server, log), timeout=WAIT, what="the server to answer")
    finally:
        stop(server)


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for localhost and 127.0.0.1 (made as `gpulayer up` makes
    Redis's): (CA, cert, key)."""
    made = tls.ensure(tmp_path / "tls", ["localhost", "127.0.0.1"])
    return made.ca, made.cert, made.key


def test_with_a_certificate_the_server_answers_over_https_and_its_login_cookie_is_secure(
    env: dict[str, str],
    home: Path,
    web_client: Client,
    certificates: tuple[Path, Path, Path],
    tmp_path: Path,
) -> None:
    ca, cert, key = certificates
    token, _ = Service(web_client).create_token("over-tls", "viewer")
    port, log = free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "gpulayer", "server", "--port", str(port)]
    server = started([*command, "--tls-cert", str(cert), "--tls-key", str(key)], env, log)
    trusting = ssl.create_default_context(cafile=str(ca))
    base = f"https://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: answers(f"{base}/api/v1/openapi.json", server, log, context=trusting),
            timeout=WAIT,
            what="the server to answer over https",
        )
        login = urllib.request.Request(
            f"{base}/login",
            data=json.dumps({"token": token}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(login, timeout=5, context=trusting) as answer:
            assert json.load(answer)["name"] == "over-tls"
            morsel = SimpleCookie(answer.headers["Set-Cookie"])[SESSION_COOKIE]
        assert (morsel["secure"], morsel["httponly"], morsel["samesite"]) == (True, True, "Strict")
        jobs = urllib.request.Request(f"{base}/api/v1/jobs", headers=auth(token))
        with urllib.request.urlopen(jobs, timeout=5, context=trusting) as answer:
            assert answer.status == 200
        # A client that does not trust the test's CA does not talk to it; nor does plain HTTP.
        with pytest.raises(urllib.error.URLError) as untrusted:
            urllib.request.urlopen(jobs, timeout=5, context=ssl.create_default_context())
        assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=5)
    finally:
        stop(server)
    banner = log.read_text().splitlines()[0]
    assert banner.startswith(f"serving the GPUlayer API and dashboard on https://127.0.0.1:{port}/")
    web_access = accesses.load(home, "web")
    assert web_access is not None
    password = urlsplit(web_access.redis_url).password
    assert password
    assert password not in log.read_text()
    assert banner.endswith(f", as {accesses.describe(web_access)}")
