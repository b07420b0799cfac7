"""Data functions for apps registered by tenants. The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.apps.external import ExternalApp
from agentloop.apps.openapi import Operation, parse_document
from agentloop.store.models import App
from agentloop.store.secrets import decrypt

# of App.operations; a row in another format is resolved again from its document
# (2: operations keep their summary apart from their description, and their schemas' JSON Schema draft)
OPERATIONS_FORMAT = 2


def get_app(session: Session, tenant_id: str, name: str) -> App | None:
    return session.scalars(sa.select(App).where(App.tenant_id == tenant_id, App.name == name)).first()


def list_apps(session: Session, tenant_id: str) -> Sequence[App]:
    return session.scalars(sa.select(App).where(App.tenant_id == tenant_id).order_by(App.name)).all()


def store_operations(row: App, operations: list[Operation]) -> None:
    """Keep the resolved operations on the row (at registration, or the first use of an older row)."""
    row.operations = {"format": OPERATIONS_FORMAT, "operations": [op.to_json() for op in operations]}
    row.operation_ids = [op.operation_id for op in operations]


def _stored(row: App) -> dict[str, Any]:
    if row.operations is None or row.operations.get("format") != OPERATIONS_FORMAT or row.operation_ids is None:
        # registered before the resolved form was kept: resolve once; the caller's commit keeps it
        store_operations(row, parse_document(row.spec))
    assert row.operations is not None
    return row.operations


def operations(row: App) -> list[Operation]:
    """The app's operations, as resolved at registration (the document is not parsed again)."""
    return [Operation.from_json(op) for op in _stored(row)["operations"]]


def operation_ids(row: App) -> list[str]:
    if row.operation_ids is None:
        _stored(row)
    assert row.operation_ids is not None
    return [str(op_id) for op_id in row.operation_ids]


def to_external(row: App, secret_key: str) -> ExternalApp:
    """The runtime object of a registered app (its auth header decrypted)."""
    header = None
    if row.auth_header_encrypted:
        name, _, value = decrypt(row.auth_header_encrypted, secret_key).partition(":")
        header = (name, value)
    return ExternalApp.of_operations(
        row.name, row.description, operations(row), row.base_url, row.allowed_networks, header
    )
