"""Task scenarios of the built-in world: every module here that defines `SCENARIOS` contributes."""

from __future__ import annotations

import importlib
import pkgutil

from agentloop.apps.tasks import Scenario


def discover() -> list[Scenario]:
    scenarios: list[Scenario] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        scenarios.extend(getattr(module, "SCENARIOS", []))
    ids = [s.id for s in scenarios]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate scenario ids: {', '.join(duplicates)}")
    return scenarios
