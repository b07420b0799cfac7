"""Wake-up notices between processes: "task X has a new step", "adapter vN is active".

The database holds the facts; these notices only tell a waiting reader to look again now rather
than at its next poll (or, for a serving worker, to load a newly activated adapter before its next
episode asks for it). With Redis configured they go over pub/sub; without it readers poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio as aioredis

from agentloop.settings import get_settings

log = logging.getLogger(__name__)


def task_channel(task_id: str) -> str:
    return f"agentloop:task:{task_id}"


def run_channel(run_id: str) -> str:
    return f"agentloop:training:{run_id}"


ADAPTERS_CHANNEL = "agentloop:adapters"


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    # 2 s instead of redis-py's unbounded default: a notice is never worth blocking a step
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def publish(channel: str, payload: dict[str, Any]) -> None:
    """Best effort: a lost notice only delays a reader until its next poll."""
    url = get_settings().events_redis_url
    if not url:
        return
    try:
        _client(url).publish(channel, json.dumps(payload))
    except redis.RedisError as exc:
        log.warning("event publish to %s failed: %s", channel, exc)


class Waiter:
    """Wait for a notice on one channel, or at most `timeout` seconds (polling fallback)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._url = get_settings().events_redis_url
        self._client: aioredis.Redis | None = None
        self._pubsub: Any = None

    @property
    def subscribed(self) -> bool:
        return self._pubsub is not None

    async def __aenter__(self) -> Waiter:
        if self._url:
            try:
                self._client = aioredis.Redis.from_url(self._url, socket_connect_timeout=2)
                self._pubsub = self._client.pubsub()
                await self._pubsub.subscribe(self.channel)
            except (redis.RedisError, OSError) as exc:
                log.warning("subscribe to %s failed (%s); polling instead", self.channel, exc)
                await self._close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        self._pubsub = self._client = None

    async def wait(self, timeout: float) -> None:
        if self._pubsub is None:
            await asyncio.sleep(timeout)
            return
        try:
            await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
            # drain whatever else arrived: one look at the database covers them all
            while await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=0):
                pass
        except (redis.RedisError, OSError) as exc:
            log.warning("pub/sub on %s failed (%s); polling instead", self.channel, exc)
            await self._close()
            await asyncio.sleep(timeout)


class Listener(threading.Thread):
    """Calls `on_notice(payload)` for every notice on `channel`, from a daemon thread, and
    `on_notice(None)` each time it has (re)subscribed: a notice sent while it was not listening is
    covered by that one look. Reconnects after a lost connection; `stop()` ends it within a second."""

    RETRY_S = 1.0

    def __init__(self, channel: str, url: str, on_notice: Callable[[dict[str, Any] | None], None]) -> None:
        super().__init__(daemon=True, name=f"listen-{channel}")
        self.channel, self.url, self.on_notice = channel, url, on_notice
        self.subscribed = threading.Event()  # set while the subscription is confirmed
        self._stop_event = threading.Event()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError) as exc:
                log.warning("listening on %s failed (%s); retrying in %g s", self.channel, exc, self.RETRY_S)
            self.subscribed.clear()
            self._stop_event.wait(self.RETRY_S)

    def _listen(self) -> None:
        # no socket timeout: get_message bounds each read, so stop() is noticed within a second
        client = redis.Redis.from_url(self.url, socket_connect_timeout=2, health_check_interval=30)
        with client, client.pubsub() as pubsub:
            pubsub.subscribe(self.channel)
            while not self._stop_event.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self._deliver(None)
                    self.subscribed.set()
                elif message["type"] == "message":
                    self._deliver(_payload(message["data"]))

    def _deliver(self, payload: dict[str, Any] | None) -> None:
        try:
            self.on_notice(payload)
        except Exception:  # the next notice (or the reader's own look) tries again
            log.exception("handling a notice on %s failed", self.channel)


def _payload(data: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None
