"""What signing costs: every job is signed at submit and checked by the worker before it runs, and
every function result is signed by the worker and checked by the client before it is unpickled.

Measured in one run, on a private Redis, each over ``--jobs`` jobs:

* sign: ``seal_job`` over a job's spec, id and file digests (Ed25519), microseconds per job;
* check: ``check_job`` of that seal, as a worker does at claim;
* result: ``sign_result`` plus ``open_result`` of a small pickled value;
* submit: a GPUlayer command job's whole submit (validation, signature, the script's round trip);
* the peer: RQ's ``Queue.enqueue`` of a job in the same loop, on the same Redis.

It prints the share of a submit that signing takes, and of a job's worker-side CPU that checking
takes (against the per-job CPU figure docs/performance.md gives).

    python benchmarks/signing.py [--jobs 5000]
"""

from __future__ import annotations

import argparse
import pickle
import time

import redis
from _common import private_installation, save
from rq import Queue

from gpulayer import Client, Settings
from gpulayer.models import build_spec
from gpulayer.signing import (
    ResultSigner,
    SigningKey,
    WorkerKey,
    check_job,
    open_result,
    seal_job,
    sign_result,
)

#: The worker-side CPU one short command job costs (ms), from docs/performance.md's profile.
WORKER_CPU_MS = 5.0


def per_job_us(action: object, jobs: int) -> float:
    assert callable(action)
    started = time.perf_counter()
    for index in range(jobs):
        action(index)
    return (time.perf_counter() - started) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    jobs = parser.parse_args().jobs
    job_key, result_key = SigningKey.generate(), SigningKey.generate()
    job_verify = job_key.public
    result_signer, result_verify = ResultSigner("bench", result_key), WorkerKey("bench", result_key.public)
    spec = build_spec(command=["python3", "train.py", "--lr", "0.1"], env={"SEED": "1"}, source=True)
    spec_json = spec.model_dump_json(exclude_defaults=True)
    files = {"source.tar.gz": "ab" * 32}
    seals = [seal_job(job_key, f"{index:012x}", spec_json, files) for index in range(jobs)]
    payload = pickle.dumps({"loss": 0.25, "epoch": 3})

    sign_us = per_job_us(lambda i: seal_job(job_key, f"{i:012x}", spec_json, files), jobs)
    check_us = per_job_us(
        lambda i: check_job(job_verify, f"{i:012x}", spec_json.encode(), seals[i].encode()), jobs
    )
    result_us = per_job_us(
        lambda i: open_result(
            result_verify, "j", i, "result.pkl", sign_result(result_signer, "j", i, "result.pkl", payload)
        ),
        jobs,
    )

    with private_installation() as (url, home):
        client = Client(url, settings=Settings(home=home))
        submit_us = per_job_us(lambda i: client.submit(["true"]), jobs)
        connection = redis.Redis.from_url(url)
        queue = Queue("bench", connection=connection)
        enqueue_us = per_job_us(lambda i: queue.enqueue("rq_tasks.run_command", "true"), jobs)
        client.close()
        connection.close()

    result = {
        "jobs": jobs,
        "sign_us": sign_us,
        "check_us": check_us,
        "result_sign_and_open_us": result_us,
        "gpulayer_submit_us": submit_us,
        "rq_enqueue_us": enqueue_us,
        "sign_share_of_submit": sign_us / submit_us,
        "check_share_of_worker_cpu": check_us / (WORKER_CPU_MS * 1000),
    }
    print(f"sign a job:            {sign_us:8.1f} µs")
    print(f"check a job:           {check_us:8.1f} µs")
    print(f"sign + open a result:  {result_us:8.1f} µs")
    print(f"GPUlayer submit:       {submit_us:8.1f} µs  ({sign_us / submit_us:.1%} of it is the signature)")
    print(f"RQ enqueue (same run): {enqueue_us:8.1f} µs  (GPUlayer / RQ: {submit_us / enqueue_us:.2f}x)")
    print(
        f"checking is {check_us / (WORKER_CPU_MS * 1000):.1%} of a job's {WORKER_CPU_MS:g} ms of worker CPU"
    )
    print(f"saved {save('signing', result)}")


if __name__ == "__main__":
    main()
