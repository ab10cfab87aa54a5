"""Transfers of the archives a worker holds, through Redis: both sides only dial Redis, so a worker
behind NAT serves them too.

A client asks the worker on its request stream (:meth:`Keys.transfers`) under a random transfer id.
The worker pushes the transfer's messages on a list (:meth:`Keys.transfer`) and the client pops them;
the client pushes its acks (how many chunks it has written) on a second list, and the worker pushes
no chunk while a window of them is unacked, so Redis holds at most that many of one transfer. Both
lists expire :data:`TRANSFER_TTL` after their last push: a side that vanished leaves nothing behind.
What the messages hold, and why no reader of Redis but the asker can read or forge them, is
:mod:`gpulayer.transfer_seal`'s.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import cast

from redis import Redis

from ..transfer_seal import Ask
from .keys import Keys

#: A worker's request stream keeps at most about this many requests, and lives a day past the last.
_REQUESTS = 1000
_REQUESTS_TTL = 86400
#: A transfer's lists live this long (s) past their last push.
TRANSFER_TTL = 60
#: A worker that serves what it keeps says so this often (s); a client calls it gone after
#: :data:`GONE_AFTER` without a word.
SERVING_EVERY = 10.0
GONE_AFTER = 3 * SERVING_EVERY
#: A transfer id: what the asker draws (128 random bits, hex). Anything else is refused unread.
_TRANSFER_ID = re.compile(r"^[0-9a-f]{32}$")


def valid_transfer_id(transfer_id: str) -> bool:
    return bool(_TRANSFER_ID.match(transfer_id))


class TransferStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    # --- the asker's ----------------------------------------------------------------------------
    def ask(self, worker: str, ask: Ask) -> None:
        """Ask ``worker`` for an archive it holds."""
        key = self._keys.transfers(worker)
        fields = {"id": ask.transfer_id, "job": ask.job_id, "name": ask.name, "offset": ask.offset}
        fields["key"] = ask.key
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(key, fields, maxlen=_REQUESTS, approximate=True)  # type: ignore[arg-type]
        pipe.expire(key, _REQUESTS_TTL)
        pipe.execute()

    def receive(self, transfer_id: str, timeout: float) -> bytes | None:
        """The next message of a transfer, waiting up to ``timeout`` seconds; None if none came."""
        popped = self._redis.blpop([self._keys.transfer(transfer_id)], timeout=timeout)
        return cast(tuple[bytes, bytes], popped)[1] if popped else None

    def ack(self, transfer_id: str, written: int) -> None:
        """Tell the sender that ``written`` chunks have been written: it may send more."""
        self._push(self._keys.transfer_acks(transfer_id), str(written).encode())

    def _push(self, key: str, value: bytes) -> None:
        """Onto one of a transfer's lists, which then lives :data:`TRANSFER_TTL` more."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.rpush(key, value)
        pipe.expire(key, TRANSFER_TTL)
        pipe.execute()

    def close(self, transfer_id: str) -> None:
        """Drop what is left of a transfer."""
        self._redis.delete(self._keys.transfer(transfer_id), self._keys.transfer_acks(transfer_id))

    def last_served(self, worker: str) -> datetime | None:
        """When ``worker`` last said it serves what it holds (None: not within a retention period)."""
        raw = cast(bytes | None, self._redis.get(self._keys.serving(worker)))
        try:
            return datetime.fromisoformat(raw.decode()) if raw else None
        except ValueError:
            return None

    # --- the worker's ---------------------------------------------------------------------------
    def serving(self, worker: str, ttl: int) -> None:
        """Say that ``worker`` serves what it holds, now."""
        self._redis.set(self._keys.serving(worker), datetime.now(timezone.utc).isoformat(), ex=ttl)

    def last_request(self, worker: str) -> str:
        """The id of the newest request on ``worker``'s stream ("0-0": none): where to read from."""
        key = self._keys.transfers(worker)
        newest = cast(list[tuple[bytes, object]], self._redis.xrevrange(key, count=1))
        return newest[0][0].decode() if newest else "0-0"

    def requests(self, worker: str, after: str, block: float) -> list[tuple[str, Ask | None]]:
        """The requests after the one with id ``after``, waiting up to ``block`` seconds for one;
        each with its id, and None for one that cannot be read."""
        reply = self._redis.xread({self._keys.transfers(worker): after}, block=int(block * 1000))
        entries = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]], reply or [])
        return [(entry.decode(), _ask(fields)) for _, found in entries for entry, fields in found]

    def send(self, transfer_id: str, message: bytes) -> None:
        self._push(self._keys.transfer(transfer_id), message)

    def acked(self, transfer_id: str, timeout: float) -> int | None:
        """The most chunks the receiver has said it wrote, waiting up to ``timeout`` seconds for a
        word; None if none came."""
        key = self._keys.transfer_acks(transfer_id)
        popped = self._redis.blpop([key], timeout=timeout)
        if not popped:
            return None
        pipe = self._redis.pipeline(transaction=True)
        pipe.lrange(key, 0, -1)
        pipe.delete(key)
        later = cast(list[bytes], pipe.execute()[0])
        counts = [int(raw) for raw in [cast(tuple[bytes, bytes], popped)[1], *later] if raw.isdigit()]
        return max(counts, default=0)


def _ask(fields: dict[bytes, bytes]) -> Ask | None:
    try:
        ask = Ask(
            fields[b"id"].decode(),
            fields[b"job"].decode(),
            fields[b"name"].decode(),
            int(fields[b"offset"]),
            fields[b"key"].decode(),
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    return ask if valid_transfer_id(ask.transfer_id) and ask.offset >= 0 else None
