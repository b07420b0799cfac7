"""A real grpc.aio server on loopback (in its own thread and event loop, as in `agentloop serve`),
clients on real channels, and episodes run by the same runner a Celery worker calls."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from agentloop.agent.runner import run_served_task
from agentloop.api.grpc.server import GrpcServer, start_server
from agentloop.policy.base import Generation, GenerationRequest
from agentloop.proto_gen.agentloop.v1 import agent_pb2_grpc
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker
from tests.factories import Keys, make_keys


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@dataclass
class Stubs:
    channel: grpc.aio.Channel
    agent: agent_pb2_grpc.AgentServiceStub
    admin: agent_pb2_grpc.AdminServiceStub


class ServerThread:
    """The gRPC server in an event loop of its own thread; tests talk to it over loopback."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-server", daemon=True)
        self.thread.start()
        self.server: GrpcServer = self.call(start_server(get_settings(), "127.0.0.1", 0))
        self.target = f"127.0.0.1:{self.server.port}"

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop_soon(self, grace_s: float) -> Any:
        """Start a graceful stop; returns a future that is done when the server has stopped."""
        return asyncio.run_coroutine_threadsafe(self.server.stop(grace_s), self.loop)

    def close(self) -> None:
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Stubs]:
        async with grpc.aio.insecure_channel(self.target) as channel:
            yield Stubs(channel, agent_pb2_grpc.AgentServiceStub(channel), agent_pb2_grpc.AdminServiceStub(channel))


@dataclass
class Api:
    server: ServerThread
    keys: Keys

    def connect(self) -> contextlib.AbstractAsyncContextManager[Stubs]:
        return self.server.connect()


@pytest.fixture
def api(sqlite_db: str) -> Iterator[Api]:
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    server = ServerThread()
    yield Api(server, keys)
    server.close()


class GatedPolicy:
    """A policy whose every turn waits for the test's go-ahead (`allow`), so a test can act while an
    episode is half done. Everything else is the wrapped policy's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.permits = threading.Semaphore(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def allow(self, turns: int = 1) -> None:
        for _ in range(turns):
            self.permits.release()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not self.permits.acquire(timeout=60):
            raise TimeoutError("the test never allowed this turn")
        generations: list[Generation] = self.inner.generate(requests)
        return generations


class EpisodeThread(threading.Thread):
    """Runs one served task as a worker would (`run_served_task`), in the background."""

    def __init__(self, task_id: str, policy: Any) -> None:
        super().__init__(name=f"episode-{task_id[:8]}", daemon=True)
        self.task_id, self.policy = task_id, policy
        self.outcome: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.outcome = run_served_task(self.task_id, "test-worker", self.policy, get_settings())
        except BaseException as exc:
            self.error = exc

    def finish(self, timeout: float = 120) -> str:
        self.join(timeout)
        assert not self.is_alive(), "the episode did not end"
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


@dataclass
class RunTaskStream:
    """What a RunTask call streamed, and the episode a worker thread ran for it."""

    kinds: list[str]
    submitted: list[Any]
    steps: list[Any]
    result: Any
    episode: EpisodeThread | None


def run_task_streamed(api: Api, request: Any, policy: GatedPolicy) -> RunTaskStream:
    """RunTask over a real channel; the task's episode runs in a thread as a worker would, each turn allowed
    only after the previous step arrived."""

    async def scenario() -> RunTaskStream:
        out = RunTaskStream([], [], [], None, None)
        async with api.connect() as c:
            async for event in c.agent.RunTask(request, metadata=auth(api.keys.tenant_a_client)):
                kind = event.WhichOneof("event")
                out.kinds.append(kind)
                if kind == "submitted":
                    out.submitted.append(event.submitted)
                    out.episode = EpisodeThread(event.submitted.id, policy)
                    out.episode.start()
                    policy.allow()
                elif kind == "step":
                    out.steps.append(event.step)
                    policy.allow()
                elif kind == "result":
                    out.result = event.result
        return out

    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Any) -> Any:
    """The tiny random Llama as a served policy (real sampling, real log-probs), loaded once."""
    from tests.factories import tiny_policy

    return tiny_policy(tiny_model_dir)
