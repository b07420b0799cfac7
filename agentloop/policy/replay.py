"""A policy that writes fixed turns instead of sampling (`policy_backend: replay`): every episode makes the
configured calls in order (`replay_actions`), then `supervisor.complete_task`. No model runs; the tokenizer
is the configured model's, so prompts, contexts and stored steps are the real ones.

For measuring the service around the model (bench/api_load.py) and smoke-testing a deployment end to end
without a GPU. Its turns are not sampled: no log-probs (the learner recomputes them, DESIGN §5)."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence

from agentloop.agent.actions import render_action
from agentloop.apps.tasks import ToolCall
from agentloop.policy.base import Generation, GenerationRequest, Tokenizer
from agentloop.settings import Settings

DONE = ToolCall("supervisor", "complete_task", {})


def parse_actions(text: str) -> list[ToolCall]:
    """`replay_actions`: a JSON list of {"app", "api", "args"}; ValueError saying what is wrong."""
    try:
        items = json.loads(text or "[]")
    except json.JSONDecodeError as exc:
        raise ValueError(f"replay_actions is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise ValueError('replay_actions must be a JSON list of {"app": ..., "api": ..., "args": {...}}')
    calls = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item[k] for k in ("app", "api")):
            raise ValueError(f"replay_actions[{i}] needs an app and an api (strings)")
        args = item.get("args", {})
        if not isinstance(args, dict):
            raise ValueError(f"replay_actions[{i}].args must be an object")
        calls.append(ToolCall(item["app"], item["api"], args))
    return calls


class ReplayPolicy:
    def __init__(self, tokenizer: Tokenizer, actions: Sequence[ToolCall], name: str = "replay") -> None:
        self.tokenizer = tokenizer
        self.name = name
        turns = [*(render_action(a) for a in actions), render_action(DONE)]
        self._encoded = [list(tokenizer.encode(t, add_special_tokens=False)) for t in turns]
        eos = tokenizer.eos_token_id
        self._eos = int(eos[0] if isinstance(eos, list) else eos)
        self._next: dict[str | None, int] = defaultdict(int)
        self._adapters: set[str] = set()
        self._lock = threading.Lock()  # worker threads share one policy

    @classmethod
    def from_settings(cls, settings: Settings) -> ReplayPolicy:
        from agentloop.policy.models import load_tokenizer

        tokenizer = load_tokenizer(settings.model, settings.models_dir)
        return cls(tokenizer, parse_actions(settings.replay_actions), name=f"replay:{settings.model_name}")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        with self._lock:
            for req in requests:
                turn = min(self._next[req.key], len(self._encoded) - 1)  # past the script: complete, again
                self._next[req.key] += 1
                ids = [*self._encoded[turn][: max(0, req.max_new_tokens - 1)], self._eos]
                out.append(Generation(ids, None, "stop", self.tokenizer.decode(ids, skip_special_tokens=True)))
        return out

    def load_adapter(self, name: str, path: str) -> None:
        self._adapters.add(name)  # no weights to load: the turns are the same whatever adapter is asked for

    def unload_adapter(self, name: str) -> None:
        self._adapters.discard(name)

    def loaded_adapters(self) -> set[str]:
        return set(self._adapters)

    def end_episode(self, key: str) -> None:
        with self._lock:
            self._next.pop(key, None)
