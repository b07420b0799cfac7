"""What every gRPC call does around the service functions: read the API key from the metadata, run
blocking work (the database, the broker) in a thread and never start it after the call's deadline,
and turn service errors into status codes (the REST error code rides along in trailing metadata)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, ParamSpec, TypeAlias, TypeVar

import grpc

from agentloop.api import auth
from agentloop.api.auth import Principal
from agentloop.api.errors import DATABASE_ERRORS, DeadlineExceeded, ServiceError, database_unavailable
from agentloop.api.rate_limits import admit
from agentloop.api.text_guard import check_message
from agentloop.store.db import get_sessionmaker

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"  # metadata keys are lower case on the wire
ERROR_CODE = "agentloop-error-code"

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
P = ParamSpec("P")
R = TypeVar("R")


def authorization(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION:
            return value if isinstance(value, str) else value.decode()
    return None


def deadline(context: Context) -> float | None:
    """The call's deadline on the time.monotonic() clock (None: the client set none)."""
    left = context.time_remaining()
    return None if left is None else time.monotonic() + left


async def blocking(context: Context, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    left = context.time_remaining()
    if left is not None and left <= 0:
        raise DeadlineExceeded("the call's deadline passed; nothing was done")
    return await asyncio.to_thread(fn, *args, **kwargs)


def _authenticate(authorization: str | None) -> Principal:
    with get_sessionmaker()() as session:
        return admit(auth.authenticate(session, authorization))  # the request rates, as REST (rate_limits.py)


async def principal(context: Context) -> Principal:
    """The caller, from `authorization: Bearer <key>` (UNAUTHENTICATED when missing or wrong)."""
    return await blocking(context, _authenticate, authorization(context))


async def admin(context: Context) -> Principal:
    caller = await principal(context)
    caller.require_admin()
    return caller


async def _abort(context: Context, exc: ServiceError) -> NoReturn:
    metadata: tuple[tuple[str, str], ...] = ((ERROR_CODE, exc.code),)
    if exc.retry_after_s is not None:
        metadata += (("retry-after", str(exc.retry_after_s)),)
    await context.abort(grpc.StatusCode[exc.grpc_status], exc.message, trailing_metadata=metadata)
    raise AssertionError("unreachable: abort raises")


async def _internal(context: Context, name: str) -> NoReturn:
    log.exception("gRPC %s failed", name)
    await context.abort(
        grpc.StatusCode.INTERNAL,
        "internal error; the server log has the details",
        trailing_metadata=((ERROR_CODE, "internal"),),
    )
    raise AssertionError("unreachable: abort raises")


Handler = Callable[..., Any]


def translates_errors(method: Handler) -> Handler:
    """Decorates a servicer method, unary or server-streaming: a request holding text no store can hold is
    INVALID_ARGUMENT before the method runs (text_guard.py); a ServiceError becomes its status code;
    anything unexpected is logged and becomes INTERNAL (no stack trace goes to the client)."""
    name = method.__name__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def streaming(self: Any, request: Any, context: Context) -> AsyncIterator[Any]:
            try:
                check_message(request)
                async for response in method(self, request, context):
                    yield response
            except ServiceError as exc:
                await _abort(context, exc)
            except grpc.aio.AbortError:
                raise
            except DATABASE_ERRORS as exc:
                log.warning("database unavailable during gRPC %s: %s", name, getattr(exc, "orig", None) or exc)
                await _abort(context, database_unavailable(exc))
            except Exception:
                await _internal(context, name)

        return streaming

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Context) -> Any:
        try:
            check_message(request)
            return await method(self, request, context)
        except ServiceError as exc:
            await _abort(context, exc)
        except grpc.aio.AbortError:
            raise
        except DATABASE_ERRORS as exc:
            log.warning("database unavailable during gRPC %s: %s", name, getattr(exc, "orig", None) or exc)
            await _abort(context, database_unavailable(exc))
        except Exception:
            await _internal(context, name)

    return unary
