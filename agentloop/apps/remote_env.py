"""The environment protocol of an external app: `agentloop_tasks` lists its tasks, `agentloop_reset`
gives a fresh episode of one (every later request carries `Agentloop-Episode`), `agentloop_evaluate`
scores it, and `agentloop_release` (optional) tells the app the episode is over. An app that declares
reset and evaluate can be evaluated and trained on.

An app that cannot take part (unreachable, too slow, 5xx, an episode it no longer knows, a bad answer)
raises `EnvironmentFailure`: the episode is then an error, never a zero reward (docs/apps.md)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from agentloop.apps.base import ApiError
from agentloop.apps.evaluation import TestResult, Verdict
from agentloop.apps.openapi import EVALUATE_OP, RELEASE_OP, RESET_OP, TASKS_OP, Operation
from agentloop.apps.remote_http import AppUnreachable, RemoteClient, call_operation
from agentloop.apps.world import WorldState
from agentloop.settings import Settings, get_settings

log = logging.getLogger(__name__)


class EnvironmentFailure(ApiError):
    """The app could not list its tasks, reset or evaluate an episode. `retryable`: an outage (it could not
    be reached, timed out or answered 5xx on every try) or an episode it no longer knows (it restarted),
    which a later attempt, reset afresh, may not meet; otherwise it refused (4xx) or answered badly."""

    def __init__(self, status: int, message: str, retryable: bool) -> None:
        super().__init__(status, message)
        self.retryable = retryable


@dataclass(frozen=True)
class ControlLimits:
    """How the agentloop_* operations are called (settings `app_control_*`, `app_release_timeout_s`)."""

    attempts: int = 4  # tries of an outage; a 4xx answer is never tried again
    backoff_s: float = 0.5  # before the second try, doubled before each later one
    timeout_s: float = 15.0  # deadline of each try (an agent's call gets HttpLimits.total_s, 10 s)
    release_timeout_s: float = 2.0  # release is best effort: sent once, never waited on for long

    @classmethod
    def from_settings(cls, s: Settings) -> ControlLimits:
        return cls(s.app_control_attempts, s.app_control_backoff_s, s.app_control_timeout_s, s.app_release_timeout_s)


def _configured_limits() -> ControlLimits:
    return ControlLimits.from_settings(get_settings())


@dataclass
class RemoteEnvironment:
    """An external app usable for evaluation and training."""

    operations: dict[str, Operation]
    client: RemoteClient  # shared with the app's APIs in the episode's world: reset sets its episode
    name: str = "app"
    limits: ControlLimits = field(default_factory=_configured_limits)

    @classmethod
    def of(cls, operations: list[Operation], client: RemoteClient, name: str = "app") -> RemoteEnvironment | None:
        ops = {o.operation_id: o for o in operations}
        return cls(ops, client, name) if RESET_OP in ops and EVALUATE_OP in ops else None

    def tasks(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The tasks the app offers. One try: whoever asks (a submission, `agentloop eval`, a learner
        starting) is told at once that the app is down, and no episode is lost."""
        if TASKS_OP not in self.operations:
            raise EnvironmentFailure(404, f"app {self.name!r} declares no {TASKS_OP} operation", retryable=False)
        value = self._control(TASKS_OP, {}, attempts=1, timeout_s=timeout_s)
        if not isinstance(value, list) or not all(isinstance(t, dict) and "task_ref" in t for t in value):
            raise EnvironmentFailure(
                502, f"app {self.name!r}: {TASKS_OP} must return a list of {{task_ref, instruction, split}}", False
            )
        return value

    def reset(self, task_ref: str) -> str:
        """A fresh episode of `task_ref`; from now on every request through the client carries its id."""
        self.client.episode = None
        value = self._control(RESET_OP, self._body(RESET_OP, {"task_ref": task_ref}))
        if not isinstance(value, dict) or not isinstance(value.get("episode"), str):
            raise EnvironmentFailure(502, f'app {self.name!r}: {RESET_OP} must return {{"episode": str}}', False)
        self.client.episode = value["episode"]
        return value["episode"]

    def evaluate(self, task_ref: str, answer: str | None) -> tuple[int, int]:
        args = {"task_ref": task_ref, "answer": answer}
        try:
            value = self._control(EVALUATE_OP, self._body(EVALUATE_OP, args))
        except EnvironmentFailure as exc:
            if exc.status != 404:
                raise
            # the app no longer knows the episode (it restarted): this attempt is lost, a fresh reset is not
            raise EnvironmentFailure(
                404, f"{exc.message} (episode {self.client.episode}: the app may have restarted)", retryable=True
            ) from None
        try:
            passed, total = int(value["passed"]), int(value["total"])
        except (TypeError, KeyError, ValueError):
            raise EnvironmentFailure(
                502, f'app {self.name!r}: {EVALUATE_OP} must return {{"passed": int, "total": int}}', False
            ) from None
        if total <= 0 or not 0 <= passed <= total:
            raise EnvironmentFailure(
                502, f"app {self.name!r}: {EVALUATE_OP} returned passed={passed}, total={total}", False
            )
        return passed, total

    def release(self) -> None:
        """The episode is over: tell the app (agentloop_release, when declared) so it frees the episode's
        state. Once per episode, one try with a short timeout; a failure is logged, never raised (an app
        should also expire episodes nobody releases: a worker may die before it can)."""
        episode, self.client.episode = self.client.episode, None
        if episode is None or RELEASE_OP not in self.operations:
            return
        client = replace(self._client(self.limits.release_timeout_s), episode=episode)
        try:
            call_operation(client, self.operations[RELEASE_OP], {})
        except ApiError as exc:
            log.warning("app %r did not release episode %s: %s", self.name, episode, exc)

    def _body(self, op_id: str, args: dict[str, Any]) -> dict[str, Any]:
        return args if self.operations[op_id].flat_body else {"body": args}

    def _client(self, timeout_s: float) -> RemoteClient:
        """The episode's client (same origin, header and checks) with `timeout_s` to connect and to answer."""
        limits = replace(self.client.limits, connect_s=min(self.client.limits.connect_s, timeout_s), total_s=timeout_s)
        return replace(self.client, limits=limits)

    def _control(
        self, op_id: str, args: dict[str, Any], attempts: int | None = None, timeout_s: float | None = None
    ) -> Any:
        """Call an agentloop_* operation, trying an outage again with exponential backoff."""
        attempts = attempts or self.limits.attempts
        client = self._client(timeout_s or self.limits.timeout_s)
        for attempt in range(1, attempts + 1):
            try:
                return call_operation(client, self.operations[op_id], args)
            except AppUnreachable as exc:
                if attempt == attempts:
                    tries = f" ({attempts} tries)" if attempts > 1 else ""
                    raise EnvironmentFailure(
                        exc.status, f"app {self.name!r}: {op_id}: {exc.message}{tries}", retryable=True
                    ) from None
                delay = self.limits.backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "app %r: %s failed (%s); try %d of %d in %.2g s",
                    self.name,
                    op_id,
                    exc,
                    attempt + 1,
                    attempts,
                    delay,
                )
                time.sleep(delay)
            except ApiError as exc:
                raise EnvironmentFailure(exc.status, f"app {self.name!r}: {op_id}: {exc.message}", False) from None
        raise AssertionError("unreachable: the last try returns or raises")


@dataclass
class RemoteEvaluator:
    """Evaluation done by the app itself (agentloop_evaluate), in the episode it was reset for."""

    environment: RemoteEnvironment
    task_ref: str

    def evaluate(self, before: WorldState, after: WorldState, answer: str | None) -> Verdict:
        """The app's verdict; raises EnvironmentFailure when the app cannot give one (never a zero reward)."""
        passed, total = self.environment.evaluate(self.task_ref, answer)
        return Verdict([TestResult(f"app test {i + 1} of {total}", i < passed) for i in range(total)])

    def release(self) -> None:
        self.environment.release()
