"""Prompt rendering: the system prompt, the first user message, and the token segments the episode
appends after each turn. Token-in/token-out: the context is a concatenation of exact token ids;
nothing already in it is ever re-tokenised."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentloop.agent.actions import render_action
from agentloop.apps.tasks import ToolCall
from agentloop.policy.base import Tokenizer

SYSTEM = """You are an assistant that completes tasks for {name} by calling the APIs of their apps.

Apps you can use:
{apps}

Each turn, reply with exactly one API call, written like this:
{example_call}
The result comes back in the next message. Then make the next call.

Rules:
- Use api_docs.list_apis and api_docs.show_api_doc to learn an app's APIs and their parameters.
- Apps with accounts need an access_token: get the password from supervisor.show_account_passwords,
  then call the app's login API with your email as username.
- Lists come in pages (page_index, page_limit): keep asking for the next page until it is empty.
- Never guess ids, emails or amounts: look them up.
- When the task is done, call supervisor.complete_task. If the task asks a question, pass the answer:
  {answer_call}

The first task below is a worked example; the real task comes after it."""


def render_system(supervisor: dict[str, Any], apps: list[tuple[str, str]]) -> str:
    app_lines = "\n".join(f"- {name}: {desc}" for name, desc in apps)
    return SYSTEM.format(
        name=f"{supervisor['first_name']} {supervisor['last_name']}",
        apps=app_lines,
        example_call=render_action(ToolCall("api_docs", "list_apis", {"app_name": "supervisor"})),
        answer_call=render_action(ToolCall("supervisor", "complete_task", {"answer": "42"})),
    )


# A worked example shown before every task (one-shot): a small model copies its form.
EXAMPLE: list[tuple[ToolCall, Any]] = [
    (
        ToolCall("supervisor", "show_account_passwords", {}),
        [{"app": "notes", "username": "me@example.com", "password": "x7Gk2pQ9"}],
    ),
    (
        ToolCall("notes", "login", {"username": "me@example.com", "password": "x7Gk2pQ9"}),
        {"access_token": "3f9a1c", "token_type": "Bearer"},
    ),
    (
        ToolCall("notes", "list_notes", {"access_token": "3f9a1c", "tag": "work", "page_limit": 20}),
        [{"note_id": 4, "title": "Q3 plan"}, {"note_id": 9, "title": "1:1 notes"}],
    ),
    (ToolCall("supervisor", "complete_task", {"answer": 2}), "Task marked as complete."),
]


def example_messages() -> list[dict[str, str]]:
    messages = [{"role": "user", "content": "Task: How many of my notes have the tag 'work'?"}]
    for call, result in EXAMPLE:
        messages.append({"role": "assistant", "content": render_action(call)})
        messages.append({"role": "user", "content": render_observation(call, True, result)})
    return messages


def render_task(supervisor: dict[str, Any], instruction: str, now: datetime) -> str:
    return (
        f"I am {supervisor['first_name']} {supervisor['last_name']}. My email is {supervisor['email']} and "
        f"my phone number is {supervisor['phone']}. It is now {now:%A, %B} {now.day}, {now:%Y, %H:%M} UTC.\n"
        f"Task: {instruction}"
    )


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

    def truncate(self, observation: str, max_tokens: int) -> str:
        ids = self.tokenizer.encode(observation, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return observation
        kept = self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True)
        return (
            f"{kept}\n[Output truncated: showed {max_tokens} of {len(ids)} tokens. "
            "Ask for less, e.g. a smaller page_limit or a narrower query.]"
        )
