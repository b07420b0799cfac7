"""Tool-call actions: rendered and parsed here and nowhere else.

The agent writes one call per turn:
    <tool_call>{"app": "notes", "api": "login", "args": {"username": "...", "password": "..."}}</tool_call>
A bare JSON object with "app" and "api" is accepted too (small models often drop the tags).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentloop.apps.tasks import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def render_action(call: ToolCall) -> str:
    return f"{OPEN}{json.dumps(call.to_dict(), ensure_ascii=False)}{CLOSE}"


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
