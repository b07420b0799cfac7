"""API keys: `al_<random>` shown once, stored as a sha256 hash; tenants and roles.

Roles, each above the one before: `client` (tasks, feedback, apps and demonstrations of its tenant), `admin`
(its tenant's training runs, adapters and settings), `operator` (the deployment's owner: the shared runs and
adapter, every tenant's runs and adapters, `/metrics`, the private networks an app may call). An operator key
belongs to a tenant too and acts as that tenant's admin on the tenant's own objects.

Rotating a key (`rotate_key`) gives a new one with the same tenant, role and name; the old one keeps working
for a grace period (`expires_at`), or is revoked at once. Streams re-check their key (`check_key`)."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.api.errors import Conflict, InvalidRequest, NotFound, PermissionDenied, Unauthenticated
from agentloop.settings import get_settings
from agentloop.store.models import ApiKey, Tenant, utcnow

ROLES = ("client", "admin", "operator")
KEY_PREFIX = "al_"


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    tenant: str
    role: str
    key_id: str

    @property
    def is_admin(self) -> bool:
        """An admin of its tenant (an operator is one too)."""
        return self.role in ("admin", "operator")

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def require_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"this needs an admin key; this key's role is {self.role!r}")

    def require_operator(self) -> None:
        if not self.is_operator:
            raise PermissionDenied(
                f"this needs an operator key (the deployment's owner); this key's role is {self.role!r}"
            )


def hash_key(key: str) -> str:
    # keys are 32 random bytes: a plain hash is enough (no password stretching needed)
    return hashlib.sha256(key.encode()).hexdigest()


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalars(sa.select(Tenant).where(Tenant.name == name)).first()
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def create_key(session: Session, tenant_name: str, role: str, name: str = "") -> tuple[ApiKey, str]:
    """Returns the row and the key itself (the only time it exists in clear)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    return _new_key(session, get_or_create_tenant(session, tenant_name).id, role, name)


def _new_key(session: Session, tenant_id: str, role: str, name: str) -> tuple[ApiKey, str]:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(tenant_id=tenant_id, role=role, name=name, prefix=key[:10], key_hash=hash_key(key))
    session.add(row)
    session.flush()
    return row, key


GRACE_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_grace(text: str) -> int:
    """Seconds in a duration like `30s`, `15m`, `2h`, `1d`, or `0` (at once)."""
    if text.strip() == "0":
        return 0
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match is None:
        raise InvalidRequest(
            f"grace must be a whole number and a unit (s, m, h or d), like 30s, 15m, 2h or 1d, or 0 to revoke "
            f"the old key at once; not {text!r}"
        )
    return int(match[1]) * GRACE_UNITS_S[match[2]]


def rotate_key(session: Session, key_id: str, grace_s: int) -> tuple[ApiKey, str]:
    """A new key with the old one's tenant, role and name; the old one stops working after `grace_s`
    (0: revoked now). Never lengthens the old key's life: an expiry already sooner stays.
    Returns the new row and the new key itself (the only time it exists in clear)."""
    if grace_s < 0:
        raise InvalidRequest(f"grace must not be negative, got {grace_s} s")
    old = session.get(ApiKey, key_id)
    if old is None:
        raise NotFound(f"no key with id {key_id!r}; `agentloop keys list` shows the ids")
    now = utcnow()
    if old.revoked_at is not None:
        raise Conflict(
            f"key {key_id} was revoked at {old.revoked_at.isoformat(timespec='seconds')}; "
            "create a new one with `agentloop keys create`"
        )
    if old.expires_at is not None and old.expires_at <= now:
        raise Conflict(
            f"key {key_id} expired at {old.expires_at.isoformat(timespec='seconds')}; "
            "create a new one with `agentloop keys create`"
        )
    row, key = _new_key(session, old.tenant_id, old.role, old.name)
    if grace_s == 0:
        old.revoked_at = now
    else:
        ends = now + timedelta(seconds=grace_s)
        old.expires_at = ends if old.expires_at is None else min(old.expires_at, ends)
    session.flush()
    key_cache.forget()  # this process refuses the old key at once (others within api_key_cache_s)
    return row, key


class KeyCache:
    """The principals of keys found valid in the last `ttl_s` seconds, by key hash, so that a client's
    requests in a burst look their key up once (setting `api_key_cache_s`; 0: every request looks it up). A
    key revoked or rotated by this process is forgotten at once; by another process (the CLI, another API
    worker), within `ttl_s`. An entry never outlives its key's expiry. Keys refused are never kept."""

    MAX_ENTRIES = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, tuple[Principal, float]] = {}

    def get(self, digest: str) -> Principal | None:
        with self._lock:
            found = self._found.get(digest)
            if found is None:
                return None
            if time.monotonic() >= found[1]:
                del self._found[digest]
                return None
            return found[0]

    def put(self, digest: str, principal: Principal, ttl_s: float, expires_at: datetime | None) -> None:
        keep_s = ttl_s if expires_at is None else min(ttl_s, (expires_at - utcnow()).total_seconds())
        if keep_s <= 0:
            return
        with self._lock:
            if len(self._found) >= self.MAX_ENTRIES:
                self._found.clear()
            self._found[digest] = (principal, time.monotonic() + keep_s)

    def forget(self) -> None:
        with self._lock:
            self._found.clear()


key_cache = KeyCache()


def authenticate(session: Session, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthenticated(
            "missing API key: send 'Authorization: Bearer <key>' (an HTTP header; gRPC metadata `authorization`)"
        )
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("malformed Authorization: expected 'Bearer <key>'")
    digest = hash_key(key.strip())
    ttl_s = get_settings().api_key_cache_s
    if ttl_s > 0 and (cached := key_cache.get(digest)) is not None:
        return cached
    row = session.execute(
        sa.select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(
            ApiKey.key_hash == digest,
            ApiKey.revoked_at.is_(None),
            sa.or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > utcnow()),
        )
    ).first()
    if row is None:
        raise Unauthenticated("invalid or revoked API key")
    api_key, tenant_name = row
    principal = Principal(tenant_id=api_key.tenant_id, tenant=tenant_name, role=api_key.role, key_id=api_key.id)
    if ttl_s > 0:
        key_cache.put(digest, principal, ttl_s, api_key.expires_at)
    return principal


def check_key(session: Session, key_id: str) -> None:
    """Unauthenticated unless the key is still valid (not revoked, not expired): what an open stream asks
    before it sends more. One primary-key lookup."""
    row = session.execute(sa.select(ApiKey.revoked_at, ApiKey.expires_at).where(ApiKey.id == key_id)).first()
    if row is None or row.revoked_at is not None:
        raise Unauthenticated("the API key was revoked")
    if row.expires_at is not None and row.expires_at <= utcnow():
        raise Unauthenticated("the API key expired (it was rotated; use the key that replaced it)")


def any_keys(session: Session) -> bool:
    return session.scalar(sa.select(sa.func.count()).select_from(ApiKey)) != 0


def tenant_admin(session: Session, tenant_name: str) -> Principal | None:
    """Whom a command run on the deployment acts as for a tenant (`agentloop demos import`): an admin of that
    tenant, holding no key (whoever runs it has the database). None when no tenant has that name."""
    tenant = session.scalars(sa.select(Tenant).where(Tenant.name == tenant_name)).first()
    if tenant is None:
        return None
    return Principal(tenant_id=tenant.id, tenant=tenant.name, role="admin", key_id="")
