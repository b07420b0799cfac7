"""Actions: rendered and parsed here and nowhere else, one action space per kind of world.

Tool calls (apps with APIs: the built-in world, external apps). The agent writes one call per turn:
    <tool_call>{"app": "notes", "api": "login", "args": {"username": "...", "password": "..."}}</tool_call>
A bare JSON object with "app" and "api" is accepted too (small models often drop the tags).

Text commands (a text world such as ScienceWorld). The agent writes one command per turn, e.g.
    open door to kitchen
Inside the episode, the store and training a command is a call like any other: the world's command app,
API `act`, argument `command` (its text, normalised), so nothing downstream knows which space ran.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.apps.tasks import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def render_action(call: ToolCall) -> str:
    return f"{OPEN}{json.dumps(call.to_dict(), ensure_ascii=False)}{CLOSE}"


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
class ParsedTurn:
    actions: list[ToolCall] = field(default_factory=list)
    error: str | None = None  # why nothing could be executed, in words the agent can act on


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object embedded in `text`, in order."""
    decoder = json.JSONDecoder()
    found, pos = [], 0
    while (start := text.find("{", pos)) != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        except RecursionError:  # nested deeper than the decoder goes: so is every object that starts inside it
            break
        found.append(obj)
        pos = end
    return found


def _to_call(obj: Any) -> ToolCall | str:
    if not isinstance(obj, dict):
        return "A tool call must be a JSON object."
    missing = [k for k in ("app", "api") if not isinstance(obj.get(k), str) or not obj.get(k)]
    if missing:
        return f"The tool call is missing {' and '.join(repr(m) for m in missing)} (strings)."
    args = obj.get("args", obj.get("arguments", {}))
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return '"args" must be a JSON object of argument names to values.'
    extra = sorted(set(obj) - {"app", "api", "args", "arguments"})
    if extra:
        return f'Unexpected key(s) {", ".join(extra)} in the tool call; put arguments inside "args".'
    return ToolCall(obj["app"].strip(), obj["api"].strip(), args)


def parse_action(text: str) -> ParsedTurn:
    tagged = _TAGGED.findall(text)
    if tagged:
        candidates: list[Any] = []
        for block in tagged:
            objs = _json_objects(block)
            if not objs:
                return ParsedTurn(error=f"The text inside {OPEN} is not valid JSON.")
            candidates.extend(objs)
    else:
        candidates = [o for o in _json_objects(text) if isinstance(o, dict) and "api" in o]
        if not candidates:
            return ParsedTurn(
                error=f"Your reply has no tool call. Reply with exactly one call like "
                f'{OPEN}{{"app": "api_docs", "api": "list_apps", "args": {{}}}}{CLOSE}'
            )
    calls: list[ToolCall] = []
    for obj in candidates:
        call = _to_call(obj)
        if isinstance(call, str):
            return ParsedTurn(actions=calls, error=call)
        calls.append(call)
    return ParsedTurn(actions=calls)


class ActionSpace(Protocol):
    """How an agent's text becomes actions and an action becomes text, for one kind of world."""

    def render(self, call: ToolCall) -> str: ...

    def parse(self, text: str) -> ParsedTurn: ...

    def observe(self, call: ToolCall | None, ok: bool, value: Any) -> str:
        """What the agent sees after its action: the result, or a plain error (call None: nothing parsed)."""
        ...


class ToolCalls:
    def render(self, call: ToolCall) -> str:
        return render_action(call)

    def parse(self, text: str) -> ParsedTurn:
        return parse_action(text)

    def observe(self, call: ToolCall | None, ok: bool, value: Any) -> str:
        return render_observation(call, ok, value)


TOOL_CALLS = ToolCalls()
COMMAND_API = "act"  # a text world's one API: act(command)
COMMAND_MAX_CHARS = 200  # a command is a short line; a longer reply is not one
# what small models put around a command: a prompt marker, a label, quotes or backticks
_COMMAND_DECOR = re.compile(r"^(?:>\s*|(?:action|command)\s*:\s*)", re.IGNORECASE)


def normalise_command(text: str) -> str:
    """A command as the world compares it: lower case, single spaces, no surrounding quotes or marks."""
    line = _COMMAND_DECOR.sub("", text.strip()).strip().strip("`\"'").strip()
    return " ".join(line.lower().split()).rstrip(".")


@dataclass(frozen=True)
class TextCommands:
    """One command per turn, run as `<app>.act(command=...)`: the first non-empty line of the reply."""

    app: str

    def render(self, call: ToolCall) -> str:
        return str(call.args.get("command", ""))

    def parse(self, text: str) -> ParsedTurn:
        lines = [line for line in text.splitlines() if line.strip()]
        command = normalise_command(lines[0]) if lines else ""
        if not command:
            return ParsedTurn(error="Your reply has no command. Reply with one command on one line, e.g. look around")
        if len(command) > COMMAND_MAX_CHARS:
            return ParsedTurn(
                error=f"A command is one short line (at most {COMMAND_MAX_CHARS} characters); yours is "
                f"{len(command)}. Reply with one command, e.g. look around"
            )
        return ParsedTurn(actions=[ToolCall(self.app, COMMAND_API, {"command": command})])

    def observe(self, call: ToolCall | None, ok: bool, value: Any) -> str:
        """The world's own text: a text world answers a command it cannot run in words, as an observation."""
        return str(value) if ok else f"Error: {value}"


def action_space(commands_app: str | None) -> ActionSpace:
    """The action space of a world whose text commands go to `commands_app` (None: a world of tool calls)."""
    return TOOL_CALLS if commands_app is None else TextCommands(commands_app)
