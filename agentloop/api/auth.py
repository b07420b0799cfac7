"""API keys: `al_<random>` shown once, stored as a sha256 hash; tenants and roles.

Roles, each above the one before: `client` (tasks, feedback, apps and demonstrations of its tenant), `admin`
(its tenant's training runs, adapters and settings), `operator` (the deployment's owner: the shared runs and
adapter, every tenant's runs and adapters, `/metrics`, the private networks an app may call). An operator key
belongs to a tenant too and acts as that tenant's admin on the tenant's own objects."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.api.errors import PermissionDenied, Unauthenticated
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
    tenant = get_or_create_tenant(session, tenant_name)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(tenant_id=tenant.id, role=role, name=name, prefix=key[:10], key_hash=hash_key(key))
    session.add(row)
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


def any_keys(session: Session) -> bool:
    return session.scalar(sa.select(sa.func.count()).select_from(ApiKey)) != 0


def tenant_admin(session: Session, tenant_name: str) -> Principal | None:
    """Whom a command run on the deployment acts as for a tenant (`agentloop demos import`): an admin of that
    tenant, holding no key (whoever runs it has the database). None when no tenant has that name."""
    tenant = session.scalars(sa.select(Tenant).where(Tenant.name == tenant_name)).first()
    if tenant is None:
        return None
    return Principal(tenant_id=tenant.id, tenant=tenant.name, role="admin", key_id="")
