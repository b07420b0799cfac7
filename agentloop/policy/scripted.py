"""A policy that replays prepared turns per episode: the oracle (expert solutions of built-in tasks)
and any recorded demonstration. Its turns are not sampled, so it reports no log-probs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from agentloop.agent.actions import TOOL_CALLS, ActionSpace, render_action
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.tasks import ToolCall, run_oracle
from agentloop.policy.base import Generation, GenerationRequest, Tokenizer

GIVE_UP = ToolCall("supervisor", "complete_task", {})


class ScriptedPolicy:
    def __init__(self, tokenizer: Tokenizer, name: str = "scripted") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self._plans: dict[str, list[str]] = {}
        self._turn: dict[str, int] = defaultdict(int)
        eos = tokenizer.eos_token_id
        self._eos = int(eos[0] if isinstance(eos, list) else eos)

    def plan(self, key: str, turns: Sequence[str]) -> None:
        self._plans[key] = list(turns)
        self._turn[key] = 0

    def plan_actions(self, key: str, actions: Sequence[ToolCall], space: ActionSpace = TOOL_CALLS) -> None:
        self.plan(key, [space.render(a) for a in actions])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for req in requests:
            if req.key is None or req.key not in self._plans:
                raise KeyError(f"{self.name} policy has no plan for episode key {req.key!r}")
            i = self._turn[req.key]
            self._turn[req.key] += 1
            plan = self._plans[req.key]
            text = plan[i] if i < len(plan) else render_action(GIVE_UP)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if len(ids) >= req.max_new_tokens:
                ids = ids[: req.max_new_tokens]
                out.append(Generation(ids, None, "length", self.tokenizer.decode(ids, skip_special_tokens=True)))
            else:
                out.append(Generation([*ids, self._eos], None, "stop", text))
        return out

    def load_adapter(self, name: str, path: str) -> None:
        raise ValueError(f"the {self.name} policy replays fixed turns; it cannot load adapters")

    def unload_adapter(self, name: str) -> None:
        return None

    def loaded_adapters(self) -> set[str]:
        return set()

    def end_episode(self, key: str) -> None:
        return None


def oracle_policy(tokenizer: Tokenizer) -> ScriptedPolicy:
    return ScriptedPolicy(tokenizer, name="oracle")


def plan_oracle(policy: ScriptedPolicy, key: str, task_ref: str) -> None:
    """Solve the built-in task on a scratch copy of its world and queue the expert's calls."""
    task = BUILTIN.task(task_ref)
    policy.plan_actions(key, run_oracle(task, BUILTIN.task_world(task_ref)).actions)
