"""What a world says about itself in the agent's prompt: who the agent works for, the world's conventions
and a worked example. `agent/prompt.py` renders it; a world that supplies nothing gets `neutral_prompt()`,
whose example reads an (invented) app's docs through `api_docs`, so it fits any app and names no built-in one.

An external app may serve its own worked example from the hidden operation `agentloop_example`
(GET → `{"instruction": str, "steps": [{"app", "api", "args", "observation"}, ...]}`, the last step
`supervisor.complete_task`); `parse_worked_example` checks that answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from agentloop.apps.tasks import ToolCall

if TYPE_CHECKING:
    from agentloop.apps.base import AppSpec
    from agentloop.apps.world import World

EXAMPLE_MAX_STEPS = 12
EXAMPLE_MAX_CHARS = 6000  # the example is in every prompt: an app's must not crowd out the task


@dataclass(frozen=True)
class ExampleStep:
    call: ToolCall
    observation: Any  # what the API returned (shown as `render_observation` shows a real result)


@dataclass(frozen=True)
class WorkedExample:
    """A solved task shown before the real one (one-shot): a small model copies its form."""

    instruction: str
    steps: tuple[ExampleStep, ...]


@dataclass(frozen=True)
class WorldPrompt:
    """A world's parts of the prompt. The renderer adds what every world shares: the apps (name and
    one-line description), the action format, the api_docs rule and how to end with complete_task."""

    persona: str  # the system prompt's first line
    conventions: tuple[str, ...]  # the world's own rules, one bullet each
    first_call: ToolCall  # the call shown to explain the action format
    example: WorkedExample
    preamble: str = ""  # what the user message says before "Task: <instruction>"
    unlisted_apps: frozenset[str] = frozenset()  # apps available but not listed among "Apps you can use"
    # apps the worked example calls that its worlds do not have (the neutral example's weather app): the
    # example's task lists them with their APIs as a real task lists its own
    example_apps: Mapping[str, AppSpec] = field(default_factory=dict)


# How a World gets its provider's parts: called once per episode, with the episode's world.
PromptSource = Callable[["World"], WorldPrompt]


def _step(app: str, api: str, args: dict[str, Any], observation: Any) -> ExampleStep:
    return ExampleStep(ToolCall(app, api, args), observation)


NEUTRAL_INSTRUCTION = "How warm will it get in Lisbon tomorrow? Answer in degrees Celsius."
FORECAST = [{"day": "today", "high_c": 21, "low_c": 14}, {"day": "tomorrow", "high_c": 24, "low_c": 15}]


@cache
def neutral_prompt() -> WorldPrompt:
    """The parts of a world that supplies none. Its worked example is played on an invented `weather` app
    through the real `api_docs`, so each of its answers reads exactly as api_docs answers in an episode."""
    from agentloop.apps.base import AppSpec, CallContext, integer, string
    from agentloop.apps.builtin.apps import api_docs
    from agentloop.apps.world import World

    weather = AppSpec(name="weather", description="Weather forecasts for cities around the world.", login=False)

    @weather.api(
        "Find cities by name.",
        params={"query": string("Part of the city's name.")},
        required=["query"],
        returns="[{city, country}]",
    )
    def search_cities(ctx: CallContext, query: str) -> list[dict[str, str]]:
        return [{"city": "Lisbon", "country": "Portugal"}]

    @weather.api(
        "The daily forecast of a city, from today.",
        params={"city": string("The city's name."), "days": integer("How many days.", minimum=1, default=3)},
        required=["city"],
        returns="[{day, high_c, low_c}]",
    )
    def show_forecast(ctx: CallContext, city: str, days: int) -> list[dict[str, Any]]:
        return FORECAST[:days]

    world = World(
        name="example",
        seed=0,
        now=datetime(2025, 1, 1, tzinfo=UTC),
        apps={"api_docs": api_docs.app, "weather": weather},
        state={"api_docs": {}, "weather": {}},
        available=["api_docs", "weather"],
    )
    # the task's message lists the apps and their APIs; the example reads the one doc it needs
    calls = [
        ToolCall("api_docs", "show_api_doc", {"app_name": "weather", "api_name": "show_forecast"}),
        ToolCall("weather", "show_forecast", {"city": "Lisbon", "days": 2}),
    ]
    steps = [ExampleStep(c, world.call(c.app, c.api, c.args)) for c in calls]
    steps.append(_step("supervisor", "complete_task", {"answer": 24}, "Task marked as complete."))
    return WorldPrompt(
        persona="You are an assistant that completes tasks by calling the APIs of apps.",
        conventions=("Never guess ids or values: look them up with the apps' APIs.",),
        first_call=ToolCall("api_docs", "list_apps", {}),
        example=WorkedExample(NEUTRAL_INSTRUCTION, tuple(steps)),
        example_apps={"weather": weather},
        # the supervisor app only ends the episode here (the rules say how); it is nobody's persona
        unlisted_apps=frozenset({"supervisor"}),
    )


def parse_worked_example(value: Any, source: str) -> WorkedExample:
    """An `agentloop_example` answer as a WorkedExample; raises ValueError saying what is wrong."""
    where = f"{source}: agentloop_example"
    if not isinstance(value, dict) or not isinstance(value.get("instruction"), str) or not value["instruction"]:
        raise ValueError(f'{where} must return {{"instruction": str, "steps": [...]}}')
    raw_steps = value.get("steps")
    if not isinstance(raw_steps, list) or not 1 <= len(raw_steps) <= EXAMPLE_MAX_STEPS:
        raise ValueError(f'{where}: "steps" must be a list of 1 to {EXAMPLE_MAX_STEPS} steps')
    size = len(json.dumps(value, ensure_ascii=False, default=str))
    if size > EXAMPLE_MAX_CHARS:
        raise ValueError(f"{where} is {size} characters long; at most {EXAMPLE_MAX_CHARS} fit in the prompt")
    steps = []
    for i, raw in enumerate(raw_steps):
        ok = isinstance(raw, dict) and isinstance(raw.get("app"), str) and isinstance(raw.get("api"), str)
        args = raw.get("args", {}) if isinstance(raw, dict) else None
        if not ok or not isinstance(args, dict):
            raise ValueError(f"{where}: step {i} needs app and api (strings) and args (an object)")
        steps.append(_step(raw["app"], raw["api"], args, raw.get("observation")))
    last = steps[-1].call
    if (last.app, last.api) != ("supervisor", "complete_task"):
        raise ValueError(f"{where}: the last step must be supervisor.complete_task, not {last.app}.{last.api}")
    return WorkedExample(value["instruction"], tuple(steps))
