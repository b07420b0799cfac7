"""`agentloop demo`: submit built-in tasks over the REST API and print each episode as it happens.

Uses a running service at `url`; if none answers there, starts an embedded one (`agentloop serve`)
on that port for the duration of the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import httpx
from rich.console import Console
from rich.panel import Panel

console = Console()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def service_at(url: str) -> Iterator[None]:
    if _up(url):
        yield
        return
    parsed = urlparse(url)
    console.print(f"[dim]no service at {url}; starting an embedded one…[/dim]")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentloop.cli",
            "serve",
            "--host",
            parsed.hostname or "127.0.0.1",
            "--port",
            str(parsed.port or 8000),
        ],
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 120
        while not _up(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the embedded service did not start (exit code {proc.poll()})")
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _events(client: httpx.Client, task_id: str) -> Iterator[tuple[str, Any]]:
    with client.stream("GET", f"/v1/tasks/{task_id}/events", timeout=httpx.Timeout(10, read=None)) as resp:
        resp.raise_for_status()
        event, data = "message", []
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                yield event, json.loads("\n".join(data))
                event, data = "message", []


def _print_step(step: dict[str, Any]) -> None:
    action = step["action"]
    call = f"{action['app']}.{action['api']}({json.dumps(action['args'])})" if action else "(no tool call)"
    tag = f" [red]{step['error_kind']}[/red]" if step["error_kind"] else ""
    console.print(
        f"[bold cyan]step {step['index']}[/bold cyan] {len(step['output_token_ids'])} tokens, {step['gen_s']:.1f}s{tag}"
    )
    console.print(f"  [bold]agent:[/bold] {step['output_text'][:300]!r}")
    console.print(f"  [bold]call:[/bold] {call[:300]}")
    console.print(f"  [bold]observation:[/bold] {step['observation'][:300]!r}")


def run_demo(url: str, key: str, task_refs: list[str], max_turns: int) -> int:
    url = url.rstrip("/")
    with service_at(url), httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        for ref in task_refs:
            resp = client.post("/v1/tasks", json={"task_ref": ref, "max_turns": max_turns})
            if resp.status_code != 202:
                console.print(f"[red]{ref}: {resp.status_code} {resp.text}[/red]")
                return 1
            task = resp.json()
            console.print(Panel(f"{task['instruction']}", title=f"task {ref} ({task['id']})"))
            for event, data in _events(client, task["id"]):
                if event == "step":
                    _print_step(data)
                elif event == "attempt" and data["attempt"] > 1:
                    console.print(f"[yellow]attempt {data['attempt']} started[/yellow]")
                elif event == "result":
                    console.print(
                        f"[bold]{data['status']}[/bold]: reward={data['reward']} success={data['success']} "
                        f"answer={data['answer']!r} error={data['error']!r}\n"
                    )
                elif event == "error":  # the service ended the stream (e.g. the key was revoked)
                    error = data.get("error", {})
                    console.print(f"[red]{ref}: stream ended: {error.get('code')}: {error.get('message')}[/red]")
                    return 1
    return 0
