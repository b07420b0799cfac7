"""Which worker processes consume which queues, for `/readyz`.

Every worker keeps a record of itself (its queues) fresh from a thread of its own, every lease_s/4,
valid for lease_s. Not Celery's `inspect`/`ping` or heartbeat events: a solo-pool worker answers
those from the loop its episode blocks (for minutes), and the embedded SQL broker cannot broadcast
at all. A worker that stops cleanly removes its record; one killed with -9 drops out once its record
is lease_s old.

Records live in Redis (the events Redis: AGENTLOOP_REDIS_URL, or a Redis broker) or, with the embedded
broker (one machine), in files under `AGENTLOOP_HOME/workers/`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import redis

from agentloop.settings import Settings

log = logging.getLogger(__name__)

REDIS_KEY = "agentloop:workers"
TIMEOUT_S = 1.0  # redis-py waits forever by default; /readyz must answer in about this long


class PresenceStore(Protocol):
    def put(self, node: str, record: str) -> None: ...
    def remove(self, node: str) -> None: ...
    def records(self) -> dict[str, str]: ...


class RedisPresence:
    """One Redis hash: worker -> its record."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client  # bytes replies (no decode_responses)

    def put(self, node: str, record: str) -> None:
        self.client.hset(REDIS_KEY, node, record)

    def remove(self, node: str) -> None:
        self.client.hdel(REDIS_KEY, node)

    def records(self) -> dict[str, str]:
        replies: dict[bytes, bytes] = self.client.hgetall(REDIS_KEY)  # type: ignore[assignment]
        return {k.decode(): v.decode() for k, v in replies.items()}


class FilePresence:
    """One file per worker; written whole (temp file, rename), so a reader never sees half a record."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, node: str, record: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{node}.tmp"
        tmp.write_text(record)
        os.replace(tmp, self.directory / f"{node}.json")

    def remove(self, node: str) -> None:
        (self.directory / f"{node}.json").unlink(missing_ok=True)

    def records(self) -> dict[str, str]:
        out = {}
        for path in self.directory.glob("*.json"):
            try:
                out[path.stem] = path.read_text()
            except FileNotFoundError:  # removed since the listing
                continue
        return out


@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)


def presence_store(settings: Settings) -> PresenceStore | None:
    """Where this deployment keeps worker records; None where it has no such place."""
    if settings.events_redis_url:
        return RedisPresence(_redis(settings.events_redis_url))
    if settings.broker_is_embedded:
        return FilePresence(settings.home.resolve() / "workers")
    return None


def consumers(settings: Settings, queues: Iterable[str]) -> dict[str, int] | None:
    """Live workers consuming each of `queues`; None where workers are not tracked. Records past their
    expiry (workers that died without removing theirs) are ignored and removed."""
    store = presence_store(settings)
    if store is None:
        return None
    counts = dict.fromkeys(queues, 0)
    now = time.time()
    for node, raw in store.records().items():
        record = json.loads(raw)
        if record["expires_at"] <= now:
            store.remove(node)
            continue
        for queue in record["queues"]:
            if queue in counts:
                counts[queue] += 1
    return counts


class Announcement(threading.Thread):
    """Keeps this worker's record fresh until `stop()`, which removes it."""

    def __init__(self, store: PresenceStore, queues: list[str], settings: Settings) -> None:
        super().__init__(daemon=True, name="worker-presence")
        self.store, self.queues = store, queues
        self.interval_s, self.ttl_s = settings.heartbeat_s, float(settings.lease_s)
        self.node = re.sub(r"[^\w.-]", "_", f"{socket.gethostname()}-{os.getpid()}")
        self.stopped = threading.Event()

    def put(self) -> None:
        record = json.dumps({"queues": self.queues, "expires_at": time.time() + self.ttl_s})
        try:
            self.store.put(self.node, record)
        except Exception as exc:  # the next beat tries again; the record outlives several
            log.warning("could not record worker %s as present: %s", self.node, exc)

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.put()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
        try:
            self.store.remove(self.node)
        except Exception as exc:  # it expires after lease_s anyway
            log.warning("could not remove the presence record of worker %s: %s", self.node, exc)


_announcement: Announcement | None = None


def announce(queues: list[str], settings: Settings) -> None:
    """Record this worker as consuming `queues` (now, then every lease_s/4) until `withdraw()`."""
    global _announcement
    store = presence_store(settings)
    if store is None or _announcement is not None:
        return
    _announcement = Announcement(store, queues, settings)
    _announcement.put()  # present as soon as the worker consumes
    _announcement.start()
    log.info("worker %s consuming %s", _announcement.node, ", ".join(queues))


def withdraw() -> None:
    global _announcement
    if _announcement is not None:
        _announcement.stop()
        _announcement = None
