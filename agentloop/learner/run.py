"""The entry point of a training run: claim it, hold its lease while the trainer works, and record how
it ended. `agentloop learn` runs this in the foreground; the Celery `train` task runs it for
POST /v1/admin/train and for the beat trigger."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from agentloop import events
from agentloop.learner.config import LoopConfig
from agentloop.learner.rl import LoopTrainer
from agentloop.learner.sft import SftTrainer
from agentloop.learner.stepagent_trainer import StepAgentTrainer
from agentloop.learner.trainer import Cancellation, Report, RunStopped
from agentloop.settings import Settings
from agentloop.store import training_runs
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun, TrainingRunStatus

log = logging.getLogger(__name__)


class AgentTrainer(LoopTrainer, SftTrainer, StepAgentTrainer):
    """Every algorithm's iteration over the shared phases: what a run uses, so that a recipe's phases
    (sft, then stepagent, then loop+step) run in one run on one model and optimizer."""


class RunHeartbeat(threading.Thread):
    """Renews the run's lease every heartbeat_s, and notices within a second a cancel request or a lease
    that is not ours any more (the sweeper gave the run up): the trainer then stops at its next safe point."""

    CANCEL_POLL_S = 1.0

    def __init__(self, run_id: str, owner: str, settings: Settings, cancellation: Cancellation) -> None:
        super().__init__(daemon=True, name=f"run-heartbeat-{run_id[:8]}")
        self.run_id, self.owner, self.settings, self.cancellation = run_id, owner, settings, cancellation
        self.stop_event = threading.Event()

    def run(self) -> None:
        last_renewal = time.monotonic()
        while not self.stop_event.wait(min(self.CANCEL_POLL_S, self.settings.heartbeat_s)):
            try:
                with session_scope() as s:
                    if time.monotonic() - last_renewal >= self.settings.heartbeat_s:
                        training_runs.renew_lease(s, self.run_id, self.owner, self.settings.lease_s)
                        last_renewal = time.monotonic()
                    stop = training_runs.stop_reason(s, self.run_id, self.owner)
            except Exception as exc:  # retried next period; the lease outlives several
                log.warning("heartbeat of training run %s failed: %s", self.run_id, exc)
                continue
            if stop is not None:
                self.cancellation.request(*stop)
                if stop[1]:
                    return


def db_reporter(run_id: str) -> Report:
    """Progress into the run's row (its last report) and onto the run's event channel (every report)."""

    def report(progress: dict[str, Any]) -> None:
        training_runs.set_progress(run_id, {k: v for k, v in progress.items() if k != "metrics"})
        events.publish(
            events.run_channel(run_id),
            {"type": "progress", **{k: v for k, v in progress.items() if isinstance(v, int | float | str)}},
        )

    return report


def run_training(
    run_id: str,
    owner: str,
    settings: Settings,
    report: Report | None = None,
    cancellation: Cancellation | None = None,
) -> str:
    """Claim the run, train, and record the outcome. Returns finished | failed | cancelled | lease_lost |
    not_claimed. `cancellation` lets the caller stop the run too (`agentloop learn` on a signal).
    Under `accelerate launch` / torchrun every process calls this: the main one claims the run,
    samples, stores, evaluates and reports; the others join the updates."""
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    cancellation = cancellation or Cancellation()
    if state.num_processes > 1:
        return _run_distributed(run_id, owner, settings, report, state, cancellation)
    run = training_runs.claim_run(run_id, owner, settings.lease_s)
    if run is None:
        return "not_claimed"
    return _run_claimed(run, owner, settings, report, cancellation)


def run_config(run: TrainingRun) -> LoopConfig:
    return LoopConfig.for_algo(run.config.get("algo", run.algo), **{k: v for k, v in run.config.items() if k != "algo"})


def _run_distributed(
    run_id: str, owner: str, settings: Settings, report: Report | None, state: Any, cancellation: Cancellation
) -> str:
    from accelerate.utils import broadcast_object_list

    claimed: list[Any] = [None]
    if state.is_main_process:
        claimed = [training_runs.claim_run(run_id, owner, settings.lease_s)]
    broadcast_object_list(claimed, from_process=0)
    if claimed[0] is None:
        return "not_claimed"
    if state.is_main_process:
        return _run_claimed(claimed[0], owner, settings, report, cancellation)
    config = run_config(claimed[0])
    trainer = AgentTrainer(settings, config, run_id)  # stops when the main process does
    try:
        trainer.run(trainer.setup())
    except RunStopped:
        return "cancelled"
    return "finished"


def _run_claimed(
    run: TrainingRun, owner: str, settings: Settings, report: Report | None, cancellation: Cancellation
) -> str:
    run_id = run.id
    to_db = db_reporter(run_id)

    def both(progress: dict[str, Any]) -> None:
        to_db(progress)
        if report is not None:
            report(progress)

    heartbeat = RunHeartbeat(run_id, owner, settings, cancellation)
    heartbeat.start()
    try:
        config = run_config(run)
        trainer = AgentTrainer(settings, config, run_id, report=both, cancellation=cancellation, owner=owner)
        trainer.run(trainer.setup())
    except RunStopped as stop:
        return _record_stop(run_id, owner, stop)
    except Exception as exc:
        log.exception("training run %s failed", run_id)
        training_runs.end_run(run_id, owner, TrainingRunStatus.FAILED, f"{type(exc).__name__}: {exc}")
        events.publish(events.run_channel(run_id), {"type": "done"})
        return "failed"
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: this process stops now, wherever it was
        why = cancellation.reason or f"the learner process was interrupted ({type(exc).__name__})"
        _record_stop(run_id, owner, RunStopped(why, "at once, in the middle of its current step"))
        raise
    finally:
        heartbeat.stop_event.set()
    training_runs.end_run(run_id, owner, TrainingRunStatus.FINISHED)
    events.publish(events.run_channel(run_id), {"type": "done"})
    return "finished"


def _record_stop(run_id: str, owner: str, stop: RunStopped) -> str:
    """The run stopped at a safe point: record it as cancelled (a run whose lease another learner or the
    sweeper holds now is theirs to record)."""
    if stop.lease_lost:
        log.warning("training run %s: %s", run_id, stop)
        return "lease_lost"
    log.info("training run %s: %s", run_id, stop)
    kept = "; nothing of that iteration was kept" if stop.where.startswith(("in iteration", "at once")) else ""
    training_runs.record_stopped(run_id, owner, f"{stop}{kept}", stop.where)
    events.publish(events.run_channel(run_id), {"type": "done"})
    return "cancelled"
