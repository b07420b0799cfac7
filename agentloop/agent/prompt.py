"""Prompt rendering: the system prompt, the first user message, and the token segments the episode
appends after each turn. Token-in/token-out: the context is a concatenation of exact token ids;
nothing already in it is ever re-tokenised.

The opening prompt is composed from the world: its apps, and its provider's persona, conventions and
worked example (`World.prompt`); a world that supplies none, and a task of attached (external) apps
only, get the neutral parts of `apps/world_prompt.py`."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from agentloop.agent.actions import render_action
from agentloop.apps.api_doc import one_line
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import ALWAYS_AVAILABLE, World
from agentloop.apps.world_prompt import WorkedExample, WorldPrompt, neutral_prompt
from agentloop.policy.base import Tokenizer

log = logging.getLogger(__name__)

# an app's description in the list of apps: one line of at most this many estimated tokens (`text_size`),
# about 200 characters of English (external apps write their own)
DESCRIPTION_SIZE = 50
DOCS_RULE = "Use api_docs.list_apis and api_docs.show_api_doc to learn an app's APIs and their parameters."

SYSTEM = """{persona}

Apps you can use:
{apps}

Each turn, reply with exactly one API call, written like this:
{example_call}
The result comes back in the next message. Then make the next call.

Rules:
{rules}
- When the task is done, call supervisor.complete_task. If the task asks a question, pass the answer:
  {answer_call}

The first task below is a worked example; the real task comes after it."""


def world_prompt(world: World) -> WorldPrompt:
    """The parts this episode's prompt is made of: the provider's while the task uses one of the world's
    own apps (or no attached app), else the neutral ones with the first app's own worked example."""
    own = [a for a in world.available if a not in ALWAYS_AVAILABLE and a not in world.attached]
    if world.prompt is not None and (own or not world.attached):
        return world.prompt(world)
    neutral = neutral_prompt()
    return replace(neutral, example=app_example(world) or neutral.example)


def app_example(world: World) -> WorkedExample | None:
    """The worked example of the first available app that serves one; None when none does or it fails."""
    for name in world.available:
        fetch = world.apps[name].worked_example
        if fetch is None:
            continue
        try:
            return fetch()
        except Exception as exc:  # whatever the app does, the episode starts with the neutral example
            log.warning("app %s: no worked example (%s); the neutral one is used", name, exc)
            return None
    return None


def render_system(world: World, parts: WorldPrompt) -> str:
    listed = [name for name in world.available if name not in parts.unlisted_apps]
    apps = [_app_line(name, world.apps[name].description) for name in listed]
    return SYSTEM.format(
        persona=parts.persona,
        apps="\n".join(apps),
        example_call=render_action(parts.first_call),
        rules="\n".join(f"- {rule}" for rule in (DOCS_RULE, *parts.conventions)),
        answer_call=render_action(ToolCall("supervisor", "complete_task", {"answer": "42"})),
    )


def _app_line(name: str, description: str) -> str:
    summary = one_line(description, DESCRIPTION_SIZE)
    return f"- {name}: {summary}" if summary else f"- {name}"


def example_messages(example: WorkedExample) -> list[dict[str, str]]:
    """The worked example as chat messages: the task, then each call and what it returned."""
    messages = [{"role": "user", "content": f"Task: {example.instruction}"}]
    for step in example.steps:
        messages.append({"role": "assistant", "content": render_action(step.call)})
        messages.append({"role": "user", "content": render_observation(step.call, True, step.observation)})
    return messages


def render_task(parts: WorldPrompt, instruction: str) -> str:
    return f"{parts.preamble}Task: {instruction}"


def render_observation(call: ToolCall | None, ok: bool, value: Any) -> str:
    """What the agent sees after its action: the API's return value, or a plain error."""
    if call is None:
        return f"Error: {value}"
    name = f"{call.app}.{call.api}"
    if not ok:
        return f"Error from {name}: {value}"
    body = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    return f"{name} returned:\n{body}"


@dataclass
class ChatFormat:
    """Token segments of the model's chat template: the opening prompt and what goes between turns."""

    tokenizer: Tokenizer

    def __post_init__(self) -> None:
        # Learn the template's turn separators once, by rendering sentinel messages.
        conv = [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ]
        with_obs = self._text([*conv, {"role": "user", "content": "\x00OBS\x00"}], add_generation_prompt=True)
        base = self._text(conv, add_generation_prompt=False)
        a_end = base.rindex("A") + 1
        if not with_obs.startswith(base[:a_end]):
            raise ValueError("unsupported chat template: a conversation's rendering is not a prefix of a longer one")
        suffix = with_obs[a_end:]
        self.obs_before, self.obs_after = suffix.split("\x00OBS\x00")
        eos_ids = self.tokenizer.eos_token_id
        self.eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
        self.eos_text = self.tokenizer.decode(sorted(self.eos_ids)[:1], skip_special_tokens=False)
        specials = getattr(self.tokenizer, "all_special_tokens", [])
        self.specials = sorted(
            {s for s in [*specials, "<|im_start|>", "<|im_end|>"] if len(s) > 1}, key=len, reverse=True
        )

    def _text(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return str(text)

    def opening(self, system: str, user: str, example: list[dict[str, str]] | None = None) -> list[int]:
        messages = [{"role": "system", "content": system}, *(example or []), {"role": "user", "content": user}]
        return list(self.tokenizer.encode(self._text(messages, True), add_special_tokens=False))

    def observation_ids(self, observation: str, stopped: bool) -> list[int]:
        """Tokens appended after a turn: close the assistant turn (unless the model did), the observation
        as a user message, and the next assistant header."""
        for special in self.specials:  # an observation must not be able to fake a turn boundary
            observation = observation.replace(special, special[0] + " " + special[1:])
        before = self.obs_before
        if stopped and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]
        return list(self.tokenizer.encode(before + observation + self.obs_after, add_special_tokens=False))
