"""Request rates and quotas. Each authenticated request (REST or gRPC) spends one hit of its key's rate and
one of its tenant's (settings `rate_limit_per_key`, `rate_limit_per_tenant`, in the `limits` library's
notation, e.g. "600/minute"); over either, the request is refused with 429 / RESOURCE_EXHAUSTED and
Retry-After, before it does anything. The windows live in Redis when the deployment has one (shared by
every API process) and in the process otherwise (the embedded mode runs one). Quotas on what a tenant
holds, tasks queued or running at once and registered apps, are checked where those are created."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from agentloop.api.auth import Principal
from agentloop.api.errors import RateLimited, Unavailable
from agentloop.settings import Settings, get_settings

# Every window of a request in one round trip: each is a list of the hit times of its last `limit` hits; the
# request passes when, in each, the limit-th newest hit is older than the window, and then counts in all of
# them; refused, it counts in none. Returns {0} or {i, the time of window i's limit-th newest hit}.
HIT_ALL = """
local now = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
    local limit, expiry = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    local oldest = redis.call('lindex', key, limit - 1)
    if oldest and tonumber(oldest) >= now - expiry then
        return {i, oldest}
    end
end
for i, key in ipairs(KEYS) do
    local limit, expiry = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    redis.call('lpush', key, ARGV[1])
    redis.call('ltrim', key, 0, limit - 1)
    redis.call('expire', key, expiry)
end
return {0}
"""


@dataclass(frozen=True)
class _Config:
    storage: str
    per_key: str
    per_tenant: str


Window = tuple[RateLimitItem, str, str]  # the limit, whose ("API key", "tenant"), and its id


class Limiter:
    """Moving windows (the `limits` library's semantics and notation): in Redis, all of a request's windows
    checked and counted by one script in one round trip; in the process (no Redis), by `limits`' memory
    store under a lock."""

    def __init__(self, config: _Config) -> None:
        self.per_key = parse_many(config.per_key) if config.per_key else []
        self.per_tenant = parse_many(config.per_tenant) if config.per_tenant else []
        self._redis: Any = None
        if config.storage.startswith(("redis://", "rediss://", "unix://")):
            import redis

            client = redis.Redis.from_url(config.storage, socket_timeout=5, socket_connect_timeout=5)
            self._redis = client.register_script(HIT_ALL)
        else:
            self._lock = threading.Lock()
            self._memory = MovingWindowRateLimiter(MemoryStorage())

    def admit(self, principal: Principal) -> None:
        """One hit of the key's and the tenant's rates; RateLimited (nothing counted) when either is spent."""
        windows: list[Window] = [
            *((item, "API key", principal.key_id) for item in self.per_key),
            *((item, "tenant", principal.tenant_id) for item in self.per_tenant),
        ]
        if not windows:
            return
        try:
            refused = self._hit_redis(windows) if self._redis is not None else self._hit_memory(windows)
        except Exception as exc:  # the store of the windows (Redis) is down: say so, never let all through
            raise Unavailable(f"the rate limiter's store is unavailable ({type(exc).__name__}: {exc})") from None
        if refused is not None:
            (item, scope, _), reset = refused
            wait = max(1, math.ceil(reset - time.time()))
            raise RateLimited(f"this {scope}'s rate limit ({item}) is reached; retry in {wait} s", wait)

    def _hit_redis(self, windows: list[Window]) -> tuple[Window, float] | None:
        args: list[Any] = [time.time()]
        for item, _, _ in windows:
            args += [item.amount, item.get_expiry()]
        keys = [f"agentloop/{item.key_for(scope, who)}" for item, scope, who in windows]
        answer = self._redis(keys=keys, args=args)
        if int(answer[0]) == 0:
            return None
        window = windows[int(answer[0]) - 1]
        return window, float(answer[1]) + window[0].get_expiry()

    def _hit_memory(self, windows: list[Window]) -> tuple[Window, float] | None:
        with self._lock:
            for window in windows:
                if not self._memory.test(*window):
                    return window, self._memory.get_window_stats(*window).reset_time
            for window in windows:
                self._memory.hit(*window)
        return None


_lock = threading.Lock()
_limiters: dict[_Config, Limiter] = {}


def limiter(settings: Settings | None = None) -> Limiter:
    """The process's limiter for these settings (one per configuration: the windows are kept across requests)."""
    s = settings or get_settings()
    config = _Config(s.events_redis_url or "memory://", s.rate_limit_per_key, s.rate_limit_per_tenant)
    with _lock:
        if config not in _limiters:
            _limiters[config] = Limiter(config)
        return _limiters[config]


def admit(principal: Principal) -> Principal:
    limiter().admit(principal)
    return principal
