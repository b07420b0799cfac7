"""The built-in world's parts of the prompt: the agent works for the supervisor, apps with accounts need
a login, lists come in pages, and the worked example logs in to `notes`. Only this world says so."""

from __future__ import annotations

from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World
from agentloop.apps.world_prompt import ExampleStep, WorkedExample, WorldPrompt

CONVENTIONS = (
    "Apps with accounts need an access_token: get the password from supervisor.show_account_passwords,\n"
    "  then call the app's login API with your email as username.",
    "Lists come in pages (page_index, page_limit): keep asking for the next page until it is empty.",
    "Never guess ids, emails or amounts: look them up.",
)

EXAMPLE = WorkedExample(
    instruction="How many of my notes have the tag 'work'?",
    steps=(
        ExampleStep(
            ToolCall("supervisor", "show_account_passwords", {}),
            [{"app": "notes", "username": "me@example.com", "password": "x7Gk2pQ9"}],
        ),
        ExampleStep(
            ToolCall("notes", "login", {"username": "me@example.com", "password": "x7Gk2pQ9"}),
            {"access_token": "3f9a1c", "token_type": "Bearer"},
        ),
        ExampleStep(
            ToolCall("notes", "list_notes", {"access_token": "3f9a1c", "tag": "work", "page_limit": 20}),
            [{"note_id": 4, "title": "Q3 plan"}, {"note_id": 9, "title": "1:1 notes"}],
        ),
        ExampleStep(ToolCall("supervisor", "complete_task", {"answer": 2}), "Task marked as complete."),
    ),
)


def builtin_prompt(world: World) -> WorldPrompt:
    """The supervisor (the world's person, named in the task's preamble), the world's conventions, and the
    time (the world's frozen "now")."""
    me = world.state["supervisor"]["profile"]["1"]
    now = world.now
    return WorldPrompt(
        # the same for everyone: who the person is comes with the task (the preamble)
        persona="You are an assistant that completes tasks for the person you work for (the supervisor) by "
        "calling the APIs of their apps.",
        conventions=CONVENTIONS,
        first_call=ToolCall("api_docs", "list_apis", {"app_name": "supervisor"}),
        example=EXAMPLE,
        preamble=(
            f"I am {me['first_name']} {me['last_name']}. My email is {me['email']} and my phone number is "
            f"{me['phone']}. It is now {now:%A, %B} {now.day}, {now:%Y, %H:%M} UTC.\n"
        ),
    )
