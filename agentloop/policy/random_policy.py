"""Random tool calls over a world's apps: the floor every agent must beat (its TGC is about 0)."""

from __future__ import annotations

import random
import string
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.agent.actions import render_action
from agentloop.apps.base import AppSpec
from agentloop.apps.tasks import ToolCall
from agentloop.policy.base import Generation, GenerationRequest, Tokenizer

WORDS = ["home", "work", "june", "friday", "note", "lunch", "25", "party", "report", "trip"]


class RandomPolicy:
    def __init__(
        self, tokenizer: Tokenizer, apps: Mapping[str, AppSpec], seed: int = 0, complete_prob: float = 0.1
    ) -> None:
        self.tokenizer = tokenizer
        self.name = "random"
        self._rng = random.Random(seed)
        self._apis = [(app, api) for app, spec in apps.items() for api, a in spec.apis.items() if not a.hidden]
        self._apps = apps
        self._complete_prob = complete_prob
        eos = tokenizer.eos_token_id
        self._eos = int(eos[0] if isinstance(eos, list) else eos)

    def _value(self, schema: dict[str, Any]) -> Any:
        kind = schema.get("type")
        if "enum" in schema:
            return self._rng.choice(schema["enum"])
        if isinstance(kind, list):
            kind = self._rng.choice([k for k in kind if k != "null"] or ["string"])
        if kind == "integer":
            return self._rng.randint(0, 20)
        if kind == "number":
            return round(self._rng.uniform(1, 100), 2)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "array":
            return [self._value(schema.get("items", {})) for _ in range(self._rng.randint(1, 2))]
        if self._rng.random() < 0.3:
            return "".join(self._rng.choices(string.ascii_lowercase, k=6)) + "@gmail.com"
        return self._rng.choice(WORDS)

    def _call(self) -> ToolCall:
        if self._rng.random() < self._complete_prob:
            return ToolCall("supervisor", "complete_task", {"answer": self._rng.choice(WORDS)})
        app, api = self._rng.choice(self._apis)
        params = self._apps[app].apis[api].parameters.get("properties", {})
        return ToolCall(app, api, {name: self._value(schema) for name, schema in params.items()})

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for _ in requests:
            text = render_action(self._call())
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self._eos]
            out.append(Generation(ids, None, "stop", text))
        return out

    def load_adapter(self, name: str, path: str) -> None:
        raise ValueError("the random policy has no weights to adapt")

    def unload_adapter(self, name: str) -> None:
        return None

    def loaded_adapters(self) -> set[str]:
        return set()

    def end_episode(self, key: str) -> None:
        return None
