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

from limits import parse_many
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from agentloop.api.auth import Principal
from agentloop.api.errors import RateLimited, Unavailable
from agentloop.settings import Settings, get_settings


@dataclass(frozen=True)
class _Config:
    storage: str
    per_key: str
    per_tenant: str


class Limiter:
    def __init__(self, config: _Config) -> None:
        self.per_key = parse_many(config.per_key) if config.per_key else []
        self.per_tenant = parse_many(config.per_tenant) if config.per_tenant else []
        options = {"key_prefix": "agentloop"} if config.storage.startswith(("redis://", "rediss://")) else {}
        self.window = MovingWindowRateLimiter(storage_from_string(config.storage, **options))

    def admit(self, principal: Principal) -> None:
        """One hit of the key's and the tenant's rates; RateLimited when either is spent."""
        for item, scope, who in [
            *((item, "API key", principal.key_id) for item in self.per_key),
            *((item, "tenant", principal.tenant_id) for item in self.per_tenant),
        ]:
            try:
                if self.window.hit(item, scope, who):
                    continue
                reset = self.window.get_window_stats(item, scope, who).reset_time
            except Exception as exc:  # the store of the windows (Redis) is down: say so, never let all through
                raise Unavailable(f"the rate limiter's store is unavailable ({type(exc).__name__}: {exc})") from None
            wait = max(1, math.ceil(reset - time.time()))
            raise RateLimited(f"this {scope}'s rate limit ({item}) is reached; retry in {wait} s", wait)


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
