"""A call to an external app ends at its deadline whatever the app does (trickling its body or its headers),
a slow app holds only its own request slots, and an episode's calls to one app are budgeted."""

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from agentloop.apps.addresses import parse_networks
from agentloop.apps.base import ApiError
from agentloop.apps.external import ExternalApp
from agentloop.apps.remote_http import AppUnreachable, HttpLimits, Origin, RemoteClient
from agentloop.settings import get_settings
from tests.apps.loopback_app import API_KEY, LOOPBACK_NETWORKS, serve_app, serve_loopback_app


def trickling_app() -> FastAPI:
    app = FastAPI()

    @app.get("/trickle")
    async def trickle() -> StreamingResponse:
        async def body() -> Any:
            for _ in range(100):  # a byte every 0.2 s: each read is quick, the whole answer takes 20 s
                yield b" "
                await asyncio.sleep(0.2)

        return StreamingResponse(body(), media_type="application/json")

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(2.5)
        return {"report": "late"}

    @app.get("/quick")
    async def quick() -> dict[str, bool]:
        return {"ok": True}

    return app


@pytest.fixture
def slow_app() -> Iterator[str]:
    with serve_app(trickling_app()) as base_url:
        yield base_url


def client(base_url: str, **limits: Any) -> RemoteClient:
    networks = tuple(parse_networks(LOOPBACK_NETWORKS))
    return RemoteClient(Origin.parse(base_url), networks, ("X-Api-Key", API_KEY), limits=HttpLimits(**limits))


def timed(call: Any) -> tuple[float, BaseException | Any]:
    t0 = time.monotonic()
    try:
        out = call()
    except Exception as exc:
        out = exc
    return time.monotonic() - t0, out


def test_a_trickled_body_ends_at_the_deadline(slow_app):
    took, out = timed(lambda: client(slow_app, total_s=1.0).request("GET", "/trickle"))
    assert isinstance(out, AppUnreachable) and out.status == 504, out
    assert out.message == "the app did not answer within 1 s"
    assert took < 3.0  # the deadline, not the app's 20 s


@pytest.fixture
def trickled_headers() -> Iterator[str]:
    """A raw server that answers a status line, then one byte of its headers every 0.2 s."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for byte in b"X-Slow: " + b"a" * 100:
                    if stop.is_set():
                        break
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break
                    time.sleep(0.2)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_trickled_headers_end_at_the_deadline(trickled_headers):
    took, out = timed(lambda: client(trickled_headers, total_s=1.0).request("GET", "/"))
    assert isinstance(out, AppUnreachable) and out.status == 504, out
    assert took < 3.0


def test_a_slow_app_holds_its_own_slots_only(slow_app):
    with serve_loopback_app() as (other_url, _, _):
        slow = client(slow_app, total_s=1.0, max_concurrent=2)
        with ThreadPoolExecutor(3) as pool:
            first = [pool.submit(timed, lambda: slow.request("GET", "/slow")) for _ in range(2)]
            time.sleep(0.3)  # both slots taken
            # a call with a shorter deadline: both slots stay taken for the whole of it
            hurried = client(slow_app, total_s=0.4, max_concurrent=2)
            third = pool.submit(timed, lambda: hurried.request("GET", "/quick"))
            # another app answers at once meanwhile: the slow one's slots are its own
            took, items = timed(lambda: client(other_url, total_s=1.0, max_concurrent=2).request("GET", "/items"))
            assert items == [] and took < 1.0, items
            outs = [f.result()[1] for f in first]
            _, third_out = third.result()
        assert all(isinstance(o, AppUnreachable) and o.status == 504 for o in outs), outs
        assert isinstance(third_out, AppUnreachable) and third_out.status == 503, third_out
        assert (
            third_out.message == "the app already has 2 requests in flight from this worker and none ended within 0.4 s"
        )
        # the slow requests ended at their deadline (their reads are bounded by it too): the slots are free again
        assert slow.request("GET", "/quick") == {"ok": True}


def test_an_episode_has_a_budget_of_calls_per_app(configure_env):
    configure_env(APP_MAX_CALLS_PER_EPISODE=2)
    assert get_settings().app_max_calls_per_episode == 2
    with serve_loopback_app() as (base_url, doc, calls):
        app = ExternalApp.build(
            "todolite", "", doc, base_url, allowed_networks=LOOPBACK_NETWORKS, auth_header=("X-Api-Key", API_KEY)
        )
        spec = app.fork().spec()
        add = spec.apis["add_item"].handler
        assert add(None, name="a")["count"] == 1
        assert add(None, name="b")["count"] == 2
        with pytest.raises(ApiError) as err:
            add(None, name="c")
        assert err.value.status == 429
        assert err.value.message == "this episode has made its 2 calls to app 'todolite': no more are sent"
        with pytest.raises(ApiError):  # the budget is the app's, whichever API is called
            spec.apis["list_items"].handler(None)
        assert len(calls.headers_seen) == 2  # the refused calls were not sent
        next_episode = app.fork().spec()  # a new episode, a new budget
        assert next_episode.apis["add_item"].handler(None, name="d")["count"] == 3
