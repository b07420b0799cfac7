"""Running the API: REST (uvicorn) and gRPC in one event loop, stopped together on SIGTERM/SIGINT.

On the first signal both stop taking new requests and give running ones, streams included,
`shutdown_grace_s` to finish; a second signal stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn

from agentloop.api.grpc.server import GrpcServer, start_server
from agentloop.settings import Settings

log = logging.getLogger(__name__)


class RestServer(uvicorn.Server):
    """uvicorn, leaving signals to `serve` (uvicorn's own handlers would re-raise the signal when it
    is done, ending the process before gRPC has drained)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: Settings, host: str, port: int | None, grpc_port: int | None) -> None:
    """REST on `port` and gRPC on `grpc_port` (None: not served) until SIGTERM/SIGINT."""
    from agentloop.api.app import create_app

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    rest: RestServer | None = None
    rpc: GrpcServer | None = None
    forced: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        if stop.is_set():  # a second signal: no more grace
            if rest is not None:
                rest.force_exit = True
            if rpc is not None:
                forced.append(loop.create_task(rpc.server.stop(0)))
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    if grpc_port:
        rpc = await start_server(settings, host, grpc_port)
    waiting: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait())]
    if port:
        rest = RestServer(
            uvicorn.Config(
                create_app(settings),
                host=host,
                port=port,
                log_level=settings.log_level.lower(),
                timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
            )
        )
        waiting.append(asyncio.create_task(rest.serve()))
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        log.info("shutting down; running requests have %s s to finish", settings.shutdown_grace_s)
        if rest is not None:
            rest.should_exit = True
        await asyncio.gather(*waiting[1:], *([rpc.stop(settings.shutdown_grace_s)] if rpc else []))
        waiting[0].cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
