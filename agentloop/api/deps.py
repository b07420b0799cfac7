"""FastAPI dependencies: a session per request and the caller's principal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header
from sqlalchemy.orm import Session

from agentloop.api.auth import Principal, authenticate
from agentloop.api.rate_limits import admit
from agentloop.store.db import get_sessionmaker


def get_session() -> Iterator[Session]:
    session = get_sessionmaker()()
    try:
        yield session
    finally:
        session.rollback()  # whatever a route did not commit is dropped
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
