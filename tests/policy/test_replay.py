"""The replay backend: every episode makes the configured calls in order, then completes; chosen by settings;
a malformed `replay_actions` is refused when settings load."""

import pytest

from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.policy import get_policy, set_policy
from agentloop.policy.replay import ReplayPolicy, parse_actions
from agentloop.settings import get_settings

ACTIONS = '[{"app": "supervisor", "api": "show_profile"}, {"app": "supervisor", "api": "show_addresses", "args": {}}]'


def test_each_episode_replays_the_calls_then_completes(tokenizer):
    policy = ReplayPolicy(tokenizer, parse_actions(ACTIONS))
    fmt = ChatFormat(tokenizer)
    refs = ["wallet_send_money-1", "notes_count_tag-1"]
    episodes = [
        Episode(BUILTIN.task_world(r), fmt, BUILTIN.task(r).instruction, Limits(max_turns=8), key=r) for r in refs
    ]
    run_episodes(policy, episodes)
    for ep in episodes:
        assert [(t.action["app"], t.action["api"]) for t in ep.turns] == [
            ("supervisor", "show_profile"),
            ("supervisor", "show_addresses"),
            ("supervisor", "complete_task"),
        ]
        assert ep.finish_reason == "completed" and all(t.error_kind is None for t in ep.turns)
        assert ep.turns[0].output_token_ids[-1] == tokenizer.eos_token_id and ep.turns[0].output_logprobs is None
        assert '"email"' in ep.turns[0].observation


def test_the_backend_is_chosen_by_settings(configure_env, tiny_model_dir):
    configure_env(POLICY_BACKEND="replay", MODEL=str(tiny_model_dir), REPLAY_ACTIONS=ACTIONS)
    set_policy(None)
    try:
        policy = get_policy()
        assert isinstance(policy, ReplayPolicy) and policy.name.startswith("replay:")
        policy.load_adapter("t1", "/nowhere")
        assert policy.loaded_adapters() == {"t1"}
    finally:
        set_policy(None)


@pytest.mark.parametrize(
    "value, why",
    [
        ("{", "not JSON"),
        ('{"app": "a"}', "must be a JSON list"),
        ('[{"app": "a"}]', "needs an app and an api"),
        ('[{"app": "a", "api": "b", "args": [1]}]', "args must be an object"),
    ],
)
def test_malformed_actions_are_refused_when_settings_load(configure_env, value, why):
    with pytest.raises(Exception, match=why):
        configure_env(REPLAY_ACTIONS=value)
        get_settings()
