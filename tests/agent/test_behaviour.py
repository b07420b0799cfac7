"""Behaviour metrics on hand-made turns with known answers, and on a real episode's turns."""

from types import SimpleNamespace

from agentloop.agent.actions import render_action
from agentloop.agent.behaviour import behaviour
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.tasks import ToolCall
from agentloop.policy.scripted import ScriptedPolicy


def turn(app=None, api=None, error=None, text="", n_actions=1):
    action = {"app": app, "api": api, "args": {}} if app else None
    return SimpleNamespace(action=action, error_kind=error, output_text=text, n_actions=n_actions)


def test_each_metric():
    ep1 = [
        turn("api_docs", "list_apis", text="Let me read the docs."),
        turn("wallet", "login", error="unauthorized", text="I'll assume the password is 1234."),
        turn("supervisor", "complete_task"),  # gave up right after the failure
    ]
    ep2 = [
        turn("wallet", "show_balance", error="not_found"),
        turn("api_docs", "show_api_doc"),  # tried something else: not a give-up
        turn(None, error="parse_error", text="no call here"),  # not a failed *call*
        turn("wallet", "show_balance", text="two calls", n_actions=2),
        turn("wallet", "pay", error="invalid", text="using a dummy card"),  # last turn: gave up
    ]
    m = behaviour([ep1, ep2])
    assert m["api_docs_calls_per_episode"] == 1.0
    assert m["failed_calls_per_episode"] == 1.5
    assert m["give_up_after_failure_rate"] == round(2 / 3, 3)
    assert m["multi_action_turn_rate"] == round(1 / 8, 3)
    assert m["confabulation_turn_rate"] == round(2 / 8, 3)


def test_stored_steps_count_actions_from_their_text():
    step = SimpleNamespace(
        action={"app": "notes", "api": "list"},
        error_kind=None,
        output_text='<tool_call>{"app": "notes", "api": "list", "args": {}}</tool_call>'
        '<tool_call>{"app": "notes", "api": "list", "args": {}}</tool_call>',
    )
    assert behaviour([[step]])["multi_action_turn_rate"] == 1.0


def test_no_episodes():
    assert behaviour([]) == {
        "api_docs_calls_per_episode": 0.0,
        "failed_calls_per_episode": 0.0,
        "give_up_after_failure_rate": 0.0,
        "multi_action_turn_rate": 0.0,
        "confabulation_turn_rate": 0.0,
    }


def test_doc_lookups_count_only_calls_that_read_docs(tokenizer):
    """A call to an api_docs API, an app or an API that does not exist reads no docs, so is no lookup."""
    world = BUILTIN.new_world(0, ["notes"])
    ep = Episode(world, ChatFormat(tokenizer), "Read the docs.", Limits(max_turns=10), key="k")
    calls = [
        ToolCall("api_docs", "list_apis", {"app_name": "notes"}),
        ToolCall("api_docs", "show_api_doc", {"app_name": "notes", "api_name": "search_notes"}),
        ToolCall("api_docs", "show_api_descriptions", {"app_name": "notes"}),  # no such api_docs API
        ToolCall("api_docs", "show_api_doc", {"app_name": "notes", "api_name": "fly"}),  # no such API
        ToolCall("api_docs", "list_apis", {"app_name": "bank"}),  # no such app
        ToolCall("api_docs", "list_apis", {"page_limit": 5}),  # no app named
        ToolCall("supervisor", "complete_task", {}),
    ]
    policy = ScriptedPolicy(tokenizer)
    policy.plan("k", [render_action(c) for c in calls])
    run_episodes(policy, [ep])
    kinds = [t.error_kind for t in ep.turns]
    assert kinds == [None, None, "unknown_api", "unknown_api", "unknown_app", "bad_arguments", None]
    metrics = behaviour([ep.turns])
    assert metrics["api_docs_calls_per_episode"] == 2.0
    assert metrics["failed_calls_per_episode"] == 4.0
