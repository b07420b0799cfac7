"""Shared by the bench scripts: the final JSON line, and updating a section of docs/benchmarks.md."""

from __future__ import annotations

import argparse
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


def models_to_measure(ap: argparse.ArgumentParser, specs: list[str], base: bool) -> list[tuple[str, Path | None]]:
    """The base model (unless `base` is False) and each `--adapter LABEL=DIR` (DIR a saved LoRA adapter);
    a bad spec ends the command with argparse's error."""
    models: list[tuple[str, Path | None]] = [("base", None)] if base else []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not (Path(path) / "adapter_config.json").exists():
            ap.error(f"--adapter takes LABEL=DIR with DIR a saved adapter (adapter_config.json); got {spec!r}")
        models.append((label, Path(path)))
    return models


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, sort_keys=True))
