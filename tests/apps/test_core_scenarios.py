"""The notes, wallet, supervisor and cross-app scenarios as a set: sizes, splits, difficulty mix, varied
instances, and the free-text matchers their answers rely on."""

from collections import Counter
from collections.abc import Callable

import pytest

from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.scenarios import cross, notes, supervisor, wallet
from agentloop.apps.builtin.scenarios._matchers import (
    amounts_in,
    listed_lines,
    mentions_amount,
    only_amount,
    same_date,
)
from agentloop.apps.builtin.scenarios.contacts import find_contact
from agentloop.apps.tasks import OracleClient

MINE = [*notes.SCENARIOS, *wallet.SCENARIOS, *supervisor.SCENARIOS, *cross.SCENARIOS]
HELD_OUT_APPS = {"music", "files", "todo"}


def test_scenario_mix() -> None:
    assert len(MINE) == 35
    assert Counter(s.split for s in MINE) == {"train": 20, "dev": 5, "test_normal": 10}
    difficulty = Counter(s.difficulty for s in MINE)
    assert difficulty == {1: 14, 2: 15, 3: 6}
    assert len(cross.SCENARIOS) == 12 and all(2 <= len(s.apps) <= 4 for s in cross.SCENARIOS)
    assert all(s.apps == ("supervisor",) for s in supervisor.SCENARIOS)
    assert not any(HELD_OUT_APPS & set(s.apps) for s in MINE)


def test_my_scenarios_are_part_of_the_world() -> None:
    ids = {s.id for s in BUILTIN.scenarios}
    assert {s.id for s in MINE} <= ids
    assert len(ids) >= 110


def test_every_scenario_has_three_different_instructions() -> None:
    per_scenario: dict[str, set[str]] = {}
    for s in MINE:
        for v in (1, 2, 3):
            per_scenario.setdefault(s.id, set()).add(BUILTIN.task(f"{s.id}-{v}").instruction)
    assert all(len(v) == 3 for v in per_scenario.values()), {k: v for k, v in per_scenario.items() if len(v) < 3}


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("1997-06-20", True),
        ("June 20, 1997", True),
        ("20 June 1997", True),
        ("June 20th, 1997", True),
        ("06/20/1997", True),
        ("June 21, 1997", False),
        ("June 20", False),
        ("", False),
    ],
)
def test_same_date_reads_common_formats(answer: str, ok: bool) -> None:
    assert same_date("1997-06-20")(answer) is ok


def test_amount_matchers() -> None:
    assert mentions_amount(23.4)("Total $70.20, so $23.40 each.")
    assert not mentions_amount(23.4)("Total $70.20, so $23.41 each.")
    assert only_amount(67000)("67,000 miles") and only_amount(2100)("$2,100")
    assert not only_amount(2100)("2100 or 2400")


def test_listed_lines_ignores_bullets_and_order() -> None:
    match = listed_lines(["Bin days", "Paint colours"])
    assert match("- Paint colours\n- Bin days\n")
    assert match("1. Bin days\n2. Paint colours")
    assert not match("Bin days")
    assert not match("Bin days\nPaint colours\nSpare keys")


# --- the traps work: a careless solution fails --------------------------------------------------


def verdict_of(task_id: str, solve: Callable[[OracleClient], str | None]) -> bool:
    """Run a (careless) solution on the task's world; True when the evaluator accepts it."""
    task = BUILTIN.task(task_id)
    world = BUILTIN.task_world(task_id)
    before = world.copy_state()
    c = OracleClient(world)
    answer = solve(c)
    c.call("supervisor", "complete_task", **({} if answer is None else {"answer": answer}))
    return task.evaluator.evaluate(before, world.state, world.answer).success


@pytest.mark.parametrize("variant", [1, 2, 3])
def test_reading_expiry_dates_as_text_is_wrong(variant: int) -> None:
    task_id = f"supervisor_card_expiry-{variant}"
    asks = BUILTIN.task(task_id).instruction
    first = not any(last in asks for last in supervisor.EXPIRY_QUESTIONS["last"])

    def naive(c: OracleClient) -> str:
        cards = sorted(c.call("supervisor", "show_payment_cards"), key=lambda x: x["expiry_date"])
        return str(cards[0 if first else -1]["card_name"])

    assert not verdict_of(task_id, naive)


@pytest.mark.parametrize("variant", [1, 2, 3])
def test_paying_the_total_instead_of_the_share_is_wrong(variant: int) -> None:
    task_id = f"mail_pay_asked-{variant}"

    def pay_first_amount(c: OracleClient) -> None:
        spec = BUILTIN.task(task_id)
        subject = spec.instruction.split("'")[1]
        token = c.login("mail")
        found = next(e for e in c.pages("mail", "search_emails", access_token=token, query=subject))
        body = c.call("mail", "show_email", access_token=token, email_id=found["email_id"])["body"]
        amount = amounts_in(body)[0]
        wtoken = c.login("wallet")
        c.call("wallet", "send_money", access_token=wtoken, receiver_email=found["sender"], amount=amount, note=subject)
        return None

    assert verdict_of(task_id, BUILTIN.task(task_id).oracle)
    assert not verdict_of(task_id, pay_first_amount)


@pytest.mark.parametrize("variant", [1, 2, 3])
def test_paying_someone_already_paid_back_is_wrong(variant: int) -> None:
    task_id = f"wallet_pay_from_note-{variant}"
    title = BUILTIN.task(task_id).instruction.split("'")[1]

    def pay_every_line(c: OracleClient) -> None:
        ntoken, ctoken, wtoken = c.login("notes"), c.login("contacts"), c.login("wallet")
        hit = next(n for n in c.pages("notes", "search_notes", access_token=ntoken, query=title))
        body = c.call("notes", "show_note", access_token=ntoken, note_id=hit["note_id"])["body"]
        for name, amount, _ in cross.priced_lines(body):
            email = find_contact(c, ctoken, name)["email"]
            c.call("wallet", "send_money", access_token=wtoken, receiver_email=email, amount=amount, note=title)
        return None

    assert not verdict_of(task_id, pay_every_line)


@pytest.mark.parametrize("variant", [1, 2, 3])
def test_counting_money_received_is_wrong_for_the_top_payee(variant: int) -> None:
    task_id = f"wallet_top_payee_name-{variant}"
    month = next(m for m, name in wallet.MONTHS.items() if name in BUILTIN.task(task_id).instruction)

    def both_directions(c: OracleClient) -> str:
        low, high = f"2025-{month:02d}-01", f"2025-{month + 1:02d}-01"
        token = c.login("wallet")
        me = c.world.state["supervisor"]["profile"]["1"]["email"]
        per: dict[str, float] = {}
        for t in c.pages("wallet", "list_transactions", access_token=token, after=low):
            if t["created_at"] < high:
                other = t["receiver"] if t["sender"] == me else t["sender"]
                per[other] = per.get(other, 0) + t["amount"]
        top = max(per, key=per.__getitem__)
        ctoken = c.login("contacts")
        hits = c.call("contacts", "search_contacts", access_token=ctoken, query=top)
        return f"{hits[0]['first_name']} {hits[0]['last_name']}" if hits else top

    assert not verdict_of(task_id, both_directions)
