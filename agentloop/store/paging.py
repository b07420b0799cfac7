"""Keyset pages, newest first on (created_at, id): stable while rows are added, with no OFFSET scans."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import InstrumentedAttribute

T = TypeVar("T")

Before = tuple[datetime, str]  # (created_at, id) of the last row of the previous page


def newest_first(
    stmt: sa.Select[T],
    created: InstrumentedAttribute[datetime],
    ident: InstrumentedAttribute[str],
    before: Before | None,
    limit: int,
) -> sa.Select[T]:
    """`stmt` ordered newest first, from just after `before`, at most `limit` rows."""
    if before is not None:
        at, row_id = before
        stmt = stmt.where(sa.or_(created < at, sa.and_(created == at, ident < row_id)))
    return stmt.order_by(created.desc(), ident.desc()).limit(limit)
