"""Prompt rendering: the system prompt, the first user message, and the token segments the episode
appends after each turn. Token-in/token-out: the context is a concatenation of exact token ids;
nothing already in it is ever re-tokenised.

The opening prompt is composed from the world: its provider's persona, conventions and worked example
(`World.prompt`); a world that supplies none, and a task of attached (external) apps only, get the neutral
parts of `apps/world_prompt.py`. The system prompt and the worked example say nothing about one task, so
every episode of a world opens with the same tokens (the learner runs that shared opening once per batch,
a server can cache it); the task's message lists its apps, each with an index of its APIs and their
parameters, then the provider's preamble and the instruction. A text world (`World.commands`) has no apps to
list: its prompt says how to write a command, its provider's conventions name the commands it takes, and the
task's message is the preamble (where the episode starts) and the instruction."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agentloop.agent.actions import action_space, render_action, render_observation
from agentloop.apps.api_doc import api_index, one_line, text_size
from agentloop.apps.base import AppSpec
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import ALWAYS_AVAILABLE, World
from agentloop.apps.world_prompt import WorkedExample, WorldPrompt, neutral_prompt
from agentloop.policy.base import Tokenizer

log = logging.getLogger(__name__)

# an app's description in the list of apps: one line of at most this many estimated tokens (`text_size`),
# about 200 characters of English (external apps write their own)
DESCRIPTION_SIZE = 50
# all apps' API indexes together: past this many estimated tokens, the remaining apps are listed by name and
# description only (a task of many large apps still opens within the context; list_apis has the rest)
INDEXES_SIZE = 1200
DOCS_RULE = (
    "Each app is listed with its APIs and their parameters (? marks an optional one). "
    "api_docs.show_api_doc shows what an API takes and returns; "
    "api_docs.list_apis lists the APIs a cut list leaves out."
)

SYSTEM = """{persona}

Each turn, reply with exactly one API call, written like this:
{example_call}
The result comes back in the next message. Then make the next call.

Rules:
{rules}
- When the task is done, call supervisor.complete_task. If the task asks a question, pass the answer:
  {answer_call}

Each task says which apps you can use. The first task below is a worked example; the real task comes after it."""

TASK = """Apps you can use:
{apps}

{preamble}Task: {instruction}"""

# a text world (`World.commands`): no apps and no calls; its conventions list the commands it takes
COMMAND_SYSTEM = """{persona}

Each turn, reply with exactly one command on one line, like this:
{example_command}
What happens comes back in the next message. Then write the next command.

Rules:
{rules}

The first task below is a worked example; the real task comes after it."""

COMMAND_TASK = """{preamble}Task: {instruction}"""


def world_prompt(world: World) -> WorldPrompt:
    """The parts this episode's prompt is made of: the provider's while the task uses one of the world's
    own apps (or no attached app), else the neutral ones with the first app's own worked example."""
    if world.commands is not None:
        if world.prompt is None:
            raise ValueError(f"world {world.name!r} takes text commands but supplies no prompt (World.prompt)")
        return world.prompt(world)
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
    """The system prompt: the same for every task of a world (nothing in it names a task or its apps)."""
    if world.commands is not None:
        return COMMAND_SYSTEM.format(
            persona=parts.persona,
            example_command=action_space(world.commands).render(parts.first_call),
            rules="\n".join(f"- {rule}" for rule in parts.conventions),
        )
    return SYSTEM.format(
        persona=parts.persona,
        example_call=render_action(parts.first_call),
        rules="\n".join(f"- {rule}" for rule in (DOCS_RULE, *parts.conventions)),
        answer_call=render_action(ToolCall("supervisor", "complete_task", {"answer": "42"})),
    )


def app_lines(world: World, names: list[str], extra: Mapping[str, AppSpec] | None = None) -> str:
    """Each app on a line with its one-line description, and under it its API index while the indexes
    together stay within INDEXES_SIZE estimated tokens. `extra`: specs of apps the world does not have."""
    lines, used = [], 0
    for name in names:
        spec = world.apps.get(name) or (extra or {}).get(name)
        if spec is None:
            lines.append(f"- {name}")
            continue
        summary = one_line(spec.description, DESCRIPTION_SIZE)
        lines.append(f"- {name}: {summary}" if summary else f"- {name}")
        index = api_index(list(spec.apis.values()))
        size = text_size(index)
        if index and used + size <= INDEXES_SIZE:
            lines.append(f"  APIs: {index}")
            used += size
    return "\n".join(lines)


def example_messages(world: World, parts: WorldPrompt) -> list[dict[str, str]]:
    """The worked example as chat messages: the task (with the apps its calls use), then each call and
    what it returned."""
    example = parts.example
    if world.commands is not None:
        space = action_space(world.commands)
        messages = [{"role": "user", "content": COMMAND_TASK.format(preamble="", instruction=example.instruction)}]
        for step in example.steps:
            messages.append({"role": "assistant", "content": space.render(step.call)})
            messages.append({"role": "user", "content": space.observe(step.call, True, step.observation)})
        return messages
    apps = list(dict.fromkeys(step.call.app for step in example.steps if step.call.app not in parts.unlisted_apps))
    task = TASK.format(apps=app_lines(world, apps, parts.example_apps), preamble="", instruction=example.instruction)
    messages = [{"role": "user", "content": task}]
    for step in example.steps:
        messages.append({"role": "assistant", "content": render_action(step.call)})
        messages.append({"role": "user", "content": render_observation(step.call, True, step.observation)})
    return messages


def render_task(world: World, parts: WorldPrompt, instruction: str) -> str:
    if world.commands is not None:
        return COMMAND_TASK.format(preamble=parts.preamble, instruction=instruction)
    listed = [name for name in world.available if name not in parts.unlisted_apps]
    return TASK.format(apps=app_lines(world, listed), preamble=parts.preamble, instruction=instruction)


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

    def neutral(self, text: str) -> str:
        """`text` with every special token of the template broken up (a space after its first character):
        the instruction, an app's documents or an observation cannot open or close a turn."""
        for special in self.specials:
            text = text.replace(special, special[0] + " " + special[1:])
        return text

    def opening(self, system: str, user: str, example: list[dict[str, str]] | None = None) -> list[int]:
        """The system prompt, the worked example's turns and the user's instruction, each with its special
        tokens neutralised (they hold tenants' text: app documents, the instruction)."""
        messages = [{"role": "system", "content": system}, *(example or []), {"role": "user", "content": user}]
        messages = [{**m, "content": self.neutral(m["content"])} for m in messages]
        return list(self.tokenizer.encode(self._text(messages, True), add_special_tokens=False))

    def observation_ids(self, observation: str, stopped: bool) -> list[int]:
        """Tokens appended after a turn: close the assistant turn (unless the model did), the observation
        as a user message, and the next assistant header."""
        observation = self.neutral(observation)  # an observation must not be able to fake a turn boundary
        before = self.obs_before
        if stopped and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]
        return list(self.tokenizer.encode(before + observation + self.obs_after, add_special_tokens=False))
