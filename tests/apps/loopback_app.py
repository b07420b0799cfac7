"""A small real HTTP app served on loopback for the external-app tests: a to-do list with per-episode
state, the agentloop_* environment operations, an auth header, and some misbehaving endpoints."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel

API_KEY = "s3cret-key"
TASKS = [
    {"task_ref": "add-apple", "instruction": "Add an item named apple to my list.", "split": "train"},
    {"task_ref": "add-two", "instruction": "Add the items bread and milk to my list.", "split": "test"},
]
EXPECTED = {"add-apple": ["apple"], "add-two": ["bread", "milk"]}


class NewItem(BaseModel):
    name: str


class Reset(BaseModel):
    task_ref: str


class Evaluate(BaseModel):
    task_ref: str
    answer: str | None = None


@dataclass
class Calls:
    resets: list[str] = field(default_factory=list)
    evaluations: list[tuple[str, str | None]] = field(default_factory=list)
    headers_seen: list[str | None] = field(default_factory=list)


def build_app(calls: Calls) -> FastAPI:
    app = FastAPI(title="todo-lite")
    episodes: dict[str, list[str]] = {}
    lock = threading.Lock()

    def check(key: str | None) -> None:
        if key != API_KEY:
            raise HTTPException(401, "missing or wrong X-Api-Key")

    def items_of(episode: str | None) -> list[str]:
        calls.headers_seen.append(episode)
        with lock:
            return episodes.setdefault(episode or "default", [])

    @app.get("/items", operation_id="list_items", summary="List the items on my list.")
    def list_items(x_api_key: str | None = Header(None), agentloop_episode: str | None = Header(None)) -> list[str]:
        check(x_api_key)
        return items_of(agentloop_episode)

    @app.post("/items", operation_id="add_item", summary="Add an item to my list.")
    def add_item(
        item: NewItem, x_api_key: str | None = Header(None), agentloop_episode: str | None = Header(None)
    ) -> dict[str, Any]:
        check(x_api_key)
        items = items_of(agentloop_episode)
        items.append(item.name)
        return {"ok": True, "count": len(items)}

    @app.get("/slow", operation_id="slow_report", summary="A report that takes a long time.")
    def slow() -> dict[str, str]:
        time.sleep(3)
        return {"report": "late"}

    @app.get("/moved", operation_id="moved", summary="Moved elsewhere.")
    def moved() -> RedirectResponse:
        return RedirectResponse("http://169.254.169.254/latest/meta-data/", status_code=302)

    @app.get("/garbage", operation_id="garbage", summary="Broken output.")
    def garbage() -> Response:
        return Response(b"{not json at all", media_type="application/json")

    @app.get("/huge", operation_id="huge", summary="Far too much output.")
    def huge() -> Response:
        return Response(b"x" * 3_000_000, media_type="text/plain")

    @app.get("/agentloop/tasks", operation_id="agentloop_tasks")
    def tasks() -> list[dict[str, str]]:
        return TASKS

    @app.post("/agentloop/reset", operation_id="agentloop_reset")
    def reset(body: Reset) -> dict[str, str]:
        calls.resets.append(body.task_ref)
        episode = uuid.uuid4().hex
        with lock:
            episodes[episode] = []
        return {"episode": episode}

    @app.post("/agentloop/evaluate", operation_id="agentloop_evaluate")
    def evaluate(body: Evaluate, agentloop_episode: str | None = Header(None)) -> dict[str, int]:
        calls.evaluations.append((body.task_ref, agentloop_episode))
        with lock:
            items = episodes.get(agentloop_episode or "", [])
        want = EXPECTED[body.task_ref]
        passed = sum(w in items for w in want) + (len(items) == len(want))
        return {"passed": passed, "total": len(want) + 1}

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_loopback_app() -> Iterator[tuple[str, dict[str, Any], Calls]]:
    """(base_url, OpenAPI document, call log) of the app running on 127.0.0.1."""
    calls = Calls()
    app = build_app(calls)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("loopback app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app.openapi(), calls
    finally:
        server.should_exit = True
        thread.join(timeout=10)
