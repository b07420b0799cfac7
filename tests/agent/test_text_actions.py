"""Text commands, the second action space: parsing and rendering, and a text world's episode from the prompt to
the expert steps the learner inspects, on a toy world (a room with a lamp) that takes commands."""

from datetime import UTC, datetime
from typing import Any

import pytest

from agentloop.agent.actions import COMMAND_API, TOOL_CALLS, TextCommands, action_space, normalise_command
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.evaluate import EvalTask
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.base import AppSpec, CallContext, string
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World
from agentloop.apps.world_prompt import ExampleStep, WorkedExample, WorldPrompt
from agentloop.learner import experts
from agentloop.policy.scripted import ScriptedPolicy

ROOM = TextCommands("room")


def command(text: str) -> ToolCall:
    return ToolCall("room", COMMAND_API, {"command": text})


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("open door to kitchen", "open door to kitchen"),
        ("  Open   Door to Kitchen.\n", "open door to kitchen"),
        ("> look around", "look around"),
        ("Action: `pick up lamp`", "pick up lamp"),
        ('"focus on water"\nbecause the task says so', "focus on water"),
        ("\n\nwait\n", "wait"),
    ],
)
def test_the_first_line_is_the_command_normalised(reply: str, expected: str) -> None:
    parsed = ROOM.parse(reply)
    assert parsed.error is None and parsed.actions == [command(expected)]
    assert normalise_command(reply.strip().splitlines()[0]) == expected


def test_no_command_and_an_overlong_line_say_what_to_write() -> None:
    for reply in ("", "   \n \n", "``", "> "):
        parsed = ROOM.parse(reply)
        assert parsed.actions == [] and "one command" in (parsed.error or "")
    parsed = ROOM.parse("go " + "north " * 60)
    assert parsed.actions == [] and "at most 200" in (parsed.error or "")


def test_render_parse_roundtrip_and_observations() -> None:
    call = command("move lamp to table")
    assert ROOM.render(call) == "move lamp to table" and ROOM.parse(ROOM.render(call)).actions == [call]
    assert ROOM.observe(call, True, "You move the lamp.") == "You move the lamp."
    assert ROOM.observe(None, False, "Your reply has no command.") == "Error: Your reply has no command."
    assert action_space(None) is TOOL_CALLS and action_space("room") == ROOM


# --- a toy text world -----------------------------------------------------------------------------------


def room_app() -> AppSpec:
    app = AppSpec(name="room", description="A room with a lamp.", login=False)

    @app.api("Run one command.", params={"command": string("The command.")}, required=["command"], returns="text")
    def act(ctx: CallContext, command: str) -> str:
        state = ctx.world.state["room"]["lamp"]["1"]
        if command == "look around":
            return f"A room. A lamp (turned {'on' if state['on'] else 'off'})."
        if command == "activate lamp":
            state["on"] = True
            ctx.world.completed = True
            return "The lamp is now on."
        return "No known action matches that input."

    return app


def room_prompt(world: World) -> WorldPrompt:
    example = WorkedExample(
        "Turn on the fan.",
        (
            ExampleStep(command("look around"), "A room. A fan (turned off)."),
            ExampleStep(command("activate fan"), "The fan is now on."),
        ),
    )
    return WorldPrompt(
        persona="You are an agent in a text world.",
        conventions=("Commands: look around, activate OBJ.",),
        first_call=command("look around"),
        example=example,
        preamble="This room has a lamp.\n\n",
    )


def room_world() -> World:
    return World(
        name="room",
        seed=0,
        now=datetime(2025, 1, 1, tzinfo=UTC),
        apps={"room": room_app()},
        state={"room": {"lamp": {"1": {"on": False}}}},
        available=["room"],
        prompt=room_prompt,
        commands="room",
    )


def room_task() -> EvalTask:
    def start() -> tuple[World, Any]:
        return room_world(), None

    return EvalTask(
        "lamp-0",
        "lamp",
        "train",
        1,
        "Turn on the lamp.",
        start,
        expert=lambda _world: [command("look around"), command("activate lamp")],
    )


def test_a_text_world_episode_prompts_runs_commands_and_ends(tokenizer: Any) -> None:
    fmt = ChatFormat(tokenizer)
    ep = Episode(room_world(), fmt, "Turn on the lamp.", Limits(max_turns=5, temperature=0.0), key="e")
    opening = tokenizer.decode(ep.prompt_token_ids)
    assert "one command on one line" in opening and "<tool_call>" not in opening
    assert "Commands: look around, activate OBJ." in opening and "The fan is now on." in opening
    assert opening.rindex("This room has a lamp.") > opening.rindex("Task: Turn on the fan.")
    assert "Apps you can use" not in opening
    policy = ScriptedPolicy(tokenizer)
    policy.plan(ep.key or "", ["Look around", "dance", "activate lamp"])
    run_episodes(policy, [ep])
    assert [t.action for t in ep.turns] == [command(c).to_dict() for c in ("look around", "dance", "activate lamp")]
    assert [t.observation for t in ep.turns] == [
        "A room. A lamp (turned off).",
        "No known action matches that input.",
        "The lamp is now on.",
    ]
    assert ep.finish_reason == "completed" and all(t.error_kind is None for t in ep.turns)


def test_a_reply_without_a_command_is_an_error_observation(tokenizer: Any) -> None:
    ep = Episode(room_world(), ChatFormat(tokenizer), "Turn on the lamp.", Limits(max_turns=1), key="e")
    policy = ScriptedPolicy(tokenizer)
    policy.plan("e", ["\n"])
    run_episodes(policy, [ep])
    assert ep.turns[0].error_kind == "parse_error" and ep.turns[0].observation.startswith("Error: ")


def test_expert_steps_of_a_text_world_carry_their_commands(tokenizer: Any) -> None:
    (rollout,) = experts.expert_rollouts(tokenizer, [room_task()], Limits(max_turns=5))
    steps = experts.expert_steps(rollout)
    assert [s.call for s in steps] == [command("look around"), command("activate lamp")]
    assert all(s.commands == "room" for s in steps)
    assert tokenizer.decode(steps[1].action_tokens).startswith("activate lamp")
    # an agent's sample at that prefix parses in the step's own space
    assert action_space(steps[1].commands).parse("activate lamp").actions == [steps[1].call]


def test_a_text_world_without_a_prompt_is_refused(tokenizer: Any) -> None:
    world = room_world()
    world.prompt = None
    with pytest.raises(ValueError, match="supplies no prompt"):
        Episode(world, ChatFormat(tokenizer), "Turn on the lamp.", Limits())
