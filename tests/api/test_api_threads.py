"""`api_threads`: an API process runs its blocking work (sync routes and dependencies) on at most that many
threads; requests beyond them wait their turn on the event loop, and every one is answered."""

import asyncio
import threading
import time

import httpx
import pytest

from agentloop.api.app import create_app


def busiest(threads: int | None, configure_env, requests: int = 6) -> tuple[int, list[int]]:
    """The most requests a sync route was running at once, and every request's status."""
    if threads is not None:
        configure_env(API_THREADS=threads)
    app = create_app()
    lock, running, most = threading.Lock(), [0], [0]

    @app.get("/busy")
    def busy() -> dict[str, bool]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return {"ok": True}

    async def burst() -> list[int]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                answers = await asyncio.gather(*(client.get("/busy") for _ in range(requests)))
        return [a.status_code for a in answers]

    statuses = asyncio.run(burst())
    return most[0], statuses


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_burst_runs_on_at_most_api_threads_threads(sqlite_db, configure_env, threads):
    most, statuses = busiest(threads, configure_env)
    assert statuses == [200] * 6
    assert most == threads


def test_the_default_lets_a_burst_of_six_run_at_once(sqlite_db, configure_env):
    most, statuses = busiest(None, configure_env)
    assert statuses == [200] * 6
    assert most == 6
