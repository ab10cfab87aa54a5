"""Two installations on one Redis, told apart by their prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer import Client, Job, JobNotFound, JobState, Settings
from gpulayer.installation import Installation
from tests.conftest import Workers, publish


def test_an_installation_sees_and_touches_only_its_own_jobs(redis_url: str, home: Path) -> None:
    team_a = Client(redis_url, settings=Settings(home=home, prefix="teamA"))
    team_b = Client(redis_url, settings=Settings(home=home, prefix="teamB"))
    job = team_a.submit(["true"])
    assert team_b.jobs() == []
    with pytest.raises(JobNotFound):
        team_b.get(job.id)
    with pytest.raises(JobNotFound):
        Job(team_b, job.id).cancel()
    assert job.status().state is JobState.QUEUED


def test_a_worker_runs_only_its_installations_jobs(
    redis_url: str, home: Path, workers: Workers, installation: Installation
) -> None:
    team_a = Client(redis_url, settings=Settings(home=home, prefix="teamA"))
    team_b = Client(redis_url, settings=Settings(home=home, prefix="teamB"))
    workers.client = team_b
    workers.env["GPULAYER_PREFIX"] = "teamB"
    # The Redis users are the gpulayer prefix's: this worker of another installation logs in as admin.
    workers.env["GPULAYER_REDIS_URL"] = redis_url
    publish(installation, prefix="teamB")  # its worker identity is the session's
    workers.start(name="shared-host")
    mine, theirs = team_b.submit(["true"]), team_a.submit(["true"])
    assert mine.wait(30).state is JobState.SUCCEEDED
    assert theirs.status().state is JobState.QUEUED
    assert [worker.name for worker in team_b.workers()] == ["shared-host"]
    assert team_a.workers() == []
