"""Behaviour metrics on hand-made turns with known answers."""

from types import SimpleNamespace

from agentloop.agent.behaviour import behaviour


def turn(app=None, api=None, error=None, text="", n_actions=1):
    action = {"app": app, "api": api, "args": {}} if app else None
    return SimpleNamespace(action=action, error_kind=error, output_text=text, n_actions=n_actions)


def test_each_metric():
    ep1 = [
        turn("api_docs", "show_api_descriptions", text="Let me read the docs."),
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
