"""Built-in apps: every module here that defines `app` (an AppSpec) is part of the built-in world."""

from __future__ import annotations

import importlib
import pkgutil

from agentloop.apps.base import AppSpec

# api_docs and supervisor first: the order apps are listed to the agent
FIRST = ("api_docs", "supervisor")


def discover() -> list[AppSpec]:
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    ordered = [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]
    specs = []
    for name in ordered:
        module = importlib.import_module(f"{__name__}.{name}")
        spec = getattr(module, "app", None)
        if isinstance(spec, AppSpec):
            specs.append(spec)
    return specs
