"""The opening prompt is composed from the world: the built-in world's persona, conventions and worked
example (pinned token for token), a neutral prompt for worlds that supply none and for external apps'
tasks, and an external app's own worked example (agentloop_example) with its fallback. Every task of a
world opens with the same tokens; the task's own message lists its apps with their API indexes."""

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
from tests.apps.loopback_app import API_KEY, EXAMPLE, LOOPBACK_NETWORKS, serve_loopback_app
from tests.learner.lights_world import LightsWorld

# sha256 of str(prompt_token_ids) with SmolLM2's tokenizer, taken when the apps moved from the system
# prompt into the task's message: a change to the built-in world's prompt shows up here, and must be meant
BUILTIN_PROMPTS = {
    "wallet_send_money-1": (1230, "45c0decd3dfd973681639d4de374f1c928a8a18a1609161fa554c8af51d76f9e"),
    "notes_delete_titled-2": (1206, "74d36c7bb83cf077e464a7fba546bd1a92b07ef66f7822ff257a834b8b4a76c7"),
    "calendar_reschedule-1": (1304, "ef5be38d24f1faa2fceff82b0e4da1b5025471f172b5db527001fba813f0cf6b"),
    "calendar_cancel_event-1": (1286, "aff687f8e99c558e5fefbaece283cb478a402f406696578a5e04709b98f8cf4b"),
    "files_read_tax_figure-1": (1238, "16c5e765cab5a8e2efd6f62100189fffec54a4cd771874bb14f25cb8ac236c32"),
}
# a built-in world with an instruction, two built-in apps and an external app attached beside them
ADHOC_PROMPT = (1328, "0c3543ede6f80b39b0b1a63e4ee881b405f8f15d097e653c71e5b1ff13760ffe")

# (page_index is not among them: api_docs.list_apis takes it in every world, and the API index shows it)
BUILTIN_WORDS = ("notes", "login", "access_token", "password", "email", "The person you work for")


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
        allowed_networks=LOOPBACK_NETWORKS,
        auth_header=("X-Api-Key", API_KEY),
        limits=HttpLimits(**limits) if limits else None,
    )


def external_world(app: ExternalApp):
    """An episode's world for the app's task "add-apple", built as `agentloop eval --app` builds it."""
    (task,) = [t for t in external_tasks(app, lambda: BUILTIN.new_world(0, []), None) if t.task_ref == "add-apple"]
    world, _ = task.start()
    return world, task.instruction


@pytest.mark.parametrize("task_ref", sorted(BUILTIN_PROMPTS))
def test_builtin_prompts_are_pinned_token_for_token(fmt, task_ref):
    task = BUILTIN.task(task_ref)
    ep = Episode(BUILTIN.task_world(task_ref), fmt, task.instruction, Limits())
    assert digest(ep.prompt_token_ids) == BUILTIN_PROMPTS[task_ref]


def last_user_message(text: str) -> str:
    return text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]


def test_every_builtin_task_opens_with_the_same_tokens_up_to_its_own_message(fmt, tokenizer):
    """Tasks of other people, apps and days share the system prompt and the worked example, token for
    token, so the learner and a server run that opening once; what differs starts in the task's message."""
    refs = ["wallet_send_money-1", "notes_delete_titled-2", "calendar_reschedule-1", "files_read_tax_figure-1"]
    prompts = [
        Episode(BUILTIN.task_world(r), fmt, BUILTIN.task(r).instruction, Limits()).prompt_token_ids for r in refs
    ]
    common = 0
    while all(p[common] == prompts[0][common] for p in prompts):
        common += 1
    opening = tokenizer.decode(prompts[0][:common])
    example_end = "Task marked as complete.<|im_end|>\n<|im_start|>user\nApps you can use:\n"
    assert example_end in opening and "Task: " not in opening.split(example_end)[1]  # into the apps list only
    assert common > 800  # the system prompt and the worked example, most of each prompt
    for ref, ids in zip(refs, prompts, strict=True):
        task = BUILTIN.task(ref)
        message = last_user_message(tokenizer.decode(ids))
        world = BUILTIN.task_world(ref)
        me = world.state["supervisor"]["profile"]["1"]
        assert f"I am {me['first_name']} {me['last_name']}." in message and message.endswith(
            f"Task: {task.instruction}"
        )
        for app in world.available:
            assert f"\n- {app}: " in f"\n{message}", (ref, app)
        assert me["last_name"] not in tokenizer.decode(prompts[0][:common])


def test_the_task_message_indexes_each_apps_apis_with_their_parameters(fmt, tokenizer):
    world = BUILTIN.task_world("wallet_send_money-1")
    message = last_user_message(prompt_text(tokenizer, world, "Send Ann $5.", fmt))
    lines = message.splitlines()
    wallet = lines.index(next(line for line in lines if line.startswith("- wallet: ")))
    index = lines[wallet + 1]
    assert index.startswith("  APIs: ") and "login(username, password)" in index
    # the access token every logged-in API takes is the rules' business, not the index's
    assert "access_token" not in index and "page_index?" in index


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
    message = last_user_message(text)
    assert "- todolite: A to-do list.\n  APIs: " in message and "It keeps one list" not in message  # one line
    assert "- api_docs: " in message and "api_docs.show_api_doc" in system
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
    world, instruction = external_world(todolite(base_url, broken, total_s=0.5))
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
