"""HTTP API under load: `gpulayer server` (gunicorn, threads) on loopback, beside the Python client
doing the same through Redis directly, in the same run.

* listing: ``GET /api/v1/jobs?limit=50`` with 10,000 jobs in Redis, from 50 concurrent clients;
* submit: ``POST /api/v1/jobs`` from 50 concurrent clients (no worker runs them);
* log delay: a job prints a line every 20 ms; the time from its print (the time it writes into the
  line) to the line's arrival on ``/ws/jobs/<id>/logs``, p50 and p99;
* event delay: from a submit to its "queued" event on ``/ws/events``, beside the same read by a
  subscriber of Redis's channel of its own.

Requests/s and p99 latency for each; the direct client's rate in the same run for the ratio.

    python benchmarks/api_load.py [--jobs 10000] [--clients 50] [--requests 2000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from _common import gpulayer_worker, median, percentile, private_installation, save, spawn, stop
from simple_websocket import Client as WebSocket

from gpulayer import Client, Settings
from gpulayer.network import free_port
from gpulayer.service import Service


def hammer(
    clients: int, requests: int, call: Callable[[http.client.HTTPConnection], int]
) -> dict[str, float]:
    """``requests`` calls spread over ``clients`` threads, each with its own keep-alive connection."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = requests // clients
    port = int(os.environ["API_PORT"])

    def run() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        for _ in range(per_client):
            started = time.perf_counter()
            status = call(connection)
            mine.append(time.perf_counter() - started)
            if status >= 300:
                raise RuntimeError(f"status {status}")
        connection.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    return {
        "per_s": len(latencies) / elapsed,
        "p50_ms": median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def direct(clients: int, requests: int, call: Callable[[], object]) -> float:
    """The same number of calls through the Python client, from as many threads: calls/s."""
    per_client = requests // clients
    threads = [threading.Thread(target=lambda: [call() for _ in range(per_client)]) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return per_client * clients / (time.perf_counter() - began)


def request(
    method: str, path: str, token: str, body: dict[str, object] | None = None
) -> Callable[[http.client.HTTPConnection], int]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = json.dumps(body).encode() if body is not None else None

    def call(connection: http.client.HTTPConnection) -> int:
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status

    return call


def log_delay(url: str, home: str, client: Client, token: str, port: int, lines: int) -> dict[str, float]:
    worker = spawn(gpulayer_worker(url, "bench", 1), {"GPULAYER_HOME": home})
    try:
        deadline = time.monotonic() + 30
        while not client.workers():
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not register")
            time.sleep(0.05)
        printer = (
            f"import time\nfor n in range({lines}):\n"
            "    print(repr(time.time()), flush=True)\n    time.sleep(0.02)\n"
        )
        job = client.submit([sys.executable, "-c", printer])
        socket = WebSocket.connect(
            f"ws://127.0.0.1:{port}/ws/jobs/{job.id}/logs", headers={"Authorization": f"Bearer {token}"}
        )
        delays = []
        while True:
            message = json.loads(socket.receive(timeout=60))
            if "end" in message:
                break
            delays.append(time.time() - float(message["text"]))
    finally:
        stop(worker)
    return {"p50_ms": median(delays) * 1000, "p99_ms": percentile(delays, 0.99) * 1000, "lines": len(delays)}


def event_delay(url: str, client: Client, token: str, port: int, jobs: int) -> dict[str, float]:
    """From a submit to its job's "queued" event arriving on /ws/events, beside the same event read
    straight from Redis's channel (what a browser costs over a subscriber of its own)."""
    socket = WebSocket.connect(
        f"ws://127.0.0.1:{port}/ws/events", headers={"Authorization": f"Bearer {token}"}
    )
    direct = client.redis.pubsub(ignore_subscribe_messages=True)
    direct.subscribe(client.keys.events)
    time.sleep(0.5)  # the server's hub subscribes at its next round

    def arrival(receive: Callable[[], str | None], job_id: str) -> float:
        while True:
            raw = receive()
            if raw is not None and json.loads(raw).get("id") == job_id:
                return time.perf_counter()

    def from_direct() -> str | None:
        message = direct.get_message(timeout=10)
        return None if message is None else message["data"].decode()

    def delays(receive: Callable[[], str | None]) -> list[float]:
        found = []
        for _ in range(jobs):
            started = time.perf_counter()
            job_id = client.submit(["true"], labels={"zone": "nowhere"}).id  # waits: no worker runs it
            found.append(arrival(receive, job_id) - started)
        return found

    via_redis = delays(from_direct)
    direct.close()
    via_socket = delays(lambda: socket.receive(timeout=10))
    socket.close()
    return {
        "p50_ms": median(via_socket) * 1000,
        "p99_ms": percentile(via_socket, 0.99) * 1000,
        "redis_p50_ms": median(via_redis) * 1000,
        "redis_p99_ms": percentile(via_redis, 0.99) * 1000,
        "jobs": jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--log-lines", type=int, default=200)
    parser.add_argument("--events", type=int, default=200)
    args = parser.parse_args()
    with private_installation() as (url, home):
        client = Client(url, settings=Settings(home=home))
        token, _ = Service(client).create_token("bench", "admin")
        port = free_port()
        os.environ["API_PORT"] = str(port)
        server = subprocess.Popen(
            [sys.executable, "-m", "gpulayer", "server", "--port", str(port), "--redis-url", url],
            env={**os.environ, "GPULAYER_HOME": str(home)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    request("GET", "/api/v1/jobs", token)(
                        http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    )
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            print(f"filling {args.jobs} jobs ...", file=sys.stderr)
            for _ in range(args.jobs):
                client.submit(["true"])
            listing = hammer(args.clients, args.requests, request("GET", "/api/v1/jobs?limit=50", token))
            listing_direct = direct(args.clients, args.requests, lambda: client.jobs(limit=50))
            submit = hammer(
                args.clients, args.requests, request("POST", "/api/v1/jobs", token, {"command": ["true"]})
            )
            submit_direct = direct(args.clients, args.requests, lambda: client.submit(["true"]))
            delay = log_delay(url, str(home), client, token, port, args.log_lines)
            events = event_delay(url, client, token, port, args.events)
        finally:
            server.terminate()
            server.wait(30)
    result = {
        "jobs_in_redis": args.jobs,
        "clients": args.clients,
        "requests": args.requests,
        "listing": {
            **listing,
            "direct_per_s": listing_direct,
            "api_over_direct": listing["per_s"] / listing_direct,
        },
        "submit": {
            **submit,
            "direct_per_s": submit_direct,
            "api_over_direct": submit["per_s"] / submit_direct,
        },
        "log_delay": delay,
        "event_delay": events,
    }
    for name in ("listing", "submit"):
        row = result[name]
        assert isinstance(row, dict)
        rates = f"API {row['per_s']:8.0f} req/s  p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:6.1f} ms"
        versus = f"direct {row['direct_per_s']:8.0f}/s   API/direct {row['api_over_direct']:.2f}"
        print(f"{name:<8} {rates}   {versus}")
    lines = delay["lines"]
    spread = f"p50 {delay['p50_ms']:.1f} ms, p99 {delay['p99_ms']:.1f} ms"
    print(f"log line -> websocket: {spread} over {lines:.0f} lines")
    socket_ms, redis_ms = events["p50_ms"], events["redis_p50_ms"]
    print(
        f"submit -> job event on /ws/events: p50 {socket_ms:.1f} ms, p99 {events['p99_ms']:.1f} ms; "
        f"straight from Redis p50 {redis_ms:.1f} ms ({socket_ms / redis_ms:.2f}x)"
    )
    print(f"saved {save('api_load', result)}")


if __name__ == "__main__":
    main()
