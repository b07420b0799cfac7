"""The opening prompt is composed from the world: the built-in world's persona, conventions and worked
example (unchanged, token for token), a neutral prompt for worlds that supply none and for external
apps' tasks, and an external app's own worked example (agentloop_example) with its fallback."""

import copy
import hashlib
import json
import logging
import re

import pytest

from agentloop.agent.episode import Episode, Limits
from agentloop.agent.eval_runs import external_tasks
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.base import ApiError, AppSpec
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.external import ExternalApp
from agentloop.apps.remote_http import HttpLimits
from agentloop.apps.world_prompt import EXAMPLE_MAX_CHARS, NEUTRAL_INSTRUCTION, parse_worked_example
from tests.apps.loopback_app import API_KEY, EXAMPLE, serve_loopback_app
from tests.learner.lights_world import LightsWorld

# sha256 of str(prompt_token_ids) with SmolLM2's tokenizer, computed from the code before prompts were
# composed from the world: the built-in world's episodes must keep exactly these tokens
BUILTIN_PROMPTS = {
    "wallet_send_money-1": (851, "c85f907e48d94c6047426d7b31890f65cb3c6d27875302691620d7f44a12df01"),
    "notes_delete_titled-2": (839, "de5190c657492fb4083b828ac0ddcac8e68b6692afd70d1692192a7d7db111b6"),
    "calendar_reschedule-1": (869, "08a9d143d53fd216bacd7d31cd9a5699d59ece35a17a6e6f117db15c71bde637"),
    "calendar_cancel_event-1": (850, "999d5eb108e261f31ae2d2aa9123369280b727e324559908c4cc07701de1a70e"),
    "files_read_tax_figure-1": (865, "28f1c8c04a71a37f4f4dbef7f2e4fc52c99edaafd4d218322b337e1bf9024cd7"),
}
# a built-in world with an instruction, two built-in apps and an external app attached beside them
ADHOC_PROMPT = (864, "44202ac6ab32d894d3194c594737ba969397bcfa54249b22e11930bbe8591df1")

BUILTIN_WORDS = ("notes", "login", "access_token", "password", "page_index", "email", "The person you work for")


@pytest.fixture(scope="module")
def fmt(tokenizer):
    return ChatFormat(tokenizer)


@pytest.fixture(scope="module")
def loopback():
    with serve_loopback_app() as served:
        yield served


def digest(ids: list[int]) -> tuple[int, str]:
    return len(ids), hashlib.sha256(str(ids).encode()).hexdigest()


def prompt_text(tokenizer, world, instruction, fmt) -> str:
    return tokenizer.decode(Episode(world, fmt, instruction, Limits()).prompt_token_ids)


def without_complete_task(text: str) -> str:
    """The text minus the one thing every prompt says about the supervisor app: how an episode ends."""
    return re.sub(r'supervisor\.complete_task|"app": "supervisor", "api": "complete_task"', "", text)


def todolite(base_url, doc, **limits) -> ExternalApp:
    return ExternalApp.build(
        "todolite",
        "A to-do list.\n" + "It keeps one list per user, with the items in the order they were added. " * 5,
        doc,
        base_url,
        allow_private=True,
        auth_header=("X-Api-Key", API_KEY),
        limits=HttpLimits(**limits) if limits else None,
    )


def external_world(app: ExternalApp):
    """An episode's world for the app's task "add-apple", built as `agentloop eval --app` builds it."""
    (task,) = [t for t in external_tasks(app, lambda: BUILTIN.new_world(0, []), None) if t.task_ref == "add-apple"]
    world, _ = task.start()
    return world, task.instruction


@pytest.mark.parametrize("task_ref", sorted(BUILTIN_PROMPTS))
def test_builtin_prompts_are_unchanged_token_for_token(fmt, task_ref):
    task = BUILTIN.task(task_ref)
    ep = Episode(BUILTIN.task_world(task_ref), fmt, task.instruction, Limits())
    assert digest(ep.prompt_token_ids) == BUILTIN_PROMPTS[task_ref]


def test_builtin_conventions_stay_when_an_external_app_sits_beside_builtin_apps(fmt):
    world = BUILTIN.new_world(7, ["notes", "wallet"])
    world.attach(AppSpec(name="crm", description="Our customer records.", login=False))
    assert digest(Episode(world, fmt, "Send Ann $5 and note it.", Limits()).prompt_token_ids) == ADHOC_PROMPT


def test_an_external_apps_task_gets_a_neutral_prompt(loopback, fmt, tokenizer):
    base_url, doc, _ = loopback
    bare = copy.deepcopy(doc)
    del bare["paths"]["/agentloop/example"]  # no worked example of its own: the neutral one
    world, instruction = external_world(todolite(base_url, bare))
    text = prompt_text(tokenizer, world, instruction, fmt)
    system, _, rest = text.partition("<|im_end|>")
    assert "- todolite: A to-do list.\n" in system and "It keeps one list" not in system  # one line per app
    assert "- api_docs: " in system and "api_docs.show_api_doc" in system
    assert "You are an assistant that completes tasks by calling the APIs of apps." in system
    assert f"Task: {NEUTRAL_INSTRUCTION}" in rest and "weather.show_forecast returned" in rest
    assert rest.rstrip().endswith(f"Task: {instruction}<|im_end|>\n<|im_start|>assistant")
    assert "supervisor.complete_task" in system
    neutral = without_complete_task(text)
    assert "supervisor" not in neutral
    for word in BUILTIN_WORDS:
        assert word not in neutral, word
    profile = BUILTIN.new_world(0, []).state["supervisor"]["profile"]["1"]
    assert profile["last_name"] not in text and "It is now" not in text  # not the built-in person, nor its clock
    assert "agentloop_" not in text


def test_a_task_of_registered_apps_only_gets_the_neutral_prompt_too(fmt, tokenizer):
    world = BUILTIN.new_world(3, [])
    world.attach(AppSpec(name="crm", description="Our customer records.", login=False))
    text = without_complete_task(prompt_text(tokenizer, world, "Find Ann's record.", fmt))
    assert "- crm: Our customer records." in text and "supervisor" not in text and "notes" not in text


def test_a_plugin_world_that_supplies_nothing_gets_the_neutral_prompt(fmt, tokenizer):
    provider = LightsWorld()
    task = provider.task("lights-0")
    text = prompt_text(tokenizer, provider.task_world(task.id), task.instruction, fmt)
    assert "- lights: The lights of the house." in text and "- api_docs: " in text
    assert "weather.show_forecast returned" in text  # the neutral worked example
    neutral = without_complete_task(text)
    assert "supervisor" not in neutral and "Ada" not in neutral
    for word in BUILTIN_WORDS:
        assert word not in neutral, word


def test_an_external_app_serves_its_own_worked_example_once_per_episode(loopback, fmt, tokenizer):
    base_url, doc, calls = loopback
    world, instruction = external_world(todolite(base_url, doc))
    before = len(calls.examples)
    ep = Episode(world, fmt, instruction, Limits())
    assert len(calls.examples) == before + 1 and calls.examples[-1] is not None  # in the episode, after its reset
    text = tokenizer.decode(ep.prompt_token_ids)
    assert f"Task: {EXAMPLE['instruction']}" in text
    assert '<tool_call>{"app": "todolite", "api": "list_items", "args": {}}</tool_call>' in text
    assert "todolite.list_items returned" in text and "weather" not in text
    # hidden from the agent like the other agentloop_* operations
    listed = json.dumps(world.call("api_docs", "list_apis", {"app_name": "todolite"}))
    assert "list_items" in listed and "agentloop_example" not in listed
    with pytest.raises(ApiError, match="no API named 'agentloop_example'"):
        world.call("todolite", "agentloop_example", {})


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/garbage", "claims to be JSON but is not"),  # the answer is broken
        ("/items", "must return"),  # it answers, but not with an example
        ("/slow", "did not answer within"),  # too late
        ("/nowhere", "404"),  # not there
    ],
)
def test_a_failing_worked_example_falls_back_to_the_neutral_one(loopback, fmt, tokenizer, caplog, path, needle):
    base_url, doc, _ = loopback
    broken = copy.deepcopy(doc)  # agentloop_example declared on an endpoint that serves no example
    broken["paths"][path] = {"get": broken["paths"].pop("/agentloop/example")["get"]}
    world, instruction = external_world(todolite(base_url, broken, read_s=0.5))
    with caplog.at_level(logging.WARNING, logger="agentloop.agent.prompt"):
        text = prompt_text(tokenizer, world, instruction, fmt)
    assert f"Task: {NEUTRAL_INSTRUCTION}" in text and EXAMPLE["instruction"] not in text
    assert any("todolite" in r.getMessage() and needle in r.getMessage() for r in caplog.records), caplog.text


def step(app="todolite", api="list_items", **extra):
    return {"app": app, "api": api, "args": {}, "observation": [], **extra}


DONE = step("supervisor", "complete_task")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ([DONE], "must return"),
        ({"instruction": "", "steps": [DONE]}, "must return"),
        ({"instruction": "x", "steps": []}, "1 to 12 steps"),
        ({"instruction": "x", "steps": [step()] * 12 + [DONE]}, "1 to 12 steps"),
        ({"instruction": "x", "steps": [step(), {"app": "todolite"}, DONE]}, "step 1 needs"),
        ({"instruction": "x", "steps": [step(args=[1]), DONE]}, "step 0 needs"),
        ({"instruction": "x", "steps": [step()]}, "last step must be supervisor.complete_task"),
        ({"instruction": "x", "steps": [step(observation="y" * EXAMPLE_MAX_CHARS), DONE]}, "at most"),
    ],
)
def test_worked_example_answers_are_checked(value, needle):
    with pytest.raises(ValueError, match=needle):
        parse_worked_example(value, "app 'todolite'")


def test_a_worked_example_answer_is_read_step_by_step():
    example = parse_worked_example(EXAMPLE, "app 'todolite'")
    assert example.instruction == EXAMPLE["instruction"]
    assert [(s.call.app, s.call.api, s.call.args, s.observation) for s in example.steps] == [
        (s["app"], s["api"], s["args"], s["observation"]) for s in EXAMPLE["steps"]
    ]
