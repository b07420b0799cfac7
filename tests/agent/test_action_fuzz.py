"""Fuzzing the action parsers with what a model may write: any text, text assembled from the pieces of a
call (tags, braces, keys, quotes), and JSON nested deeper than the decoder goes. A parse never raises: it is
calls, or a plain error the agent reads as its observation. A rendered call parses back to itself."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop.agent.actions import CLOSE, OPEN, TextCommands, parse_action, render_action
from agentloop.apps.tasks import ToolCall

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), database=None)

PIECES = [OPEN, CLOSE, "{", "}", "[", "]", '"', ":", ",", '"app"', '"api"', '"args"', '"arguments"', "notes",
          '"notes"', '"list_notes"', "null", "true", "1e999", "\\", "\\u", "\n", " ", "\x00", "\ud800", "<tool_call",
          "</tool_call", "```json", "```"]  # fmt: skip
pieced = st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=40).map("".join)
names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12).filter(
    lambda s: s.strip() == s and s != ""
)
json_args = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=10,
    ),
    max_size=4,
)


def well_formed(parsed: Any) -> None:
    assert parsed.actions or parsed.error, "neither calls nor a reason"
    assert parsed.error is None or (isinstance(parsed.error, str) and parsed.error.strip())
    for call in parsed.actions:
        assert isinstance(call, ToolCall) and call.app and call.api and isinstance(call.args, dict)


@FUZZ
@given(st.text(max_size=300) | pieced)
def test_any_reply_parses_to_calls_or_a_reason(text: str) -> None:
    well_formed(parse_action(text))
    well_formed(TextCommands("world").parse(text))


@FUZZ
@given(names, names, json_args, st.text(max_size=20), st.text(max_size=20))
def test_a_rendered_call_parses_back_to_itself(
    app: str, api: str, args: dict[str, Any], before: str, after: str
) -> None:
    call = ToolCall(app, api, args)
    text = before.replace(OPEN, "").replace("{", "") + render_action(call) + after.replace(OPEN, "")
    parsed = parse_action(text)
    assert parsed.error is None and parsed.actions == [call]


@given(st.integers(900, 50_000), st.sampled_from(["[", '{"a": ']))
@settings(max_examples=20, deadline=None, database=None)
def test_json_nested_past_the_decoder_is_an_error_not_a_crash(depth: int, opener: str) -> None:
    for text in (
        f'{OPEN}{{"app": "a", "api": "b", "args": {{"x": {opener * depth}}}}}{CLOSE}',
        '{"api": ' + opener * depth,
    ):
        parsed = parse_action(text)
        assert not parsed.actions and parsed.error
