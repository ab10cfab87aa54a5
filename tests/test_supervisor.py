"""The worker's one supervisor follows every job process at once: no exit, no log line and no lease
renewal may be lost while it is busy with many of them."""

from __future__ import annotations

from gpulayer import Client
from gpulayer.models import JobState

from .conftest import Workers

LINES = 200
#: Each job prints LINES numbered lines on each stream, interleaved, then exits with its code. Half
#: way it pauses past the slot's first look: its slot reads the first half, the supervisor the rest.
CHATTY = (
    'i=0; while [ "$i" -lt {lines} ]; do echo "out $i"; echo "err $i" >&2; i=$((i + 1));'
    ' if [ "$i" -eq {half} ]; then sleep 0.1; fi; done; exit {code}'
)


def test_no_exit_and_no_line_is_lost_among_many_jobs(client: Client, workers: Workers) -> None:
    workers.start("w1", 6, "--lease-ttl", "2", "--heartbeat", "0.4")
    scripts = [(CHATTY.format(lines=LINES, half=LINES // 2, code=n % 4), n % 4) for n in range(36)]
    jobs = [(client.submit(["sh", "-c", script], retries=0), code) for script, code in scripts]
    records = {record.id: record for record in client.wait_all([job for job, _ in jobs], timeout=120)}
    for job, code in jobs:
        record = records[job.id]
        assert record.exit_code == code, record
        assert record.state is (JobState.SUCCEEDED if code == 0 else JobState.FAILED)
        assert record.attempt == 1, "a lease ran out while the job ran"
        lines = list(job.logs())
        for stream in ("stdout", "stderr"):
            printed = [line.text for line in lines if line.stream == stream]
            assert printed == [f"{stream[3:]} {i}" for i in range(LINES)], (job.id, stream)


def test_a_long_job_keeps_its_lease_while_short_ones_churn(client: Client, workers: Workers) -> None:
    # Leases of a second, renewed every 0.3 s: a renewal missed for a second shows as a second attempt.
    workers.start("w1", 4, "--lease-ttl", "1", "--heartbeat", "0.3")
    long = client.submit(["sh", "-c", "sleep 4; echo done"], retries=1)
    churn = [client.submit(["sh", "-c", CHATTY.format(lines=50, half=25, code=0)]) for _ in range(120)]
    assert all(record.state is JobState.SUCCEEDED for record in client.wait_all(churn, timeout=120))
    record = long.wait(timeout=60)
    assert record.state is JobState.SUCCEEDED
    assert record.attempt == 1
    assert [line.text for line in long.logs() if line.stream == "stdout"] == ["done"]
