"""A registered external app, ready for an episode: its AppSpec for the World, and, when it declares
the agentloop_* operations, the environment that resets and evaluates its tasks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentloop.apps.addresses import stored_networks
from agentloop.apps.base import Api, ApiError, AppSpec, CallContext
from agentloop.apps.openapi import EXAMPLE_OP, HIDDEN_OPS, Operation, parse_document
from agentloop.apps.remote_env import RemoteEnvironment
from agentloop.apps.remote_http import HttpLimits, Origin, RemoteClient, call_operation, configured_limits
from agentloop.apps.world_prompt import WorkedExample, parse_worked_example

SEPARATOR = ":"  # task refs of external apps are "<app>:<ref>"


@dataclass
class ExternalApp:
    name: str
    description: str
    operations: list[Operation]
    client: RemoteClient

    @classmethod
    def build(
        cls,
        name: str,
        description: str,
        document: dict[str, Any],
        base_url: str,
        allowed_networks: Sequence[str] = (),
        auth_header: tuple[str, str] | None = None,
        limits: HttpLimits | None = None,
    ) -> ExternalApp:
        """The app of an OpenAPI document (parsed here; registered apps are built from their stored operations)."""
        return cls.of_operations(
            name, description, parse_document(document), base_url, allowed_networks, auth_header, limits
        )

    @classmethod
    def of_operations(
        cls,
        name: str,
        description: str,
        operations: list[Operation],
        base_url: str,
        allowed_networks: Sequence[str] = (),
        auth_header: tuple[str, str] | None = None,
        limits: HttpLimits | None = None,
    ) -> ExternalApp:
        networks = stored_networks(allowed_networks)
        client = RemoteClient(Origin.parse(base_url), networks, auth_header, limits or configured_limits())
        if auth_header:  # the service sends it: not an argument the agent gives
            operations = [op.without_headers((auth_header[0],)) for op in operations]
        return cls(name, description, operations, client)

    def fork(self) -> ExternalApp:
        """The same app with a client of its own (its own Agentloop-Episode), for one episode."""
        return replace(self, client=replace(self.client, episode=None))

    def spec(self) -> AppSpec:
        return remote_app(self.name, self.description, self.operations, self.client)

    def environment(self) -> RemoteEnvironment | None:
        return RemoteEnvironment.of(self.operations, self.client, self.name)


def split_task_ref(task_ref: str) -> tuple[str, str] | None:
    """("app", "ref") for an external task ref "<app>:<ref>", else None."""
    if SEPARATOR not in task_ref:
        return None
    app, ref = task_ref.split(SEPARATOR, 1)
    return (app, ref) if app and ref else None


def remote_app(name: str, description: str, operations: list[Operation], client: RemoteClient) -> AppSpec:
    """An AppSpec whose handlers call the external app; the agentloop_* operations stay hidden, and
    agentloop_example, when declared, is the app's worked example."""
    spec = AppSpec(name=name, description=description, login=False)
    calls = Budget(client.limits.max_calls, name)  # one spec per episode (`fork`): the episode's budget
    for op in operations:
        spec.apis[op.operation_id] = Api(
            app=name,
            name=op.operation_id,
            description=op.description,
            summary=op.summary,
            parameters=op.arguments_schema(),
            returns=op.returns,
            handler=_handler(client, op, calls),
            hidden=op.operation_id in HIDDEN_OPS,
        )
        if op.operation_id == EXAMPLE_OP:
            spec.worked_example = _worked_example(name, client, op)
    return spec


@dataclass
class Budget:
    """The calls the agent may make to one app in one episode (setting app_max_calls_per_episode)."""

    allowed: int
    app: str
    made: int = 0

    def spend(self) -> None:
        if self.made >= self.allowed:
            raise ApiError(429, f"this episode has made its {self.allowed} calls to app {self.app!r}: no more are sent")
        self.made += 1


def _handler(client: RemoteClient, op: Operation, calls: Budget) -> Callable[..., Any]:
    def handle(_ctx: CallContext, **args: Any) -> Any:
        calls.spend()
        return call_operation(client, op, args)

    return handle


def _worked_example(name: str, client: RemoteClient, op: Operation) -> Callable[[], WorkedExample]:
    def fetch() -> WorkedExample:  # raises ApiError (the call) or ValueError (the answer's shape)
        return parse_worked_example(call_operation(client, op, {}), f"app {name!r}")

    return fetch


def free_instruction_refusal(name: str) -> str:
    """Why a free instruction may not use an app that is an environment: without a task there is nothing
    to reset, and the protocol gives a request without an episode no state to act on."""
    return (
        f"app {name!r} is an environment (it declares agentloop_reset and agentloop_evaluate): each episode on it "
        f"starts from one of its tasks, reset for that episode. Name one as task_ref '{name}:<task>' instead of a "
        "free instruction (agentloop_tasks lists them), or register the app without those operations"
    )
