from agentloop.agent.actions import parse_action, render_action
from agentloop.apps.tasks import ToolCall


def test_render_then_parse_roundtrip():
    call = ToolCall("notes", "search_notes", {"access_token": "t", "query": "wifi ☕"})
    parsed = parse_action("Let me search.\n" + render_action(call))
    assert parsed.error is None and parsed.actions == [call]


def test_bare_json_and_arguments_alias_are_accepted():
    parsed = parse_action('{"app": "wallet", "api": "show_balance", "arguments": {"access_token": "x"}}')
    assert parsed.actions == [ToolCall("wallet", "show_balance", {"access_token": "x"})]


def test_several_calls_are_all_returned_in_order():
    text = render_action(ToolCall("a", "b", {})) + "\n" + render_action(ToolCall("c", "d", {"x": 1}))
    assert [c.app for c in parse_action(text).actions] == ["a", "c"]


def test_missing_tool_call_says_how_to_write_one():
    parsed = parse_action("I will now check the balance.")
    assert parsed.actions == [] and "<tool_call>" in (parsed.error or "")


def test_broken_json_inside_tags():
    parsed = parse_action('<tool_call>{"app": "notes", "api": </tool_call>')
    assert parsed.actions == [] and "not valid JSON" in (parsed.error or "")


def test_unclosed_tag_is_still_parsed():
    parsed = parse_action('<tool_call>{"app": "notes", "api": "login", "args": {}}')
    assert parsed.actions == [ToolCall("notes", "login", {})]


def test_wrong_shapes_get_specific_errors():
    assert "missing 'api'" in (parse_action('<tool_call>{"app": "notes"}</tool_call>').error or "")
    assert "JSON object" in (parse_action('<tool_call>{"app": "n", "api": "x", "args": [1]}</tool_call>').error or "")
    err = parse_action('<tool_call>{"app": "n", "api": "x", "query": "q"}</tool_call>').error or ""
    assert "query" in err and "args" in err
