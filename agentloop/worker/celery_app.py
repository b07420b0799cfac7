"""The Celery application. Queues: `episodes` (served tasks), `rollouts` (learner rollouts),
`learner` (training iterations), `maintenance` (lease sweeps).

Start a worker with `agentloop worker` (or `celery -A agentloop.worker.celery_app worker`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue, pools

from agentloop.settings import Settings, get_settings
from agentloop.worker import presence

QUEUES = ("episodes", "rollouts", "learner", "maintenance")
log = logging.getLogger(__name__)


def create_celery(settings: Settings) -> Celery:
    app = Celery("agentloop", include=["agentloop.worker.tasks"])
    configure(app, settings)
    return app


def configure(app: Celery, settings: Settings) -> None:
    """(Re)apply settings to the app; drops pooled broker connections made under older settings."""
    # kombu's SQL transport hands its options to create_engine, so it gets none; it has no visibility
    # timeout either (the lease sweeper recovers its lost messages).
    transport: dict[str, Any] = (
        {} if settings.broker_is_embedded else {"visibility_timeout": settings.visibility_timeout_s}
    )
    app.conf.update(
        broker_url=settings.broker,
        # Postgres is the system of record: no result backend, results are rows.
        task_ignore_result=True,
        result_backend=None,
        # A message is acked only after its task ran; a worker that dies mid-task has it redelivered.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_queues=[Queue(q, Exchange(q, type="direct"), routing_key=q) for q in QUEUES],
        task_default_queue="episodes",
        task_routes={
            "agentloop.run_episode": {"queue": "episodes"},
            "agentloop.sweep_leases": {"queue": "maintenance"},
            "agentloop.maybe_train": {"queue": "maintenance"},
            "agentloop.train": {"queue": "learner"},
            "agentloop.rollout": {"queue": "rollouts"},
        },
        beat_schedule={
            "sweep-leases": {
                "task": "agentloop.sweep_leases",
                "schedule": float(settings.sweep_interval_s),
                "options": {"expires": float(settings.sweep_interval_s)},  # a missed sweep is not worth a backlog
            },
            "maybe-train": {
                "task": "agentloop.maybe_train",
                "schedule": float(settings.train_check_interval_s),
                "options": {"expires": float(settings.train_check_interval_s)},
            },
        },
        worker_hijack_root_logger=False,
        # stdout/stderr stay the process's own: progress bars (model loading) and prints are not turned
        # into log records (Celery's default logs each write as `WARNING celery.redirected`)
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        enable_utc=True,
    )
    if settings.broker_is_embedded:
        settings.ensure_home()  # the broker's SQLite file lives there
    if app._pool is not None:
        pools.reset()  # close and forget kombu's process-wide pools built for the old broker
        app._pool = None
        app.amqp._producer_pool = None


def declare_queues(celery: Celery, attempts: int = 5) -> None:
    """Create every queue in the broker now. kombu's SQL transport creates a queue's row on first use
    with a check-then-insert that only a lock inside one process guards: the API publishing a task while
    the worker starts consuming can insert the same row twice, and the worker that loses exits at
    start-up. Declared once before they start, the rows exist and nobody inserts; an attempt that loses
    such a race itself is retried (the next one finds the row)."""
    for attempt in range(1, attempts + 1):
        try:
            with celery.connection_for_write() as conn:
                channel = conn.default_channel
                for queue in celery.conf.task_queues:
                    queue.bind(channel).declare()
            return
        except Exception as exc:  # the transport's own error types differ by broker
            if attempt == attempts:
                raise
            log.warning("declaring the broker's queues failed (%s); retrying", exc)
            time.sleep(0.2 * attempt)


@signals.worker_ready.connect
def _announce_worker(sender: Any, **_: Any) -> None:
    """The worker consumes now: /readyz counts it (see presence.py)."""
    presence.announce(sorted(q.name for q in sender.task_consumer.queues), get_settings())


@signals.beat_init.connect
def _one_beat(**_: Any) -> None:
    """One beat per home at a time (a second waits for the first to stop)."""
    from agentloop.worker.lifeline import hold_beat_lock

    hold_beat_lock(get_settings().home.resolve())


@signals.beat_embedded_init.connect
def _beat_dies_with_its_worker(**_: Any) -> None:
    """The beat a worker runs (`--beat`) is its child: it stops when the worker does, killed or not, so a
    restarted worker never adds a second one."""
    from agentloop.worker.lifeline import die_with_parent

    die_with_parent()


@signals.worker_shutdown.connect
def _withdraw_worker(**_: Any) -> None:
    presence.withdraw()


app = create_celery(get_settings())
