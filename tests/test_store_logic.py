"""The store's pure logic over plain Redis commands, on fakeredis: API tokens and browser sessions,
histograms, the queue listing and the telemetry streams. Nothing here runs a script, an ACL or a
worker: what needs a real server (the Lua library, the roles, jobs) is tested against one elsewhere."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any, cast

import fakeredis
import pytest
from redis.client import PubSub

from gpulayer.errors import TokenError
from gpulayer.inventory import Telemetry
from gpulayer.models import QueueSpec
from gpulayer.requirements import Requirements
from gpulayer.store import histograms
from gpulayer.store.keys import Keys
from gpulayer.store.queues import QueueStore
from gpulayer.store.telemetry import TelemetryStore
from gpulayer.store.tokens import TokenStore, token_hash

KEYS = Keys("gl-test")


@pytest.fixture
def redis() -> Iterator[fakeredis.FakeRedis]:
    server = fakeredis.FakeServer()
    connection = fakeredis.FakeRedis(server=server)
    yield connection
    connection.close()


def everything_in(redis: fakeredis.FakeRedis) -> bytes:
    """Every key and value Redis holds, as one blob: what a copy of its data would give away."""
    held = b""
    for key in redis.scan_iter():
        kind = redis.type(key)
        value = redis.hgetall(key) if kind == b"hash" else redis.get(key) if kind == b"string" else b""
        held += key + b"=" + repr(value).encode() + b"\n"
    return held


def next_message(listener: PubSub) -> dict[str, Any]:
    """The next message on a channel (the subscription's own confirmation skipped), within a second."""
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        message = listener.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            return cast(dict[str, Any], message)
    raise AssertionError("no message within a second")


def test_redis_keeps_neither_a_token_nor_a_session_cookie(redis: fakeredis.FakeRedis) -> None:
    tokens = TokenStore(redis, KEYS)
    token, info = tokens.create("ci", "submitter")
    session = tokens.open_session(token)
    assert session is not None
    held = everything_in(redis)
    assert token.encode() not in held
    assert session.cookie.encode() not in held
    assert token_hash(token).encode() in held
    assert tokens.check(token) == info
    assert tokens.session(session.cookie) == session.record
    assert session.record.token == token_hash(token)


def test_a_token_name_is_taken_until_its_token_is_revoked_or_expires(redis: fakeredis.FakeRedis) -> None:
    tokens = TokenStore(redis, KEYS)
    tokens.create("ci", "submitter")
    with pytest.raises(TokenError, match="exists"):
        tokens.create("ci", "viewer")
    assert tokens.revoke("ci")
    assert not tokens.revoke("ci")
    tokens.create("ci", "viewer", expires_in=0.001)
    time.sleep(0.01)
    second, info = tokens.create("ci", "admin")
    assert tokens.check(second) == info
    assert [token.role for token in tokens.list()] == ["admin"]


def test_revoking_a_token_stops_it_at_once_and_says_so_on_the_channel(redis: fakeredis.FakeRedis) -> None:
    tokens = TokenStore(redis, KEYS)
    token, _ = tokens.create("laptop", "viewer")
    listener = redis.pubsub()
    listener.subscribe(KEYS.tokens_revoked)
    assert tokens.revoke("laptop")
    assert tokens.check(token) is None
    assert tokens.list() == []
    assert next_message(listener)["data"] == b"laptop"
    listener.close()


def test_the_token_list_forgets_names_whose_tokens_expired(redis: fakeredis.FakeRedis) -> None:
    tokens = TokenStore(redis, KEYS)
    tokens.create("short", "viewer", expires_in=0.001)
    tokens.create("long", "metrics")
    time.sleep(0.01)
    assert [token.name for token in tokens.list()] == ["long"]
    assert redis.hkeys(KEYS.tokens) == [b"long"]


@pytest.mark.parametrize("lifetime", [0, -1, 10 * 365 * 86400 + 1])
def test_a_token_lifetime_must_be_positive_and_at_most_ten_years(
    redis: fakeredis.FakeRedis, lifetime: float
) -> None:
    with pytest.raises(TokenError, match="lifetime"):
        TokenStore(redis, KEYS).create("ci", "viewer", expires_in=lifetime)
    assert redis.keys() == []


def test_a_session_ends_with_its_token_and_closes_at_once(redis: fakeredis.FakeRedis) -> None:
    tokens = TokenStore(redis, KEYS)
    token, _ = tokens.create("browser", "viewer", expires_in=60)
    session = tokens.open_session(token, lifetime=3600)
    assert session is not None
    assert session.lifetime <= 60
    assert 0 < redis.pttl(KEYS.session(token_hash(session.cookie))) <= 60_000
    assert tokens.close_session(session.cookie)
    assert tokens.session(session.cookie) is None
    assert not tokens.close_session(session.cookie)
    assert tokens.open_session("glt_not-a-token") is None


def test_failed_logins_count_within_a_window_that_later_failures_do_not_extend(
    redis: fakeredis.FakeRedis,
) -> None:
    tokens = TokenStore(redis, KEYS)
    assert [tokens.failed_login("10.0.0.7", window=60) for _ in range(3)] == [1, 2, 3]
    first_ttl = redis.ttl(KEYS.login_failures("10.0.0.7"))
    redis.expire(KEYS.login_failures("10.0.0.7"), 30)
    tokens.failed_login("10.0.0.7", window=60)
    assert 0 < first_ttl <= 60
    assert redis.ttl(KEYS.login_failures("10.0.0.7")) <= 30
    assert tokens.login_failures("10.0.0.7") == 4
    assert tokens.login_failures("10.0.0.8") == 0


def test_a_histogram_reads_back_cumulative_with_its_sum_in_seconds(redis: fakeredis.FakeRedis) -> None:
    # As the scripts write it: a count per bucket index (the last one past every bound), the sum in ms.
    bounds = (0.01, 0.1, 1.0)
    redis.hset("h", mapping={"0": 2, "2": 3, "3": 1, "sum": 4_250})
    read = histograms.read(redis, "h", bounds)
    assert read.buckets == [(0.01, 2), (0.1, 2), (1.0, 5), (float("inf"), 6)]
    assert read.total == 4.25
    empty = histograms.read(redis, "none", bounds)
    assert empty.buckets == [(0.01, 0), (0.1, 0), (1.0, 0), (float("inf"), 0)]
    assert empty.total == 0
    assert histograms.bounds_ms(histograms.START_BUCKETS)[:3] == (2, 5, 10)


def test_the_queue_listing_gives_each_queues_depth_and_leaves_a_garbled_one_out(
    redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = QueueSpec(requirements=Requirements(gpus=2), priority=5)
    redis.hset(KEYS.queues, mapping={"gl-test:gpu": gpu.model_dump_json(), "gl-test:bad": "{not json"})
    redis.hset(KEYS.queues, "gl-test:cpu", QueueSpec().model_dump_json())
    redis.rpush(KEYS.queue("gl-test:gpu"), "a", "b", "c")
    redis.zadd(KEYS.gangs, {"gang-1": 1, "gang-2": 2})
    with caplog.at_level(logging.WARNING, logger="gpulayer"):
        queues, gangs = QueueStore(redis, KEYS).list()
    assert [(queue.name, queue.depth, queue.priority) for queue in queues] == [
        ("gl-test:cpu", 0, 0),
        ("gl-test:gpu", 3, 5),
    ]
    assert queues[1].requirements.gpus == 2
    assert gangs == 2
    assert "queue gl-test:bad cannot be read, and is left out" in caplog.text


def test_telemetry_keeps_an_hour_of_samples_and_skips_a_garbled_one(redis: fakeredis.FakeRedis) -> None:
    store = TelemetryStore(redis, KEYS, interval=5.0)
    listener = redis.pubsub()
    listener.subscribe(KEYS.events)
    now = int(time.time() * 1000)
    for n in range(3):
        store.record("w1", Telemetry(time=now + n, cpu_percent=n, load=0, memory_used=1, memory_total=2))
    redis.xadd(KEYS.telemetry("w1"), {"d": b"\xff garbled"})
    history = store.history(["w1", "w2"], seconds=60)
    assert [sample.cpu_percent for sample in history["w1"]] == [0, 1, 2]
    assert history["w2"] == []
    assert 0 < redis.ttl(KEYS.telemetry("w1")) <= 3600
    assert json.loads(next_message(listener)["data"])["type"] == "telemetry"
    listener.close()


def test_one_worker_takes_each_intervals_activity_sample(redis: fakeredis.FakeRedis) -> None:
    store = TelemetryStore(redis, KEYS, interval=5.0)
    assert store.activity_turn("w1")
    assert not store.activity_turn("w2")
    assert redis.get(KEYS.activity_turn) == b"w1"
    assert 0 < redis.pttl(KEYS.activity_turn) <= 4_900
