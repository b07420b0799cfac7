"""Data functions for apps registered by tenants. The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.apps.external import ExternalApp
from agentloop.store.models import App
from agentloop.store.secrets import decrypt


def get_app(session: Session, tenant_id: str, name: str) -> App | None:
    return session.scalars(sa.select(App).where(App.tenant_id == tenant_id, App.name == name)).first()


def list_apps(session: Session, tenant_id: str) -> Sequence[App]:
    return session.scalars(sa.select(App).where(App.tenant_id == tenant_id).order_by(App.name)).all()


def to_external(row: App, secret_key: str) -> ExternalApp:
    """The runtime object of a registered app (its auth header decrypted)."""
    header = None
    if row.auth_header_encrypted:
        name, _, value = decrypt(row.auth_header_encrypted, secret_key).partition(":")
        header = (name, value)
    return ExternalApp.build(row.name, row.description, row.spec, row.base_url, row.allow_private, header)
