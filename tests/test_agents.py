"""`gpulayer mcp`, driven over stdio by the official MCP SDK's own client, against a real Redis and
worker: every tool, progress while waiting, bounded logs, read-only refusal, tool errors."""

from __future__ import annotations

import base64
import io
import json
import sys
import tarfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from gpulayer import Client, JobState
from gpulayer.inventory import KNOWN_FRAMEWORKS
from gpulayer.network import free_port
from gpulayer.options import SubmitOptions
from gpulayer.requirements import Requirements
from gpulayer.service import Service

from .conftest import Workers, submit_keywords

A100 = json.dumps([{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}])
WRITE_TOOLS = {"submit_job", "cancel_job", "download_outputs"}
READ_TOOLS = {"list_workers", "plan_job", "get_job", "list_jobs", "get_logs", "wait_for_job"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def session(env: dict[str, str], *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "gpulayer", "mcp", *args], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as opened:
        await opened.initialize()
        yield opened


async def call(agent: ClientSession, tool: str, **arguments: Any) -> Any:
    result = await agent.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def error(agent: ClientSession, tool: str, **arguments: Any) -> str:
    result = await agent.call_tool(tool, arguments)
    assert result.is_error
    text: str = result.content[0].text  # type: ignore[union-attr]
    assert "\n" not in text
    return text


@pytest.mark.anyio
async def test_an_agent_plans_submits_waits_reads_and_downloads(
    client: Client, workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    workers.start("gpu-box", 2, "--fake-gpus", A100)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.sh").write_text('for i in $(seq 1 300); do echo "step $i"; done; echo 0.93 > acc.txt\n')
    async with session(env) as agent:
        tools = {tool.name: tool for tool in (await agent.list_tools()).tools}
        assert set(tools) == READ_TOOLS | WRITE_TOOLS
        assert tools["get_job"].annotations is not None
        assert tools["get_job"].annotations.read_only_hint

        workers_seen = (await call(agent, "list_workers"))["workers"]
        assert [worker["name"] for worker in workers_seen] == ["gpu-box"]
        # Frameworks of note only, as the CLI shows them: not every package the worker has installed.
        assert all(name in KNOWN_FRAMEWORKS for name in workers_seen[0]["frameworks"])
        assert "rq" in client.workers()[0].frameworks  # installed, of no note
        plan = await call(agent, "plan_job", requirements={"gpus": 1, "gpu_memory": "100GB"})
        assert plan["schedulable"] is False
        assert plan["reasons"][0]["codes"] == ["gpu_memory"]

        submitted = await call(
            agent, "submit_job", command=["sh", "train.sh"], source=str(project),
            options={"outputs": ["acc.txt"], "name": "sweep-1"}, requirements={"gpus": 1},
        )  # fmt: skip
        job_id = submitted["id"]
        progress: list[float] = []

        async def seen(done: float, total: float | None, message: str | None) -> None:
            progress.append(done)

        result = await agent.call_tool(
            "wait_for_job", {"job_id": job_id, "timeout": 60, "tail": 5}, progress_callback=seen
        )
        waited = result.structured_content
        assert waited["ended"] is True
        assert waited["state"] == "succeeded"
        assert [line["text"] for line in waited["log_tail"]] == [f"step {i}" for i in range(296, 301)]

        page = await call(agent, "get_logs", job_id=job_id, after="0-0", limit=100)
        assert [line["text"] for line in page["lines"]] == [f"step {i}" for i in range(1, 101)]
        following = await call(agent, "get_logs", job_id=job_id, after=page["next_after"], limit=100)
        assert following["lines"][0]["text"] == "step 101"

        job = await call(agent, "get_job", job_id=job_id)
        assert (job["state"], job["exit_code"], job["name"]) == ("succeeded", 0, "sweep-1")
        listed = await call(agent, "list_jobs", name="sweep")
        assert [found["id"] for found in listed["jobs"]] == [job_id]

        downloaded = await call(agent, "download_outputs", job_id=job_id, dest=str(tmp_path / "out"))
        assert downloaded["files"] == [str(tmp_path / "out" / "acc.txt")]
        assert (tmp_path / "out" / "acc.txt").read_text() == "0.93\n"

        text = (await agent.read_resource(f"gpulayer://jobs/{job_id}/logs")).contents[0]
        assert text.text.splitlines()[-1] == "step 300"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_long_wait_reports_progress_and_does_not_block_other_calls(
    client: Client, workers: Workers, env: dict[str, str]
) -> None:
    workers.start("w1", 2)
    long = client.submit(["sleep", "30"])
    async with session(env) as agent:
        progress: list[float] = []

        async def seen(done: float, total: float | None, message: str | None) -> None:
            progress.append(done)

        answers: dict[str, Any] = {}

        async def wait() -> None:
            result = await agent.call_tool(
                "wait_for_job", {"job_id": long.id, "timeout": 3}, progress_callback=seen
            )
            answers["wait"] = result.structured_content

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await anyio.sleep(0.5)
            started = time.monotonic()
            answers["workers"] = await call(agent, "list_workers")
            answers["quick"] = time.monotonic() - started
        assert answers["wait"]["ended"] is False
        assert answers["wait"]["state"] in ("scheduled", "running")
        assert len(progress) >= 2
        assert answers["quick"] < 2.5, "list_workers waited for the wait"
        assert (await call(agent, "cancel_job", job_id=long.id))["cancelled"] is True
    assert long.wait(30).state is JobState.CANCELLED


@pytest.mark.anyio
async def test_logs_are_capped_keeping_the_newest_lines_of_a_tail(
    client: Client, workers: Workers, env: dict[str, str]
) -> None:
    workers.start("w1", 1)
    # 1,000 lines of 200 characters: 200 KB, three times the cap.
    job = client.submit(["sh", "-c", "for i in $(seq 1 1000); do printf '%0200d\\n' $i; done"])
    assert job.wait(60).state is JobState.SUCCEEDED
    async with session(env) as agent:
        tail = await call(agent, "get_logs", job_id=job.id, tail=1000)
        assert tail["truncated"] is True
        assert sum(len(line["text"]) + 1 for line in tail["lines"]) <= 64 * 1024
        assert int(tail["lines"][-1]["text"]) == 1000
        page = await call(agent, "get_logs", job_id=job.id, after="0-0", limit=1000)
        assert page["truncated"] is True
        assert int(page["lines"][0]["text"]) == 1
        following = await call(agent, "get_logs", job_id=job.id, after=page["next_after"], limit=5)
        assert int(following["lines"][0]["text"]) == len(page["lines"]) + 1


@pytest.mark.anyio
async def test_a_name_to_match_fills_a_page_with_matches_not_with_jobs(
    client: Client, env: dict[str, str]
) -> None:
    # Queued, no worker: newest first, the three sweeps sit among and under the others.
    names = ["sweep-1", "other", "sweep-2", "other", "other", "sweep-3", "other", "other"]
    ids = [client.submit(["true"], name=name).id for name in names]
    sweeps = [ids[5], ids[2], ids[0]]
    async with session(env) as agent:
        first = await call(agent, "list_jobs", name="sweep", limit=2)
        assert [found["id"] for found in first["jobs"]] == sweeps[:2]
        assert first["next_offset"] == 6  # just past sweep-2, the sixth newest
        rest = await call(agent, "list_jobs", name="sweep", limit=2, offset=first["next_offset"])
        assert ([found["id"] for found in rest["jobs"]], rest["next_offset"]) == (sweeps[2:], None)
        plain = await call(agent, "list_jobs", limit=3)
        assert ([found["id"] for found in plain["jobs"]], plain["next_offset"]) == (ids[::-1][:3], 3)


@pytest.mark.anyio
async def test_bad_arguments_and_missing_jobs_are_one_line_tool_errors(env: dict[str, str]) -> None:
    async with session(env) as agent:
        assert "no job 'nosuchjob000'" in await error(agent, "get_job", job_id="nosuchjob000")
        assert "(exit status 2)" in await error(
            agent, "submit_job", command=["sh", "-c", "true"], options={"env": {"CUDA_VISIBLE_DEVICES": "0"}}
        )
        assert "the command is empty" in await error(agent, "submit_job", command=[""])
        # Arguments that do not fit the tool's input schema (requirements are a model in it): the
        # SDK's own check, a tool error too.
        assert (await agent.call_tool("get_logs", {"job_id": 123})).is_error
        refused = await agent.call_tool("submit_job", {"command": ["true"], "requirements": {"gpus": -1}})
        assert refused.is_error
        assert "requirements.gpus" in refused.content[0].text  # type: ignore[union-attr]
        # The server is still there.
        assert (await call(agent, "list_jobs"))["jobs"] == []


@pytest.mark.anyio
async def test_a_job_no_worker_could_run_is_said_so_at_submit_and_at_once_in_a_wait(
    workers: Workers, env: dict[str, str]
) -> None:
    workers.start("cpu-box")
    async with session(env) as agent:
        submitted = await call(
            agent, "submit_job", command=["nvidia-smi"], requirements={"accelerator": "cuda"}
        )
        assert submitted["state"] == "queued"
        assert submitted["runnable"] is False
        assert [reason["worker"] for reason in submitted["why"]] == ["cpu-box"]
        started = time.monotonic()
        waited = await call(agent, "wait_for_job", job_id=submitted["id"], timeout=60)
        assert time.monotonic() - started < 10
        assert (waited["ended"], waited["runnable"]) == (False, False)
        assert waited["why"][0]["codes"]
        patient = await call(agent, "wait_for_job", job_id=submitted["id"], timeout=1, wait_for_capacity=True)
        assert "runnable" not in patient
        fits = await call(agent, "submit_job", command=["true"])
        assert "why" not in fits


@pytest.mark.anyio
async def test_redis_out_of_reach_reaches_the_agent_as_its_one_line_cause(env: dict[str, str]) -> None:
    down = {**env, "GPULAYER_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    async with session(down) as agent:
        for tool, arguments in (("list_workers", {}), ("get_job", {"job_id": "abc"})):
            said = await error(agent, tool, **arguments)
            assert ": cannot reach Redis: " in said, said
            assert said.endswith("(exit status 1)")


@pytest.mark.anyio
async def test_read_only_offers_and_allows_nothing_that_changes_anything(
    client: Client, env: dict[str, str]
) -> None:
    async with session(env, "--read-only") as agent:
        names = {tool.name for tool in (await agent.list_tools()).tools}
        assert names == READ_TOOLS
        refused = await agent.call_tool("submit_job", {"command": ["true"]})
        assert refused.is_error
    assert client.jobs() == []


@asynccontextmanager
async def over_http(address: str, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"http://{address}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as opened,
    ):
        await opened.initialize()
        yield opened


@pytest.mark.anyio
async def test_over_http_a_token_decides_the_tools_and_the_source_comes_as_an_archive(
    client: Client, workers: Workers, web_server: tuple[str, Client], tmp_path: Path
) -> None:
    address, web = web_server
    workers.start("w1", 2)
    submitter, _ = Service(web).create_token("agent", "submitter")
    viewer, _ = Service(web).create_token("watcher", "viewer")
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.sh").write_text("echo hello from the archive\n")
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        tar.add(project / "hello.sh", arcname="hello.sh")
    async with over_http(address, submitter) as agent:
        names = {tool.name for tool in (await agent.list_tools()).tools}
        assert names == READ_TOOLS | {
            "submit_job",
            "cancel_job",
        }  # no tool reads or writes the server's files
        source = base64.b64encode(packed.getvalue()).decode()
        job_id = (await call(agent, "submit_job", command=["sh", "hello.sh"], source_archive=source))["id"]
        waited = await call(agent, "wait_for_job", job_id=job_id, timeout=60)
        assert waited["state"] == "succeeded"
        assert [line["text"] for line in waited["log_tail"]] == ["hello from the archive"]
        assert "not base64" in await error(agent, "submit_job", command=["true"], source_archive="%%%")
    async with over_http(address, viewer) as agent:
        assert {tool.name for tool in (await agent.list_tools()).tools} == READ_TOOLS
        assert (await agent.call_tool("submit_job", {"command": ["true"]})).is_error
        assert (await call(agent, "get_job", job_id=job_id))["state"] == "succeeded"
    # Without a token, or with a metrics token: refused before any MCP.
    metrics, _ = Service(web).create_token("scraper", "metrics")
    for headers, status in (({}, 401), ({"Authorization": f"Bearer {metrics}"}, 403)):
        answer = httpx2.post(f"http://{address}/mcp", headers=headers, json={})
        assert answer.status_code == status


@pytest.mark.anyio
async def test_over_http_submit_job_takes_no_keyword_of_client_submit_in_its_requirements(
    web_server: tuple[str, Client], raw_redis: redis.Redis
) -> None:
    """The remote tool runs in the web server: a path among its requirements or options would be the
    server's file (its own access here). Each keyword of Client.submit that is not a requirement is
    refused among the requirements, each that is not an option among the options, as a tool error,
    and nothing is queued."""
    address, web = web_server
    submitter, _ = Service(web).create_token("agent", "submitter")
    own = str(web.settings.home / "access" / "web.json")
    keywords = submit_keywords() - set(Requirements.model_fields)
    assert {"source", "inputs", "requirements"} <= keywords
    before = raw_redis.dbsize()
    async with over_http(address, submitter) as agent:
        for keyword in sorted(keywords):
            arguments = {"command": ["true"], "requirements": {keyword: own}}
            refused = await agent.call_tool("submit_job", arguments)
            assert refused.is_error, keyword
            assert f"requirements.{keyword}" in refused.content[0].text  # type: ignore[union-attr]
        # Nor in its options: only SubmitOptions' fields pass there (a path as `source` would be read).
        for keyword in sorted(submit_keywords() - set(SubmitOptions.model_fields)):
            refused = await agent.call_tool("submit_job", {"command": ["true"], "options": {keyword: own}})
            assert refused.is_error, keyword
            assert f"{keyword}: Extra inputs are not permitted" in refused.content[0].text  # type: ignore[union-attr]
    assert raw_redis.dbsize() == before
    assert web.jobs() == []
