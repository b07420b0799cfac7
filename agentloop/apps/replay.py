"""An expert demonstration's steps checked against a World, then replayed on it: what a learner is shown
as the result of an expert's call is what that call returns in the task's world, never a made-up value."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentloop.apps.base import Api, ApiError
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World

LISTED_APIS = 30  # an unknown API's error names at most this many of the app's APIs


class StepRejected(ValueError):
    """A step that cannot be kept: its index (from 0), its call and why."""

    def __init__(self, index: int, call: ToolCall, reason: str) -> None:
        self.index, self.call, self.reason = index, call, reason
        self.message = f"step {index} ({call.app}.{call.api}; steps count from 0): {reason}"
        super().__init__(self.message)


def args_size(args: Any) -> int:
    """Bytes of the arguments as compact UTF-8 JSON: what the limit on a step's `args` measures."""
    return len(json.dumps(args, separators=(",", ":"), ensure_ascii=False).encode())


def _api(world: World, index: int, call: ToolCall) -> Api:
    """The API a step names, or why there is none, in words for the demonstration's author."""
    if call.app not in world.available or call.app not in world.apps:
        raise StepRejected(
            index, call, f"app {call.app!r} is not one of this task's apps ({', '.join(world.available)})"
        )
    apis = world.apps[call.app].apis
    api = apis.get(call.api)
    if api is None or api.hidden:
        names = sorted(name for name, a in apis.items() if not a.hidden)
        shown = ", ".join(names[:LISTED_APIS]) + (", …" if len(names) > LISTED_APIS else "")
        raise StepRejected(index, call, f"app {call.app!r} has no API {call.api!r}; its APIs: {shown}")
    return api


def check_steps(world: World, steps: Sequence[ToolCall], max_args_bytes: int) -> None:
    """Every step names an app the task may use and one of its APIs, with arguments that API's schema
    accepts and within `max_args_bytes`. Calls nothing: this is all an external app's steps get."""
    for index, call in enumerate(steps):
        size = args_size(call.args)
        if size > max_args_bytes:
            raise StepRejected(
                index, call, f"its args are {size} bytes as compact JSON, over the limit of {max_args_bytes}"
            )
        api = _api(world, index, call)
        try:
            api.validate(call.args)
        except ApiError as exc:
            raise StepRejected(index, call, exc.message) from None


def replay_steps(world: World, steps: Sequence[ToolCall]) -> list[Any]:
    """Run the steps in order on `world` (the task's initial state); returns what each returned. The first
    that fails rejects the demonstration: an expert step that errors would teach a call that does not work."""
    results = []
    for index, call in enumerate(steps):
        try:
            result = world.call(call.app, call.api, call.args)
        except ApiError as exc:
            raise StepRejected(index, call, f"failed when replayed on the task's world: {exc}") from None
        # a copy as of now: a result may share records with the world, which later steps change
        results.append(json.loads(json.dumps(result)))
    return results
