"""What a job's processes find in their environment: a HOME and TMPDIR of the job's own, fresh and
gone with it; no user site folder; numeric libraries' thread counts set to its CPU slots."""

from __future__ import annotations

from pathlib import Path

from gpulayer import Client, Distributed, JobSpec, JobState, Requirements
from gpulayer.worker.threads import VARIABLES, thread_variables
from tests.conftest import Workers

WAIT = 60
#: A job that says where its HOME, TMPDIR (and TMP, TEMP) and folder are, what its HOME and TMPDIR
#: hold, then leaves a file in each.
PROBE = (
    'echo "$HOME"; echo "$TMPDIR $TMP $TEMP"; pwd; ls -A "$HOME" "$TMPDIR"; touch "$HOME/left" "$TMPDIR/left"'
)


def stdout(client: Client, job_id: str) -> list[str]:
    return [line.text for line in client.get(job_id).logs() if line.stream == "stdout"]


def test_each_job_has_a_fresh_home_and_tmpdir_beside_its_folder_removed_after_it(
    client: Client, workers: Workers, env: dict[str, str], tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    # A worker's shared temporary folder, named the Windows way too: no job gets it.
    workers.env = {**env, "TMPDIR": "/tmp", "TMP": "/tmp", "TEMP": "/tmp"}
    workers.start("w1", 1, "--workdir", str(workdir))
    seen = []
    for _ in range(3):
        job = client.submit(["sh", "-c", PROBE])
        assert job.wait(WAIT).state is JobState.SUCCEEDED
        home, temporary, folder, *listed = stdout(client, job.id)
        seen.append(home)
        assert temporary.split() == [home, home, home]  # one folder is its HOME and TMPDIR (TMP, TEMP)
        # Nothing an earlier job left: it was empty when the job started.
        assert [line for line in listed if line.strip() and not line.endswith(":")] == []
        assert Path(home).parent == Path(folder).parent == workdir  # beside the job's folder, not in it
        assert not Path(home).exists()  # gone with the job
    assert len(set(seen)) == 3


def test_a_job_runs_without_the_user_site_folder(client: Client, workers: Workers) -> None:
    workers.start("w1", 1)
    job = client.submit(["sh", "-c", "echo $PYTHONNOUSERSITE"])
    assert job.wait(WAIT).state is JobState.SUCCEEDED
    assert stdout(client, job.id) == ["1"]


def test_thread_variables_are_the_jobs_cpus_unless_the_job_sets_them(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 4)
    printing = ["sh", "-c", " ".join(f'echo "{name}=${name}";' for name in VARIABLES)]
    one = client.submit(printing)
    three = client.submit(printing, cpus=3)
    own = client.submit(printing, cpus=2, env={"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "5"})
    for job in (one, three, own):
        assert job.wait(WAIT).state is JobState.SUCCEEDED
    assert stdout(client, one.id) == [f"{name}=1" for name in VARIABLES]
    assert stdout(client, three.id) == [f"{name}=3" for name in VARIABLES]
    own_values = {"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "5"}
    assert stdout(client, own.id) == [f"{name}={own_values.get(name, '2')}" for name in VARIABLES]


def test_a_gpu_job_gets_one_thread_and_a_gang_node_shares_its_cpus_among_its_ranks() -> None:
    gpu = JobSpec(command=["true"], requirements=Requirements(gpus=1))
    assert gpu.requirements.cpus == 0
    assert set(thread_variables(gpu).values()) == {"1"}
    gang = JobSpec(
        command=["true"],
        requirements=Requirements(cpus=8),
        distributed=Distributed(nodes=2, procs_per_node=4),
    )
    assert set(thread_variables(gang).values()) == {"2"}


def test_each_node_of_a_gang_job_has_a_home_its_ranks_share_and_threads_for_its_share_of_cpus(
    client: Client, workers: Workers
) -> None:
    for name in ("a", "b"):
        workers.start(name, 4)
    job = client.submit(["sh", "-c", 'echo "$HOME $OMP_NUM_THREADS"'], nodes=2, procs_per_node=2, cpus=4)
    assert job.wait(WAIT).state is JobState.SUCCEEDED
    seen = {line.rank: line.text.split() for line in job.logs() if line.stream == "stdout"}
    homes = {rank: home for rank, (home, _) in seen.items()}
    assert homes[0] == homes[1] != homes[2] == homes[3]
    assert {threads for _, threads in seen.values()} == {"2"}
    assert not any(Path(home).exists() for home in homes.values())
