"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against `gpulayer server`
and a real worker with simulated GPUs. Logging in, submitting, live logs, cancelling, the workers and
activity pages, and what a viewer is not offered.

One server, one worker and one browser serve the whole module (each test gets a fresh browser
context, so a fresh session). Each test leaves screenshots in its tmp_path and in
test-output/browser/ at the repository's root."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from gpulayer import Client, JobState, Settings
from gpulayer import access as accesses
from gpulayer.network import free_port
from gpulayer.provisioned import Decision, Machine
from gpulayer.service import Service
from tests.conftest import Hub, Workers, wait_for

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "needs Debian's Chromium at /usr/bin/chromium (apt install chromium)", allow_module_level=True
    )
pytest.importorskip("playwright", reason="needs the playwright package (the dev extras)")

from playwright.sync_api import Browser, Page, Route, expect, sync_playwright  # noqa: E402

#: Where screenshots are copied for people to look at (ignored by git).
OUTPUT = Path(__file__).resolve().parents[1] / "test-output" / "browser"
#: The machine running the tests may be slow: every wait for the page allows this long (ms).
WAIT_MS = 30_000
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAKE_GPUS = [{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}, {"name": "NVIDIA L4", "memory_gb": 24}]

expect.set_options(timeout=WAIT_MS)


@dataclass
class Stack:
    url: str
    client: Client
    #: A working token of each role the dashboard serves, by role.
    tokens: dict[str, str]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.fixture(scope="module")
def stack(redis_server: str, session_hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`gpulayer server` and a worker named gpu-box with two simulated GPUs, for the whole module.
    (Not conftest's `redis_url`, `client` and `workers`, which start afresh for every test: one
    server and worker for the module keeps it quick. Nothing else uses Redis while it runs.)"""
    connection = redis.Redis.from_url(redis_server)
    connection.flushall()
    connection.close()
    session_hub.publish()
    base = tmp_path_factory.mktemp("browser")
    # The server and the worker each in its role.
    accesses.save(base / "home", session_hub.installation.access("web"))
    accesses.save(base / "home", session_hub.worker)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("GPULAYER_REDIS_URL", accesses.TOKEN_VARIABLE)},
        "GPULAYER_HOME": str(base / "home"),
        "GPULAYER_KILL_GRACE_SECONDS": "2",
        # Samples every second, so the charts and sparklines have some within a test.
        "GPULAYER_TELEMETRY_INTERVAL": "1",
    }
    client = Client(settings=Settings(home=base / "home"), access=accesses.load(base / "home", "web"))
    workers = Workers(client, env, base / "worker-logs")
    url = f"http://127.0.0.1:{free_port()}"
    with open(base / "server.log", "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "server", "--port", url.rsplit(":", 1)[1]],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        workers.start("gpu-box", 4, "--fake-gpus", json.dumps(FAKE_GPUS))

        def ready() -> bool:
            assert server.poll() is None, (base / "server.log").read_text()
            return _answers(url)

        wait_for(ready, what="the server to answer")
        tokens = {
            role: Service(client).create_token(f"browser-{role}", role)[0]
            for role in ("admin", "submitter", "viewer")
        }
        yield Stack(url, client, tokens)
    finally:
        server.terminate()
        server.wait(20)
        workers.stop_all()
        client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, stack: Stack) -> Iterator[Page]:
    """A fresh context (no session, light system theme). Fails the test on any script error or
    Content-Security-Policy violation the page reports."""
    context = browser.new_context(base_url=stack.url, viewport={"width": 1360, "height": 860})
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    opened.on(
        "console",
        lambda message: problems.append(message.text) if "Content Security Policy" in message.text else None,
    )
    yield opened
    context.close()
    assert not problems


@pytest.fixture
def shot(page: Page, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., None]:
    """Screenshot the page as <test name>[-suffix].png."""

    def take(suffix: str = "") -> None:
        name = request.node.name + (f"-{suffix}" if suffix else "")
        path = tmp_path / f"{name}.png"
        page.screenshot(path=path, full_page=True)
        OUTPUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, OUTPUT / path.name)

    return take


def log_in(page: Page, token: str) -> None:
    page.goto("/")
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("login-button").click()
    expect(page.get_by_test_id("topbar")).to_be_visible()


def test_a_bad_token_is_refused_with_its_reason_and_a_good_one_logs_in(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    page.goto("/")
    page.get_by_test_id("token-input").fill("glt_not-a-token")
    page.get_by_test_id("login-button").click()
    expect(page.get_by_test_id("login-error")).to_have_text("the token is unknown, revoked or expired")
    shot("refused")
    page.get_by_test_id("token-input").fill(stack.tokens["admin"])
    page.get_by_test_id("login-button").click()
    expect(page.get_by_test_id("whoami")).to_contain_text("browser-admin")
    expect(page.get_by_test_id("role")).to_have_text("admin")
    # The session outlives a reload: the page asks /api/v1/session when it opens.
    page.reload()
    expect(page.get_by_test_id("role")).to_have_text("admin")
    expect(page.get_by_test_id("jobs-table")).to_be_visible()
    shot()
    page.get_by_test_id("logout").click()
    expect(page.get_by_test_id("login-form")).to_be_visible()
    page.reload()
    expect(page.get_by_test_id("login-form")).to_be_visible()


def test_a_job_submitted_from_the_form_appears_in_the_table_and_succeeds(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    log_in(page, stack.tokens["submitter"])
    form = page.get_by_test_id("submit-form")
    form.get_by_test_id("submit-command").fill("echo 'hello from the browser'")
    form.get_by_test_id("submit-name").fill("from-the-form")
    form.get_by_test_id("submit-button").click()
    row = page.get_by_test_id("job-row").filter(has_text="from-the-form")
    expect(row).to_have_count(1)
    expect(row.get_by_test_id("state")).to_have_text("succeeded")
    job_id = row.get_attribute("data-id")
    assert job_id is not None
    assert stack.client.get(job_id).status().command == ["echo", "hello from the browser"]
    # A refused job says why, in the form.
    form.get_by_test_id("submit-cpus").fill("5000")
    form.get_by_test_id("submit-button").click()
    expect(form.get_by_test_id("submit-error")).to_contain_text("cpus")
    shot()


def test_log_lines_arrive_on_the_job_page_as_the_job_prints_them(
    page: Page, stack: Stack, shot: Callable[..., None], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = (
        f"echo waiting; while [ ! -e {go} ]; do sleep 0.1; done; "
        "for i in 1 2 3 4 5; do echo line $i; done; echo oops >&2"
    )
    job = stack.client.submit(["sh", "-c", script], name="printer")
    log_in(page, stack.tokens["viewer"])
    page.goto(f"/#/jobs/{job.id}")
    lines = page.get_by_test_id("log-line")
    expect(lines).to_have_count(1)
    expect(lines.first).to_contain_text("waiting")
    expect(page.get_by_test_id("job-state")).to_have_text("running")
    expect(page.get_by_test_id("log-status")).to_have_text("live")
    # The job goes on only now, so what follows can only arrive live.
    go.touch()
    expect(lines).to_have_count(7)
    expect(lines.nth(5)).to_contain_text("line 5")
    expect(lines.last).to_have_class(re.compile(r"\bstderr\b"))
    expect(page.get_by_test_id("log-status")).to_have_text("ended · succeeded")
    expect(page.get_by_test_id("job-state")).to_have_text("succeeded")
    # What it used, as its worker measured it.
    expect(page.get_by_test_id("job-cpu")).to_have_text(re.compile(r"^\d+\.\d\d s$"))
    expect(page.get_by_test_id("job-peak-memory")).to_have_text(re.compile(r"^\d+(\.\d)? (KiB|MiB)$"))
    expect(page.get_by_test_id("job-peak-gpu-memory")).to_have_count(0)  # no GPU
    shot()


def test_a_gang_jobs_log_shows_all_ranks_or_one(page: Page, stack: Stack, shot: Callable[..., None]) -> None:
    job = stack.client.submit(
        ["sh", "-c", 'echo "hello from rank $RANK"'], name="gang", nodes=1, procs_per_node=2
    )
    assert job.wait(30).state is JobState.SUCCEEDED
    log_in(page, stack.tokens["viewer"])
    page.goto(f"/#/jobs/{job.id}")
    lines = page.get_by_test_id("log-line")
    expect(lines.filter(has_text="hello from rank")).to_have_count(2)
    page.get_by_test_id("rank-select").select_option("1")
    expect(lines.filter(has_text="hello from rank")).to_have_count(1)
    expect(lines.filter(has_text="hello from rank")).to_contain_text("hello from rank 1")
    shot()


def test_a_running_job_is_cancelled_from_its_page(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    job = stack.client.submit(["sleep", "120"], name="to-cancel")
    wait_for(lambda: job.status().state is JobState.RUNNING, what="the job to run")
    log_in(page, stack.tokens["submitter"])
    page.goto(f"/#/jobs/{job.id}")
    expect(page.get_by_test_id("job-state")).to_have_text("running")
    page.get_by_test_id("cancel").click()
    expect(page.get_by_test_id("job-state")).to_have_text("cancelled")
    expect(page.get_by_test_id("cancel")).to_have_count(0)
    assert job.status().state is JobState.CANCELLED
    shot()


def test_the_workers_page_shows_the_worker_its_simulated_gpus_and_its_telemetry(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    log_in(page, stack.tokens["viewer"])
    page.get_by_test_id("nav-workers").click()
    card = page.get_by_test_id("worker-card").filter(has_text="gpu-box")
    expect(card.get_by_test_id("worker-name")).to_have_text("gpu-box")
    expect(card.get_by_test_id("gpu-row")).to_have_count(2)
    expect(card.get_by_test_id("simulated")).to_have_count(2)
    expect(card.get_by_test_id("gpu-row").first).to_contain_text("NVIDIA A100-SXM4-80GB")
    # How it contains its jobs: what `gpulayer workers` says, in short.
    expected = next(w.containment for w in stack.client.workers() if w.name == "gpu-box") or ""
    expect(card.get_by_test_id("containment")).to_have_text(
        "no containment" if expected.startswith("none") else expected.split(" (")[0]
    )
    # Telemetry came: the CPU sparkline has a line.
    expect(card.locator("[data-testid=cpu-spark] path.line")).to_have_count(1)
    shot()


def test_the_workers_page_lists_the_machines_the_autoscaler_started_and_a_job_says_its_decision(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    # What an autoscaler records (docs/capacity.md), written as it would: none runs in this stack.
    store = stack.client.stores.capacity
    now = datetime.now(timezone.utc)
    offer: dict[str, object] = {"name": "h100x4", "accelerator": "cuda", "gpus": 4}
    machine = Machine(
        name="aws-h100x4-3fa2c1", provider="aws", kind="h100x4", offer=offer, state="running",
        created=now - timedelta(minutes=30), price_per_hour=12.0, gpus=4,
    )  # fmt: skip
    gone = machine.model_copy(
        update={
            "name": "aws-h100x4-9c01d2",
            "state": "failed",
            "price_per_hour": None,
            "reason": "its worker did not join",
        }
    )
    store.put(machine)
    store.put(gone)
    waiting = stack.client.submit(["true"], name="waits-for-h100s", labels={"zone": "mars"})
    said = "starting a worker of kind h100x4 on provider aws (est. 2 min)"
    queue = stack.client.keys.queue_for(waiting.status().spec.queue)
    store.decide({queue: Decision(text=said, at=now, machines=[machine.name])})
    try:
        log_in(page, stack.tokens["viewer"])
        page.get_by_test_id("nav-workers").click()
        row = page.get_by_test_id("machine-row").filter(has_text=machine.name)
        expect(row.get_by_test_id("machine-state")).to_have_text("running")
        expect(row).to_contain_text("h100x4")
        expect(row.get_by_test_id("machine-cost")).to_have_text(re.compile(r"^\$6\.0\d$"))  # 30 min at $12
        failed = page.get_by_test_id("machine-row").filter(has_text=gone.name)
        expect(failed.get_by_test_id("machine-reason")).to_have_text("its worker did not join")
        expect(failed.get_by_test_id("machine-cost")).to_have_text("—")
        shot("workers")
        page.goto(f"/#/jobs/{waiting.id}")
        expect(page.get_by_test_id("capacity-decision")).to_have_text(f"Autoscaler: {said}")
        shot("job")
    finally:
        waiting.cancel()
        store.forget([machine.name, gone.name])
        store.decide({})


def test_a_viewer_is_offered_no_submit_form_and_no_cancel_button(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    waiting = stack.client.submit(["true"], name="waits-for-mars", labels={"zone": "mars"})
    log_in(page, stack.tokens["viewer"])
    expect(page.get_by_test_id("role")).to_have_text("viewer")
    expect(page.get_by_test_id("job-row").filter(has_text="waits-for-mars")).to_have_count(1)
    expect(page.get_by_test_id("submit-form")).to_have_count(0)
    page.goto(f"/#/jobs/{waiting.id}")
    expect(page.get_by_test_id("job-state")).to_have_text("queued")
    expect(page.get_by_test_id("placement-reasons")).to_contain_text("needs label zone=mars")
    expect(page.get_by_test_id("cancel")).to_have_count(0)
    shot()
    waiting.cancel()


def test_the_activity_page_charts_the_samples_and_the_theme_toggle_is_remembered(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    log_in(page, stack.tokens["admin"])
    page.get_by_test_id("nav-activity").click()
    for chart in ("chart-active", "chart-cpu", "chart-gpu", "chart-tasks"):
        expect(page.get_by_test_id(chart).locator("path.line").first).to_be_attached()
    expect(page.get_by_test_id("chart-cpu").locator(".legend")).to_contain_text("gpu-box")
    expect(page.get_by_test_id("chart-tasks").locator(".legend")).to_contain_text("gpu-box")
    five_minutes = page.get_by_test_id("span").get_by_role("button", name="5m", exact=True)
    five_minutes.click()
    expect(five_minutes).to_have_attribute("aria-pressed", "true")
    shot()
    page.get_by_test_id("theme-toggle").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    expect(page.get_by_test_id("chart-cpu").locator("path.line").first).to_be_attached()
    shot("dark")
    page.get_by_test_id("nav-jobs").click()
    expect(page.get_by_test_id("job-row").first).to_be_visible()
    shot("dark-jobs")


def test_the_workers_header_counts_gpus_only_when_some_worker_has_them(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    # No worker with GPUs: the API's answer, as a machine with CPU workers only would give it.
    page.route("**/api/v1/workers", lambda route: route.fulfill(json={"workers": []}))
    log_in(page, stack.tokens["viewer"])
    page.goto("/#/workers")
    totals = page.get_by_test_id("worker-totals")
    expect(totals).to_have_text("0 workers0 running0/0 CPU slots")
    shot()


def test_the_top_bar_fits_a_phones_width(browser: Browser, stack: Stack, tmp_path: Path) -> None:
    context = browser.new_context(base_url=stack.url, viewport={"width": 390, "height": 844})
    phone = context.new_page()
    phone.set_default_timeout(WAIT_MS)
    log_in(phone, stack.tokens["submitter"])  # the longest role name
    expect(phone.get_by_test_id("jobs-table")).to_be_visible()
    phone.screenshot(path=tmp_path / "phone.png")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "phone.png", OUTPUT / "test_the_top_bar_fits_a_phones_width.png")
    topbar = phone.get_by_test_id("topbar")
    assert topbar.evaluate("bar => bar.scrollWidth <= bar.clientWidth")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    for control in ("nav-jobs", "nav-workers", "nav-activity", "role", "theme-toggle", "logout"):
        box = phone.get_by_test_id(control).bounding_box()
        assert box is not None, control
        assert box["x"] >= 0, control
        assert box["x"] + box["width"] <= 390, control
    context.close()


def test_a_job_id_that_does_not_exist_says_so_and_opens_no_log(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    log_in(page, stack.tokens["viewer"])
    page.goto("/#/jobs/no-such-job-38")
    expect(page.get_by_test_id("no-such-job")).to_contain_text("No such job")
    expect(page.get_by_test_id("no-such-job")).to_contain_text("no-such-job-38")
    expect(page.get_by_test_id("logs")).to_have_count(0)
    page.wait_for_timeout(1500)  # what a log socket's first retry would take
    assert not [url for url in sockets if "/ws/jobs/" in url]
    shot()


def test_the_page_shows_a_skeleton_before_the_session_check_answers(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    held: list[Route] = []

    def hold(route: Route) -> None:  # a bound method is not a handler Playwright takes
        held.append(route)

    page.route("**/api/v1/session", hold)
    page.goto("/", wait_until="domcontentloaded")
    for _ in range(WAIT_MS // 50):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page never asked for its session"
    expect(page.get_by_test_id("booting")).to_be_visible()
    shot("waiting")
    held[0].continue_()
    expect(page.get_by_test_id("login-form")).to_be_visible()
    expect(page.get_by_test_id("booting")).to_have_count(0)


def test_the_jobs_list_shows_how_each_ended_job_exited(
    page: Page, stack: Stack, shot: Callable[..., None]
) -> None:
    failed = stack.client.submit(["sh", "-c", "exit 3"], name="exits-three")
    waiting = stack.client.submit(["true"], name="exit-unknown", labels={"zone": "mars"})
    assert failed.wait(WAIT_MS / 1000).exit_code == 3
    log_in(page, stack.tokens["viewer"])
    expect(page.get_by_role("columnheader", name="Exit")).to_be_visible()
    row = page.get_by_test_id("job-row").filter(has_text="exits-three")
    expect(row.get_by_test_id("exit-code")).to_have_text("3")
    expect(
        page.get_by_test_id("job-row").filter(has_text="exit-unknown").get_by_test_id("exit-code")
    ).to_have_text("—")
    shot()
    waiting.cancel()
