"""A small real HTTP app served on loopback for the external-app tests: a to-do list with per-episode
state, the agentloop_* environment operations (and a worked example), an auth header, and some misbehaving
endpoints; `LoopbackProcess` serves it from a process of its own, to kill and restart (an outage)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel

API_KEY = "s3cret-key"
LOOPBACK_NETWORKS = ["127.0.0.0/8", "::1/128"]  # what an operator allows for an app served here
TASKS = [
    {"task_ref": "add-apple", "instruction": "Add an item named apple to my list.", "split": "train"},
    {"task_ref": "add-two", "instruction": "Add the items bread and milk to my list.", "split": "test"},
]
EXPECTED = {"add-apple": ["apple"], "add-two": ["bread", "milk"]}
# the app's worked example (agentloop_example), written for the app registered as "todolite"
EXAMPLE = {
    "instruction": "How many items are on my list?",
    "steps": [
        {"app": "todolite", "api": "list_items", "args": {}, "observation": ["eggs", "tea"]},
        {"app": "supervisor", "api": "complete_task", "args": {"answer": 2}, "observation": "Task marked as complete."},
    ],
}


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
    examples: list[str | None] = field(default_factory=list)  # the Agentloop-Episode of each example fetch
    releases: list[str | None] = field(default_factory=list)  # the Agentloop-Episode of each agentloop_release
    injected: list[str] = field(default_factory=list)  # the operation of each answer a fault replaced


def build_app(calls: Calls) -> FastAPI:
    app = FastAPI(title="todo-lite")
    episodes: dict[str, list[str]] = {}
    lock = threading.Lock()
    faults: dict[str, list[int]] = {}  # "reset" | "evaluate" -> the statuses of its next answers (POST /_test/faults)

    def check(key: str | None) -> None:
        if key != API_KEY:
            raise HTTPException(401, "missing or wrong X-Api-Key")

    def inject(op: str) -> None:
        with lock:
            status = faults[op].pop(0) if faults.get(op) else None
        if status is not None:
            calls.injected.append(op)
            raise HTTPException(status, f"injected fault: {op} answers {status}")

    def items_of(episode: str | None) -> list[str]:
        calls.headers_seen.append(episode)
        with lock:
            if episode is not None and episode not in episodes:  # e.g. reset before this process restarted
                raise HTTPException(404, f"unknown episode {episode!r}")
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

    @app.get("/nested", operation_id="nested", summary="JSON nested deeper than any decoder goes.")
    def nested() -> Response:
        return Response(b"[" * 100_000 + b"]" * 100_000, media_type="application/json")

    @app.get("/huge", operation_id="huge", summary="Far too much output.")
    def huge() -> Response:
        return Response(b"x" * 3_000_000, media_type="text/plain")

    @app.get("/agentloop/tasks", operation_id="agentloop_tasks")
    def tasks() -> list[dict[str, str]]:
        return TASKS

    @app.get("/agentloop/example", operation_id="agentloop_example")
    def example(agentloop_episode: str | None = Header(None)) -> dict[str, Any]:
        calls.examples.append(agentloop_episode)
        return EXAMPLE

    @app.post("/agentloop/reset", operation_id="agentloop_reset")
    def reset(body: Reset) -> dict[str, str]:
        inject("reset")
        calls.resets.append(body.task_ref)
        episode = uuid.uuid4().hex
        with lock:
            episodes[episode] = []
        return {"episode": episode}

    @app.post("/agentloop/evaluate", operation_id="agentloop_evaluate")
    def evaluate(body: Evaluate, agentloop_episode: str | None = Header(None)) -> dict[str, int]:
        inject("evaluate")
        calls.evaluations.append((body.task_ref, agentloop_episode))
        with lock:
            if agentloop_episode not in episodes:
                raise HTTPException(404, f"unknown episode {agentloop_episode!r}")
            items = episodes[agentloop_episode]
        want = EXPECTED[body.task_ref]
        passed = sum(w in items for w in want) + (len(items) == len(want))
        return {"passed": passed, "total": len(want) + 1}

    @app.post("/agentloop/release", operation_id="agentloop_release")
    def release(agentloop_episode: str | None = Header(None)) -> dict[str, bool]:
        calls.releases.append(agentloop_episode)
        with lock:
            known = episodes.pop(agentloop_episode or "", None) is not None
        return {"released": known}

    # for the tests only, left out of the document (so never an API of the agent's)
    @app.post("/_test/faults", include_in_schema=False)
    def set_faults(body: dict[str, list[int]]) -> dict[str, bool]:
        with lock:
            faults.update(body)
        return {"ok": True}

    @app.get("/_test/calls", include_in_schema=False)
    def get_calls() -> dict[str, Any]:
        return asdict(calls)

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """The base URL of `app` served by uvicorn on 127.0.0.1 (a thread of this process) until the block ends."""
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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_loopback_app() -> Iterator[tuple[str, dict[str, Any], Calls]]:
    """(base_url, OpenAPI document, call log) of the app running on 127.0.0.1."""
    calls = Calls()
    app = build_app(calls)
    with serve_app(app) as base_url:
        yield base_url, app.openapi(), calls


# --- the lights of a house, as an environment to train on ------------------------------------------
# Registered as "lights" with LIGHTS_DESCRIPTION, it gives the agent the very prompt of the learner tests'
# lights world (tests/learner/lights_world.py), so the model warm-started there turns the lights on in some
# rollouts of a task and off in others: K rollouts of one task earn mixed rewards.

LIGHTS_DESCRIPTION = "The lights of the house."
LIGHTS_TASKS = [
    {"task_ref": f"lights-{i}", "instruction": phrase, "split": "dev" if i >= 6 else "train"}
    for i, phrase in enumerate(
        [
            "Turn the lights on.",
            "Please switch the lights on.",
            "Lights on, please.",
            "I need light: turn it on.",
            "Switch on the lights.",
            "Can you turn on the lights?",
            "It is dark, turn the lights on.",
            "Make the lights go on.",
        ]
    )
]


@dataclass
class LightsLog:
    """What the lights app was asked: every request (method, path, Agentloop-Episode), each reset
    (task_ref, the episode it started) and each evaluation (task_ref, episode, passed)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    resets: list[tuple[str, str]] = field(default_factory=list)
    evaluations: list[tuple[str, str | None, int]] = field(default_factory=list)


def build_lights_app(log: LightsLog) -> FastAPI:
    app = FastAPI(title="lights")
    on: dict[str, bool] = {}  # episode -> are its lights on
    lock = threading.Lock()

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        log.requests.append((request.method, request.url.path, request.headers.get("agentloop-episode")))
        return await call_next(request)

    def switch(episode: str | None, value: bool) -> dict[str, bool]:
        with lock:
            if episode not in on:
                raise HTTPException(404, f"no episode {episode!r}: reset a task first")
            on[episode] = value
        return {"on": value}

    @app.post("/lights/on", operation_id="turn_on", summary="Turn the lights on.")
    def turn_on(agentloop_episode: str | None = Header(None)) -> dict[str, bool]:
        return switch(agentloop_episode, True)

    @app.post("/lights/off", operation_id="turn_off", summary="Turn the lights off.")
    def turn_off(agentloop_episode: str | None = Header(None)) -> dict[str, bool]:
        return switch(agentloop_episode, False)

    @app.get("/agentloop/tasks", operation_id="agentloop_tasks")
    def tasks() -> list[dict[str, str]]:
        return LIGHTS_TASKS

    @app.post("/agentloop/reset", operation_id="agentloop_reset")
    def reset(body: Reset) -> dict[str, str]:
        episode = uuid.uuid4().hex
        with lock:
            on[episode] = False
        log.resets.append((body.task_ref, episode))
        return {"episode": episode}

    @app.post("/agentloop/evaluate", operation_id="agentloop_evaluate")
    def evaluate(body: Evaluate, agentloop_episode: str | None = Header(None)) -> dict[str, int]:
        with lock:
            if agentloop_episode not in on:
                raise HTTPException(404, f"no episode {agentloop_episode!r}")
            passed = int(on[agentloop_episode])
        log.evaluations.append((body.task_ref, agentloop_episode, passed))
        return {"passed": passed, "total": 1}

    return app


@contextmanager
def serve_lights_app() -> Iterator[tuple[str, dict[str, Any], LightsLog]]:
    """(base_url, OpenAPI document, request log) of the lights app running on 127.0.0.1."""
    log = LightsLog()
    app = build_lights_app(log)
    with serve_app(app) as base_url:
        yield base_url, app.openapi(), log


# --- the to-do app in a process of its own, to stop and start (an outage) ---------------------------


class LoopbackProcess:
    """The to-do app served by a process of its own on a fixed port: `stop()` kills it (its episodes are
    gone with it), `start()` brings a fresh one up on the same port. `calls()` is that process's call log."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.document = build_app(Calls()).openapi()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.loopback_app", str(self.port)],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{self.base_url}/_test/calls", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the loopback app did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL: a crash, not a shutdown
            self.proc.wait()
        self.proc = None

    def calls(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.base_url}/_test/calls", timeout=5).json())

    def fail_next(self, op: str, *statuses: int) -> None:
        """The next answers of `op` ("reset" or "evaluate") are these statuses."""
        httpx.post(f"{self.base_url}/_test/faults", json={op: list(statuses)}, timeout=5).raise_for_status()


if __name__ == "__main__":  # python -m tests.apps.loopback_app PORT
    uvicorn.run(build_app(Calls()), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
