"""Wallet: a peer-to-peer payments app (balance, transactions, money requests)."""

from __future__ import annotations

from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    integer,
    number,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import WorldData, iso

NOTES = [
    "dinner",
    "rent",
    "concert tickets",
    "groceries",
    "gas",
    "birthday gift",
    "coffee",
    "movie night",
    "utilities",
    "taxi",
    "lunch",
    "book club",
    "ski trip",
    "pizza",
]


def build_state(data: WorldData) -> AppState:
    rng = data.rng("wallet")
    me = data.supervisor.email
    contacts = rng.sample(data.people, min(18, len(data.people)))
    transactions: dict[str, dict[str, Any]] = {}
    for i in range(1, rng.randint(35, 55) + 1):
        other = rng.choice(contacts).email
        outgoing = rng.random() < 0.5
        transactions[str(i)] = {
            "id": i,
            "sender": me if outgoing else other,
            "receiver": other if outgoing else me,
            "amount": round(rng.randint(300, 12000) / 100, 2),
            "note": rng.choice(NOTES),
            "created_at": data.ago(days=rng.uniform(0.2, 120)),
        }
    requests: dict[str, dict[str, Any]] = {}
    for i in range(1, rng.randint(10, 16) + 1):
        other = rng.choice(contacts).email
        incoming = rng.random() < 0.65  # someone asks the supervisor for money
        status = "pending" if rng.random() < 0.55 else rng.choice(["approved", "declined"])
        requests[str(i)] = {
            "id": i,
            "requester": other if incoming else me,
            "payer": me if incoming else other,
            "amount": round(rng.randint(500, 9000) / 100, 2),
            "note": rng.choice(NOTES),
            "status": status,
            "created_at": data.ago(days=rng.uniform(0.2, 40)),
        }
    return {
        "account": {"1": {"id": 1, "owner": me, "balance": round(rng.randint(80000, 400000) / 100, 2)}},
        "transactions": transactions,
        "requests": requests,
        "_sessions": {},
    }


app = AppSpec(
    name="wallet", description="Send, receive and request money; see your balance and history.", build_state=build_state
)

TRANSACTION = "{transaction_id, sender, receiver, amount, note, created_at}"
REQUEST = "{request_id, requester, payer, amount, note, status, created_at}"


def _txn(t: dict[str, Any]) -> dict[str, Any]:
    return {"transaction_id": t["id"], **{k: v for k, v in t.items() if k != "id"}}


def _req(r: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": r["id"], **{k: v for k, v in r.items() if k != "id"}}


def _account(ctx: CallContext) -> dict[str, Any]:
    return ctx.table("account")["1"]


def _check_person(ctx: CallContext, email: str, role: str) -> None:
    if "@" not in email:
        raise ApiError(422, f"{email!r} is not an email address. Wallet users are identified by email.")
    if email == ctx.user:
        raise ApiError(422, f"The {role} cannot be yourself.")


@app.api("Show your current balance.", returns="{balance}")
def show_balance(ctx: CallContext) -> dict[str, Any]:
    return {"balance": _account(ctx)["balance"]}


@app.api(
    "List your transactions, newest first. Filter by direction (sent/received), by the other person's email, "
    "or by date.",
    params={
        "direction": string("sent or received.", enum=["sent", "received"]),
        "person": string("Email of the other person."),
        "after": string("Only transactions after this date-time (ISO 8601)."),
        **page_params(),
    },
    returns=f"[{TRANSACTION}]",
)
def list_transactions(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    direction: str | None = None,
    person: str | None = None,
    after: str | None = None,
) -> list[dict[str, Any]]:
    rows = list(ctx.table("transactions").values())
    if direction == "sent":
        rows = [t for t in rows if t["sender"] == ctx.user]
    elif direction == "received":
        rows = [t for t in rows if t["receiver"] == ctx.user]
    if person:
        rows = [t for t in rows if person in (t["sender"], t["receiver"])]
    if after:
        rows = [t for t in rows if t["created_at"] > after]
    rows.sort(key=lambda t: t["created_at"], reverse=True)
    return [_txn(t) for t in paginate(rows, page_index, page_limit)]


@app.api(
    "Show one transaction.",
    params={"transaction_id": integer("Id of the transaction.")},
    required=["transaction_id"],
    returns=TRANSACTION,
)
def show_transaction(ctx: CallContext, transaction_id: int) -> dict[str, Any]:
    return _txn(ctx.get("transactions", transaction_id, "transaction"))


@app.api(
    "Send money to someone by email. Fails if your balance is too low.",
    params={
        "receiver_email": string("Email of the person to pay."),
        "amount": number("Amount in dollars.", exclusiveMinimum=0),
        "note": string("A note the receiver sees."),
    },
    required=["receiver_email", "amount"],
    returns="{transaction_id, balance}",
)
def send_money(ctx: CallContext, receiver_email: str, amount: float, note: str = "") -> dict[str, Any]:
    _check_person(ctx, receiver_email, "receiver")
    amount = round(float(amount), 2)
    account = _account(ctx)
    if amount > account["balance"]:
        raise ApiError(422, f"Insufficient balance: you have ${account['balance']:.2f}.")
    account["balance"] = round(account["balance"] - amount, 2)
    txn = ctx.insert(
        "transactions",
        {"sender": ctx.user, "receiver": receiver_email, "amount": amount, "note": note, "created_at": iso(ctx.now)},
    )
    return {"transaction_id": txn["id"], "balance": account["balance"]}


@app.api(
    "Ask someone to pay you.",
    params={
        "payer_email": string("Email of the person who should pay."),
        "amount": number("Amount in dollars.", exclusiveMinimum=0),
        "note": string("What it is for."),
    },
    required=["payer_email", "amount"],
    returns="{request_id}",
)
def request_money(ctx: CallContext, payer_email: str, amount: float, note: str = "") -> dict[str, Any]:
    _check_person(ctx, payer_email, "payer")
    req = ctx.insert(
        "requests",
        {
            "requester": ctx.user,
            "payer": payer_email,
            "amount": round(float(amount), 2),
            "note": note,
            "status": "pending",
            "created_at": iso(ctx.now),
        },
    )
    return {"request_id": req["id"]}


@app.api(
    "List money requests, newest first: those others sent you (incoming) or you sent (outgoing).",
    params={
        "direction": string("incoming or outgoing.", enum=["incoming", "outgoing"]),
        "status": string("pending, approved or declined.", enum=["pending", "approved", "declined"]),
        **page_params(),
    },
    returns=f"[{REQUEST}]",
)
def list_requests(
    ctx: CallContext, page_index: int, page_limit: int, direction: str | None = None, status: str | None = None
) -> list[dict[str, Any]]:
    rows = list(ctx.table("requests").values())
    if direction == "incoming":
        rows = [r for r in rows if r["payer"] == ctx.user]
    elif direction == "outgoing":
        rows = [r for r in rows if r["requester"] == ctx.user]
    if status:
        rows = [r for r in rows if r["status"] == status]
    rows.sort(key=lambda r: r["created_at"], reverse=True)
    return [_req(r) for r in paginate(rows, page_index, page_limit)]


def _incoming_pending(ctx: CallContext, request_id: int) -> dict[str, Any]:
    req = ctx.get("requests", request_id, "request")
    if req["payer"] != ctx.user:
        raise ApiError(403, f"Request {request_id} was not sent to you; only its payer can answer it.")
    if req["status"] != "pending":
        raise ApiError(409, f"Request {request_id} is already {req['status']}.")
    return req


@app.api(
    "Pay a money request someone sent you.",
    params={"request_id": integer("Id of the request.")},
    required=["request_id"],
    returns="{transaction_id, balance}",
)
def approve_request(ctx: CallContext, request_id: int) -> dict[str, Any]:
    req = _incoming_pending(ctx, request_id)
    account = _account(ctx)
    if req["amount"] > account["balance"]:
        raise ApiError(422, f"Insufficient balance: you have ${account['balance']:.2f}.")
    account["balance"] = round(account["balance"] - req["amount"], 2)
    req["status"] = "approved"
    txn = ctx.insert(
        "transactions",
        {
            "sender": ctx.user,
            "receiver": req["requester"],
            "amount": req["amount"],
            "note": req["note"],
            "created_at": iso(ctx.now),
        },
    )
    return {"transaction_id": txn["id"], "balance": account["balance"]}


@app.api(
    "Decline a money request someone sent you.",
    params={"request_id": integer("Id of the request.")},
    required=["request_id"],
    returns="A confirmation message.",
)
def decline_request(ctx: CallContext, request_id: int) -> str:
    req = _incoming_pending(ctx, request_id)
    req["status"] = "declined"
    return f"Request {request_id} declined."
