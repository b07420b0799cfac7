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
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.api.errors import Conflict, InvalidRequest, NotFound, PermissionDenied, Unauthenticated
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
    return row, key


def authenticate(session: Session, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthenticated(
            "missing API key: send 'Authorization: Bearer <key>' (an HTTP header; gRPC metadata `authorization`)"
        )
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthenticated("malformed Authorization: expected 'Bearer <key>'")
    row = session.execute(
        sa.select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(
            ApiKey.key_hash == hash_key(key.strip()),
            ApiKey.revoked_at.is_(None),
            sa.or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > utcnow()),
        )
    ).first()
    if row is None:
        raise Unauthenticated("invalid or revoked API key")
    api_key, tenant_name = row
    return Principal(tenant_id=api_key.tenant_id, tenant=tenant_name, role=api_key.role, key_id=api_key.id)


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
