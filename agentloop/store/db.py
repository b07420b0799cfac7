"""The one engine and session factory of a process. Callers own their transactions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from agentloop.settings import get_settings


def normalise_url(url: str) -> str:
    """`postgresql://` means psycopg 3 here (SQLAlchemy would pick psycopg2)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str) -> sa.Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # the API, the worker and beat write the same file from separate processes
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        settings = get_settings()
        kwargs.update(
            pool_size=settings.database_pool_size,
            max_overflow=settings.database_max_overflow,
            pool_timeout=settings.database_pool_timeout_s,
        )
    engine = sa.create_engine(url, **kwargs)
    if parsed.get_backend_name() != "sqlite":
        ping_after_idle(engine)
    else:

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    return engine


API_PING_AFTER_IDLE_S = 10.0  # an API server's default (settings.database_ping_after_idle_s unset)
_serving_requests = False


def serve_requests() -> None:
    """This process serves API requests (REST, gRPC): unless `database_ping_after_idle_s` says otherwise, its
    pooled connections are checked only after API_PING_AFTER_IDLE_S idle, not at every checkout; a request
    spends round trips on its own statements. Workers, beat and the CLI check every checkout: a round trip per
    write is nothing beside a model's step, and a connection cut between two of an episode's writes then goes
    unnoticed."""
    global _serving_requests
    _serving_requests = True


def ping_threshold_s() -> float:
    """How long a pooled connection may sit idle before a checkout checks it (0: every checkout)."""
    chosen = get_settings().database_ping_after_idle_s
    if chosen is not None:
        return chosen
    return API_PING_AFTER_IDLE_S if _serving_requests else 0.0


def ping_after_idle(engine: sa.Engine) -> None:
    """A pooled connection idle `ping_threshold_s()` or longer is checked with one round trip (what
    pool_pre_ping does) before it is handed out, and replaced when the server dropped it (a restart, an idle
    timeout, a proxy). One that breaks in use anyway is a clean error for that request (503), and SQLAlchemy
    then replaces every connection of the pool opened before the break, so the retry gets a fresh one."""

    @sa.event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None or time.monotonic() - since < ping_threshold_s():
            return  # new, or back in the pool a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # the pool discards it and connects again (up to three tries)
            raise sa.exc.DisconnectionError(f"a pooled connection was dropped while idle: {exc}") from exc


_engines: dict[str, sa.Engine] = {}
_sessionmakers: dict[str, sessionmaker[Session]] = {}


def get_engine() -> sa.Engine:
    url = get_settings().db_url
    if url not in _engines:
        _engines[url] = make_engine(url)
    return _engines[url]


def get_sessionmaker() -> sessionmaker[Session]:
    url = get_settings().db_url
    if url not in _sessionmakers:  # cleared with the engines (reset_engines)
        _sessionmakers[url] = sessionmaker(bind=get_engine(), expire_on_commit=False)
    return _sessionmakers[url]


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error (for workers and scripts)."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def reset_engines() -> None:
    """Dispose cached engines (tests switch databases; forked workers need fresh pools)."""
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()
    _sessionmakers.clear()
