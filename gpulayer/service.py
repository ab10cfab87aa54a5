"""What a server in front of many people needs of an installation, beyond what a program submitting
jobs does: API tokens and browser sessions, many jobs' logs in one read, pub/sub, and the numbers
monitoring reads. The HTTP API, the dashboard and the token commands go through :class:`Service`;
the :class:`~gpulayer.Client` it is over keeps to what ``docs/python.md`` documents."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import cast

from .client import Client
from .errors import TokenNotFound
from .inventory import Telemetry
from .models import (
    ActivitySample,
    BrowserSession,
    JobState,
    LogLine,
    OpenedSession,
    QueueInfo,
    Role,
    TokenInfo,
)
from .store import histograms
from .store.channels import Subscription
from .store.logs import LogUpdates
from .store.telemetry import HISTORY


class Service:
    """The server's side of an installation, over ``client``'s connection and stores."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._stores = client.stores

    def create_token(self, name: str, role: Role, expires_in: float | None = None) -> tuple[str, TokenInfo]:
        """A new API token for the HTTP API and dashboard: the token (shown once; only its hash is
        kept) and its record. ``expires_in`` seconds, or never. :class:`TokenError` if ``name`` is taken."""
        return self._stores.tokens.create(name, role, expires_in)

    def tokens(self) -> list[TokenInfo]:
        """The API tokens that still work, by name."""
        return self._stores.tokens.list()

    def revoke_token(self, name: str) -> None:
        """Stop the token named ``name`` at once; :class:`TokenNotFound` if there is none."""
        if not self._stores.tokens.revoke(name):
            raise TokenNotFound(f"no token named {name!r}")

    def check_token(self, token: str) -> TokenInfo | None:
        """The record of ``token`` if it works (exists, not revoked, not expired), else None."""
        return self._stores.tokens.check(token)

    def check_token_digest(self, digest: str) -> TokenInfo | None:
        """:meth:`check_token` by the token's SHA-256, as a browser session keeps it."""
        return self._stores.tokens.check_digest(digest)

    def record_failed_login(self, address: str, window: int) -> int:
        """Count a failed login from ``address``; returns how many there were in the last ``window`` s."""
        return self._stores.tokens.failed_login(address, window)

    def failed_logins(self, address: str) -> int:
        """How many failed logins ``address`` has in its current window."""
        return self._stores.tokens.login_failures(address)

    def open_session(self, token: str) -> OpenedSession | None:
        """A browser session for ``token`` (its cookie, shown only now), lasting until it is closed,
        a working day has passed, or the token expires; None if the token does not work."""
        return self._stores.tokens.open_session(token)

    def session(self, cookie: str) -> BrowserSession | None:
        """The record of the browser session a cookie stands for, while it lasts, else None."""
        return self._stores.tokens.session(cookie)

    def close_session(self, cookie: str) -> bool:
        """End a browser session at once; False if it had already ended."""
        return self._stores.tokens.close_session(cookie)

    def read_logs(self, cursors: Mapping[str, str], *, count: int = 500, block_ms: int = 100) -> LogUpdates:
        """One read of many jobs' logs, blocking up to ``block_ms``: up to ``count`` lines of each job
        after its cursor (a line's id, ``0-0`` for the first; by job id), and how each that has ended
        ended. What a server streaming many logs at once reads, not a :meth:`Job.logs` per job."""
        return self._stores.logs.read_many(cursors, count, block_ms)

    def log_range(self, job_id: str, after: str, until: str) -> list[tuple[str, LogLine]]:
        """Every stored line of a job after line ``after`` up to line ``until`` (ids): what one who
        joins a follower late catches up with. A job that is gone has none."""
        return self._stores.logs.page(job_id, after, None, until)

    def subscribe(self) -> Subscription:
        """A pub/sub connection of its own, hearing revoked tokens and, while it follows them, events
        (job states, workers, telemetry); close it when done."""
        return Subscription(self._stores.redis, self._stores.keys)

    def telemetry(
        self, seconds: float = HISTORY, workers: Sequence[str] | None = None
    ) -> dict[str, list[Telemetry]]:
        """Each connected worker's (or each of ``workers``') telemetry samples (CPU, memory, GPUs)
        over the last ``seconds`` (Redis keeps an hour), oldest first, by worker name."""
        names = list(workers) if workers is not None else [worker.name for worker in self.client.workers()]
        return self._stores.telemetry.history(names, seconds)

    def activity(self, seconds: float = HISTORY) -> list[ActivitySample]:
        """Samples of the whole installation (jobs by state, queue depths) over the last ``seconds``."""
        return self._stores.telemetry.activity(seconds)

    def histograms(self) -> dict[str, histograms.Histogram]:
        """The time jobs took from queued to running (``start_latency``), and how long they ran
        (``run_time``), over every job since Redis's data began."""
        redis, keys = self._stores.redis, self._stores.keys
        return {
            "start_latency": histograms.read(redis, keys.start_latency, histograms.START_BUCKETS),
            "run_time": histograms.read(redis, keys.run_time, histograms.RUN_BUCKETS),
        }

    def ended_counts(self) -> dict[JobState, int]:
        """How many jobs ended in each final state since Redis's data began (past their retention
        too): what a rate of ended jobs is computed from."""
        raw = cast(dict[bytes, bytes], self._stores.redis.hgetall(self._stores.keys.ended_counts))
        counts = {state: 0 for state in JobState if state.is_terminal}
        for name, count in raw.items():
            with contextlib.suppress(ValueError):
                counts[JobState(name.decode())] = int(count)
        return counts

    def queues(self) -> tuple[list[QueueInfo], int]:
        """Every queue with how many jobs wait in it, and how many gang jobs wait for workers."""
        return self._stores.queues.list()
