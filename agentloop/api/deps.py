"""FastAPI dependencies: a session per request and the caller's principal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Header
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from agentloop.api.auth import Principal, authenticate
from agentloop.api.rate_limits import admit
from agentloop.store.db import get_sessionmaker


async def get_session() -> AsyncIterator[Session]:
    """The request's session. Async, so that neither end costs a trip to the thread pool: making one opens
    no connection (its first query does, in the route's thread); at the end, one that a route left holding a
    connection is rolled back (whatever it did not commit is dropped) in the pool's thread, one with none
    (never used, or committed) just closes."""
    session = get_sessionmaker()()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(_drop, session)
        else:
            session.close()


def _drop(session: Session) -> None:
    session.rollback()
    session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def get_principal(
    session: SessionDep,
    authorization: Annotated[str | None, Header(description="`Bearer <API key>`")] = None,
) -> Principal:
    return admit(authenticate(session, authorization))  # its key's and tenant's request rates (rate_limits.py)


def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    principal.require_admin()
    return principal


def get_operator(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    principal.require_operator()
    return principal


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]
AdminPrincipal = Annotated[Principal, Depends(get_admin)]
OperatorPrincipal = Annotated[Principal, Depends(get_operator)]
