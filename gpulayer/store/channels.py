"""What a server hears over pub/sub, on a connection of its own: revoked tokens' names, always, and
the events channel (job states, workers, telemetry samples, as JSON) only while asked, since every
job's every change crosses it."""

from __future__ import annotations

from typing import Any, Literal

from redis import Redis

from .keys import Keys

#: A message heard: an event (its JSON text), or the name of a token just revoked.
Message = tuple[Literal["event", "revoked"], str]


class Subscription:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._keys = keys
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        self._pubsub.subscribe(keys.tokens_revoked)
        self._events = False

    def follow_events(self, wanted: bool) -> None:
        """Hear the events channel from now on, or no longer."""
        if wanted != self._events:
            (self._pubsub.subscribe if wanted else self._pubsub.unsubscribe)(self._keys.events)
            self._events = wanted

    def next(self, timeout: float) -> Message | None:
        """The next message, waiting at most ``timeout`` seconds for it."""
        message: dict[str, Any] | None = self._pubsub.get_message(timeout=timeout)
        if message is None:
            return None
        kind: Literal["event", "revoked"] = (
            "event" if message["channel"].decode() == self._keys.events else "revoked"
        )
        return kind, message["data"].decode()

    def close(self) -> None:
        self._pubsub.close()
