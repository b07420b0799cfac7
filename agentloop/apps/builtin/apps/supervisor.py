"""The supervisor app: who the agent works for, their accounts, and how an episode ends."""

from __future__ import annotations

from typing import Any

from agentloop.apps.base import AppSpec, AppState, CallContext
from agentloop.apps.builtin.people import WorldData


def build_state(data: WorldData, account_apps: list[str]) -> AppState:
    rng = data.rng("supervisor")
    alphabet = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    accounts = {
        app: {"app": app, "username": data.supervisor.email, "password": "".join(rng.choices(alphabet, k=10))}
        for app in account_apps
    }
    sup = data.supervisor
    return {
        "profile": {"1": {"id": 1, **sup.public(), "birthday": sup.birthday, "city": sup.city}},
        "accounts": accounts,
        "addresses": {str(a["id"]): dict(a) for a in data.addresses},
        "payment_cards": {str(c["id"]): dict(c) for c in data.cards},
    }


app = AppSpec(
    name="supervisor",
    description="The person you work for: their profile, addresses, payment cards and app passwords. "
    "Call complete_task when you are done.",
    login=False,
)


@app.api("Show your supervisor's profile.", returns="{first_name, last_name, email, phone, birthday, city}")
def show_profile(ctx: CallContext) -> dict[str, Any]:
    profile = dict(ctx.table("profile")["1"])
    profile.pop("id")
    return profile


@app.api("Show the supervisor's username and password for every app.", returns="[{app, username, password}]")
def show_account_passwords(ctx: CallContext) -> list[dict[str, Any]]:
    return [dict(a) for a in ctx.table("accounts").values()]


@app.api("Show the supervisor's saved addresses.", returns="[{id, name, street_address, city, state, ...}]")
def show_addresses(ctx: CallContext) -> list[dict[str, Any]]:
    return list(ctx.table("addresses").values())


@app.api("Show the supervisor's payment cards.", returns="[{id, card_name, card_number, expiry_date, ...}]")
def show_payment_cards(ctx: CallContext) -> list[dict[str, Any]]:
    return list(ctx.table("payment_cards").values())


@app.api(
    "Mark the task as done. Give `answer` when the task asks a question; leave it out otherwise.",
    params={"answer": {"type": ["string", "number", "null"], "description": "The answer, if one was asked."}},
    returns="A confirmation. The episode ends after this call.",
)
def complete_task(ctx: CallContext, answer: str | float | None = None) -> str:
    ctx.world.answer = None if answer is None else _answer_text(answer)
    ctx.world.completed = True
    return "Task marked as complete."


def _answer_text(answer: str | float) -> str:
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return str(answer)
