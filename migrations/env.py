"""Alembic environment: the URL from code or AGENTLOOP_DATABASE_URL; batch mode on SQLite."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from sqlalchemy.sql.type_api import Variant

from agentloop.settings import get_settings
from agentloop.store.db import make_engine, normalise_url
from agentloop.store.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata


def render_item(type_: str, obj: object, autogen_context: object) -> str | bool:
    """Render our column types as plain SQLAlchemy ones, so migrations never import the models."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, sa.JSON | Variant):
        autogen_context.imports.add("from sqlalchemy.dialects import postgresql")  # type: ignore[attr-defined]
        return 'sa.JSON().with_variant(postgresql.JSONB(), "postgresql")'
    return False


def _url() -> str:
    return normalise_url(config.get_main_option("sqlalchemy.url") or get_settings().db_url)


def run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_item=render_item,
        render_as_batch=_url().startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if isinstance(connectable, sa.Engine):  # handed in by a caller (pytest-alembic)
        with connectable.connect() as conn:
            _run(conn)
            conn.commit()
        return
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(conn: object) -> None:
    context.configure(
        connection=conn,
        target_metadata=target_metadata,  # type: ignore[arg-type]
        render_as_batch=conn.dialect.name == "sqlite",  # type: ignore[attr-defined]
        compare_type=True,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
