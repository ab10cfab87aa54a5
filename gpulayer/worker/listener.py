"""The worker's one pub/sub connection, owned by one thread: commands, wake-ups, new queues.

redis-py's PubSub is not thread-safe, so other threads never touch it: they say which channels
they want, and this thread subscribes and unsubscribes between reads (within a tenth of a second),
then calls ``on_change``: a message published before it subscribed was missed, and the worker looks
for what it would have announced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis.exceptions
from redis import Redis

from ..store.connection import RECONNECT_AFTER

log = logging.getLogger("gpulayer.worker")

Handler = Callable[[dict[str, Any]], None]
#: Longest wait for a message before channel changes are applied.
_READ_TIMEOUT = 0.1


class Listener(threading.Thread):
    def __init__(
        self, connection: Redis, channels: dict[str, Handler], on_change: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__(name="gpulayer-listener", daemon=True)
        self._on_change = on_change
        self._pubsub = connection.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        self._lock = threading.Lock()
        self._wanted = dict(channels)
        self._subscribed: set[str] = set()
        self._stopping = threading.Event()

    def set_channels(self, channels: dict[str, Handler]) -> None:
        """Listen to exactly these channels from now on (applied by the listener thread)."""
        with self._lock:
            self._wanted = dict(channels)

    def run(self) -> None:
        backoff = RECONNECT_AFTER
        while not self._stopping.is_set():
            try:
                self._apply()
                self._pubsub.get_message(timeout=_READ_TIMEOUT)
                backoff = RECONNECT_AFTER
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                # redis-py subscribes again to every channel when it reconnects.
                log.error("pub/sub connection lost (%s); retrying in %.2g s", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=2 * _READ_TIMEOUT + 1)
        self._pubsub.close()

    def _apply(self) -> None:
        with self._lock:
            wanted = dict(self._wanted)
        added = {channel: handler for channel, handler in wanted.items() if channel not in self._subscribed}
        removed = self._subscribed - set(wanted)
        if added:
            self._pubsub.subscribe(**added)
        if removed:
            self._pubsub.unsubscribe(*removed)  # type: ignore[no-untyped-call, unused-ignore]
        self._subscribed = set(wanted)
        if added:
            self._on_change()
