"""Shared by the bench scripts: the final JSON line, and updating a section of docs/benchmarks.md."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

import torch

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def machine() -> str:
    return f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def write_section(name: str, markdown: str) -> None:
    """Replace the text between `<!-- bench:name -->` and `<!-- /bench:name -->` (appended if absent)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{start}\n{markdown.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOCS.write_text(text)


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=True))
