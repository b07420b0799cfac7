"""The environment protocol of an external app: `agentloop_tasks` lists its tasks, `agentloop_reset`
gives a fresh episode of one (every later request carries `Agentloop-Episode`), `agentloop_evaluate`
scores it. An app that declares reset and evaluate can be evaluated and trained on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentloop.apps.base import ApiError
from agentloop.apps.evaluation import TestResult, Verdict
from agentloop.apps.openapi import EVALUATE_OP, RESET_OP, TASKS_OP, Operation
from agentloop.apps.remote_http import RemoteClient, call_operation
from agentloop.apps.world import WorldState


@dataclass
class RemoteEnvironment:
    """An external app usable for evaluation and training."""

    operations: dict[str, Operation]
    client: RemoteClient

    @classmethod
    def of(cls, operations: list[Operation], client: RemoteClient) -> RemoteEnvironment | None:
        ops = {o.operation_id: o for o in operations}
        return cls(ops, client) if RESET_OP in ops and EVALUATE_OP in ops else None

    def tasks(self) -> list[dict[str, Any]]:
        if TASKS_OP not in self.operations:
            raise ApiError(404, f"the app declares no {TASKS_OP} operation")
        value = call_operation(self.client, self.operations[TASKS_OP], {})
        if not isinstance(value, list) or not all(isinstance(t, dict) and "task_ref" in t for t in value):
            raise ApiError(502, f"{TASKS_OP} must return a list of {{task_ref, instruction, split}}")
        return value

    def reset(self, task_ref: str) -> str:
        self.client.episode = None
        value = call_operation(
            self.client,
            self.operations[RESET_OP],
            {"task_ref": task_ref} if self.operations[RESET_OP].flat_body else {"body": {"task_ref": task_ref}},
        )
        if not isinstance(value, dict) or not isinstance(value.get("episode"), str):
            raise ApiError(502, f'{RESET_OP} must return {{"episode": str}}')
        self.client.episode = value["episode"]
        return value["episode"]

    def evaluate(self, task_ref: str, answer: str | None) -> tuple[int, int]:
        args = {"task_ref": task_ref, "answer": answer}
        value = call_operation(
            self.client,
            self.operations[EVALUATE_OP],
            args if self.operations[EVALUATE_OP].flat_body else {"body": args},
        )
        try:
            passed, total = int(value["passed"]), int(value["total"])
        except (TypeError, KeyError, ValueError):
            raise ApiError(502, f'{EVALUATE_OP} must return {{"passed": int, "total": int}}') from None
        if total <= 0 or not 0 <= passed <= total:
            raise ApiError(502, f"{EVALUATE_OP} returned passed={passed}, total={total}")
        return passed, total


@dataclass
class RemoteEvaluator:
    """Evaluation done by the app itself (agentloop_evaluate), in the episode it was reset for."""

    environment: RemoteEnvironment
    task_ref: str

    def evaluate(self, before: WorldState, after: WorldState, answer: str | None) -> Verdict:
        try:
            passed, total = self.environment.evaluate(self.task_ref, answer)
        except ApiError as exc:
            return Verdict([TestResult("the app evaluated the episode", False, str(exc))])
        return Verdict([TestResult(f"app test {i + 1} of {total}", i < passed) for i in range(total)])
