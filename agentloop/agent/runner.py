"""Run one served task: lease it, build its world, pin the adapter, run the episode while persisting
and publishing each step, evaluate, reward. Called by the Celery `run_episode` task."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from agentloop import events
from agentloop.agent.episode import Episode, Limits, Turn, run_episodes
from agentloop.agent.evaluate import Evaluator
from agentloop.agent.examples import example_for
from agentloop.agent.external_episode import ExternalEpisode, start_external_episode
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.external import free_instruction_refusal, split_task_ref
from agentloop.apps.registry import get_world
from agentloop.apps.remote_env import EnvironmentFailure
from agentloop.apps.world import World
from agentloop.learner.adapters import verify_files
from agentloop.policy.base import Policy
from agentloop.settings import Settings
from agentloop.store import adapters as adapter_store
from agentloop.store import apps as app_store
from agentloop.store import episodes as episode_store
from agentloop.store import tasks as task_store
from agentloop.store.db import session_scope
from agentloop.store.models import Episode as EpisodeRow
from agentloop.store.models import Task, TaskStatus

log = logging.getLogger(__name__)

TRANSIENT = (OperationalError,)  # the database went away: give the task back and retry


class Heartbeat(threading.Thread):
    """Renews the task's lease while the episode runs, and notices cancellation (within a second)
    and a lost lease."""

    CANCEL_POLL_S = 1.0

    def __init__(self, task_id: str, owner: str, settings: Settings) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{task_id[:8]}")
        self.task_id, self.owner, self.settings = task_id, owner, settings
        self.stop_event = threading.Event()
        self.cancelled = False
        self.lost = False

    def run(self) -> None:
        last_renewal = time.monotonic()
        while not self.stop_event.wait(min(self.CANCEL_POLL_S, self.settings.heartbeat_s)):
            try:
                with session_scope() as s:
                    if time.monotonic() - last_renewal >= self.settings.heartbeat_s:
                        ours, cancel = task_store.renew_lease(s, self.task_id, self.owner, self.settings.lease_s)
                        last_renewal = time.monotonic()
                        self.lost = not ours
                    else:
                        cancel = task_store.cancel_requested(s, self.task_id)
            except Exception as exc:  # a missed beat is retried next period; the lease outlives several
                log.warning("heartbeat for task %s failed: %s", self.task_id, exc)
                continue
            self.cancelled = cancel
            if self.lost:
                return

    def reason_to_stop(self, _ep: Episode) -> str | None:
        if self.lost:
            return "lease_lost"
        return "cancelled" if self.cancelled else None


@dataclass
class Prepared:
    world: World
    evaluator: Evaluator | None
    external: ExternalEpisode | None = None  # the app's episode, for a task of an external app


def prepare_world(task: Task, settings: Settings) -> Prepared:
    """The task's world: built-in apps from its world provider, the tenant's registered apps attached;
    an external task ("<app>:<ref>") is reset in the app first and evaluated by it afterwards."""
    provider = get_world(task.world)
    with session_scope() as s:
        registered = {
            row.name: app_store.to_external(row, settings.secret_key)
            for row in app_store.list_apps(s, task.tenant_id)
            if row.name in task.apps
        }
    if not task.task_ref:  # refused at submission; this stops a task queued before that rule
        for app in registered.values():
            if app.environment() is not None:
                raise ValueError(free_instruction_refusal(app.name))
    external_ref = split_task_ref(task.task_ref) if task.task_ref else None
    evaluator: Evaluator | None = None
    external: ExternalEpisode | None = None
    if external_ref and external_ref[0] in registered:
        world = provider.new_world(int(task.options.get("seed", 0)), [])
        external = start_external_episode(registered.pop(external_ref[0]), external_ref[1], world)
        evaluator = external.evaluator
    elif task.task_ref:
        world = provider.task_world(task.task_ref)
        evaluator = provider.task(task.task_ref).evaluator
    else:
        world = provider.new_world(int(task.options.get("seed", 0)), [a for a in task.apps if a not in registered])
    for app in registered.values():
        world.attach(app.spec())
    return Prepared(world, evaluator, external)


@dataclass(frozen=True)
class _Version:
    id: int
    name: str
    path: str
    sha256: str
    owner: str | None


DAMAGE_RECHECK_S = 30.0  # a version found damaged is checked again (its files may be restored) this often


class AdapterPins:
    """Which adapters running episodes use. An episode pins the version its tenant is served when it starts
    (the tenant's active one, else the shared one, else none: `store.adapters.serving_adapter`) and keeps it
    to its end (a promotion never changes a running episode). Several tenants' versions are held side by side;
    a served version no episode runs on is unloaded once no owner has it active any more, or when more than
    `max_adapters` are held (least recently used first). Adapters loaded by others (a rollout job's weights)
    are theirs to unload.

    A version is verified (its files present, their sha256 as written) before it is loaded. One that fails is
    damaged: the episode runs on the next of `store.adapters.serving_chain` (the owner's previous good version,
    the shared one, at last the base model), the reason is logged and stored on the version (`/readyz`,
    `/metrics`), and the version is tried again after DAMAGE_RECHECK_S.

    The version is read from the database when an episode starts; `follow` also loads a version as soon as
    its activation is announced, so the first episode after a switch does not wait for the load."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: Counter[str] = Counter()
        self._served: OrderedDict[str, None] = OrderedDict()  # loaded by these pins, least recently used first
        self._damaged: dict[str, tuple[str, float]] = {}  # name -> (why, when found: time.monotonic())
        self._listener: events.Listener | None = None

    def pin(self, policy: Policy, settings: Settings, tenant_id: str | None = None) -> str | None:
        return self._load_active(policy, settings, tenant_id, pin=True)

    def preload(self, policy: Policy, settings: Settings, tenant_id: str | None = None) -> str | None:
        """Load the version `tenant_id` (None: the shared one) is served now, and unload served ones no episode
        uses and no owner has active; pins nothing."""
        return self._load_active(policy, settings, tenant_id, pin=False)

    def _load_active(self, policy: Policy, settings: Settings, tenant_id: str | None, pin: bool) -> str | None:
        with session_scope() as s:
            chain = [
                _Version(row.id, row.name, row.path, row.sha256, row.tenant_id)
                for row in adapter_store.serving_chain(s, settings.model_name, tenant_id)
            ]
            live = adapter_store.active_names(s, settings.model_name)
        found: list[tuple[_Version, str | None]] = []  # what loading learnt: (version, why damaged | None)
        with self._lock:
            chosen = None
            for version in chain:
                why = self._load(policy, version)
                if why is None:
                    chosen = version.name
                    if self._damaged.pop(version.name, None) is not None:
                        found.append((version, None))  # its files verify again
                    break
                if why:
                    found.append((version, why))
            if any(why for _, why in found):
                log.warning(
                    "adapter %s cannot be served (%s); episodes of %s run on %s",
                    chain[0].name,
                    self._damaged[chain[0].name][0],
                    f"tenant {tenant_id}" if tenant_id else "the deployment",
                    chosen or "the base model",
                )
            if chosen is not None:
                self._served[chosen] = None
                self._served.move_to_end(chosen)
                if pin:
                    self._count[chosen] += 1
            idle = [n for n in self._served if n != chosen and not self._count[n]]
            over = len(self._served) - settings.max_adapters
            for unused in idle:
                if unused not in live or over > 0:
                    policy.unload_adapter(unused)
                    del self._served[unused]
                    over -= 1
        if found:
            with session_scope() as s:
                for version, why in found:
                    adapter_store.record_damage(s, version.id, why)
        return chosen

    def _load(self, policy: Policy, version: _Version) -> str | None:
        """None when `version` is loaded now; why it cannot be: a new finding (to record), or "" when it was
        found damaged less than DAMAGE_RECHECK_S ago (already recorded). Under the lock."""
        if version.name in policy.loaded_adapters():
            return None  # in memory: whatever happened to its files since
        known = self._damaged.get(version.name)
        if known is not None and time.monotonic() - known[1] < DAMAGE_RECHECK_S:
            return ""
        try:
            verify_files(version.name, version.path, version.sha256)
            policy.load_adapter(version.name, version.path)
        except Exception as exc:  # missing, changed or unloadable files: the next version serves
            why = str(exc) if isinstance(exc, (FileNotFoundError, ValueError)) else f"{type(exc).__name__}: {exc}"
            fresh = known is None or known[0] != why
            self._damaged[version.name] = (why, time.monotonic())
            return why if fresh else ""
        return None

    def follow(self, policy: Policy, settings: Settings) -> events.Listener | None:
        """Preload each version as its activation is announced (Redis pub/sub), from a thread of this
        process; once per process, later calls return the same listener. Without Redis nothing is
        announced and None is returned: the next episode's pin finds the new version in the database."""
        url = settings.events_redis_url
        if not url:
            return None

        def on_notice(notice: dict[str, Any] | None) -> None:
            if notice is None or notice.get("base_model") == settings.model_name:
                self.preload(policy, settings, (notice or {}).get("tenant_id"))

        with self._lock:
            if self._listener is None:
                self._listener = events.Listener(events.ADAPTERS_CHANNEL, url, on_notice)
                self._listener.start()
            return self._listener

    def release(self, name: str | None) -> None:
        if name is None:
            return
        with self._lock:
            self._count[name] -= 1

    def pinned(self) -> dict[str, int]:
        with self._lock:
            return dict(+self._count)


PINS = AdapterPins()


def pin_adapter(policy: Policy, settings: Settings, tenant_id: str | None = None) -> str | None:
    """The adapter `tenant_id`'s episode starting now runs on, loaded into the policy if needed; the caller
    releases it with `PINS.release` when the episode ends."""
    return PINS.pin(policy, settings, tenant_id)


def run_served_task(task_id: str, owner: str, policy: Policy, settings: Settings) -> str:
    """Returns what happened: not_claimed | finished | failed | cancelled | lease_lost | retrying (the
    app's evaluation met an outage: the task is queued again, for a new attempt)."""
    with session_scope() as s:
        task = task_store.claim_task(s, task_id, owner, settings.lease_s)
        if task is None:
            return "not_claimed"
        task_store.abandon_running_episodes(s, task_id, "worker_lost")
        attempt = task.attempts
        if attempt > settings.max_attempts:
            last = f"; the last: {task.error}" if task.error else ""
            task_store.finish_task(
                s, task_id, owner, TaskStatus.FAILED, error=f"gave up after {settings.max_attempts} attempts{last}"
            )
            events.publish(events.task_channel(task_id), {"type": "status"})
            return "failed"
        s.expunge(task)
    events.publish(events.task_channel(task_id), {"type": "status"})

    try:
        prepared = prepare_world(task, settings)
        try:
            adapter = pin_adapter(policy, settings, task.tenant_id)
        except BaseException:
            _end_app_episode(prepared)
            raise
    except TRANSIENT:
        _release(task_id, owner, "database unavailable while starting; retrying")
        raise
    except EnvironmentFailure as exc:  # its reset failed: refused, or down through every try (settings)
        log.warning("task %s could not start: %s", task_id, exc.message)
        _fail(task_id, owner, None, f"could not start the episode: {exc.message}")
        return "failed"
    except Exception as exc:
        log.exception("task %s could not start", task_id)
        _fail(task_id, owner, None, f"could not start the episode: {exc}")
        return "failed"
    try:
        return _run_pinned(task, attempt, owner, policy, settings, prepared, adapter)
    finally:
        PINS.release(adapter)
        _end_app_episode(prepared)


def _end_app_episode(prepared: Prepared) -> None:
    """However the episode ended (finished, cancelled, failed, lost), the app may free its state, and so may
    the world (a text world's simulator goes back to its pool)."""
    try:
        if prepared.external is not None:
            prepared.external.environment.release()
    finally:
        prepared.world.close()


def _run_pinned(
    task: Task, attempt: int, owner: str, policy: Policy, settings: Settings, prepared: Prepared, adapter: str | None
) -> str:
    task_id = task.id
    opts: dict[str, Any] = task.options
    limits = Limits.from_settings(settings, max_turns=opts.get("max_turns"), temperature=opts.get("temperature"))
    example = example_for(task.world, task.instruction, prepared.world.available)
    episode = Episode(
        prepared.world,
        ChatFormat(policy.tokenizer),
        task.instruction,
        limits,
        adapter=adapter,
        key=task_id,
        example=example,
    )
    before = prepared.world.copy_state()
    with session_scope() as s:
        row = EpisodeRow(
            task_id=task_id,
            attempt=attempt,
            kind="served",
            world=task.world,
            task_ref=task.task_ref,
            seed=prepared.world.seed,
            instruction=task.instruction,
            policy=policy.name,
            adapter=adapter,
            prompt_token_ids=episode.prompt_token_ids,
        )
        s.add(row)
        s.flush()
        episode_id = row.id
        s.execute(sa.update(Task).where(Task.id == task_id).values(adapter=adapter))

    def persist(_ep: Episode, turn: Turn) -> None:
        with session_scope() as s:
            episode_store.add_step(s, episode_id, turn)
        events.publish(events.task_channel(task_id), {"type": "step", "index": turn.index})

    heartbeat = Heartbeat(task_id, owner, settings)
    heartbeat.start()
    try:
        run_episodes(policy, [episode], on_turn=persist, should_stop=heartbeat.reason_to_stop)
    except TRANSIENT:
        heartbeat.stop_event.set()
        _release(task_id, owner, "database unavailable during the episode; retrying")
        raise
    except Exception as exc:
        heartbeat.stop_event.set()
        log.exception("episode of task %s failed", task_id)
        _fail(task_id, owner, episode_id, f"episode failed: {type(exc).__name__}: {exc}")
        return "failed"
    except BaseException:
        heartbeat.stop_event.set()
        raise

    try:  # the lease is still renewed while the app evaluates: its tries may outlast a lease
        if episode.finish_reason == "lease_lost":
            with session_scope() as s:
                episode_store.finish_episode(s, episode_id, "abandoned", "lease_lost")
            return "lease_lost"
        return _complete(task_id, attempt, owner, settings, episode_id, episode, prepared, before)
    finally:
        heartbeat.stop_event.set()


def _complete(
    task_id: str,
    attempt: int,
    owner: str,
    settings: Settings,
    episode_id: str,
    episode: Episode,
    prepared: Prepared,
    before: Any,
) -> str:
    world = prepared.world
    cancelled = episode.finish_reason == "cancelled"
    # A cancelled episode was cut short by the client, not ended by the agent: scoring its unfinished
    # state would report (and train on) a reward for work the agent was not allowed to finish.
    evaluator = None if cancelled else prepared.evaluator
    try:
        verdict = evaluator.evaluate(before, world.state, world.answer) if evaluator else None
    except EnvironmentFailure as exc:
        return _not_evaluated(task_id, attempt, owner, settings, episode_id, episode, exc)
    with session_scope() as s:
        episode_store.finish_episode(s, episode_id, "finished", episode.finish_reason, answer=world.answer)
        if verdict is not None:
            episode_store.add_reward(
                s,
                source="evaluator",
                value=verdict.reward,
                success=verdict.success,
                episode_id=episode_id,
                task_id=task_id,
                details=verdict.to_dict(),
            )
        status = TaskStatus.CANCELLED if cancelled else TaskStatus.FINISHED
        task_store.finish_task(
            s,
            task_id,
            owner,
            status,
            answer=world.answer,
            reward=verdict.reward if verdict else None,
            success=verdict.success if verdict else None,
        )
    events.publish(events.task_channel(task_id), {"type": "done"})
    return status


def _not_evaluated(
    task_id: str,
    attempt: int,
    owner: str,
    settings: Settings,
    episode_id: str,
    episode: Episode,
    exc: EnvironmentFailure,
) -> str:
    """The app could not score the episode: the episode is an error with the reason and no reward (never a
    zero: an outage says nothing of the agent), so no TGC, reward or training counts it. An outage, or an
    episode the app lost, gives the task a new attempt (reset afresh) while attempts remain."""
    answer = episode.world.answer
    retry = exc.retryable and attempt < settings.max_attempts
    reason = f"attempt {attempt} was not evaluated: {exc.message}; no reward recorded"
    with session_scope() as s:
        episode_store.finish_episode(s, episode_id, "failed", episode.finish_reason, answer=answer, error=exc.message)
        if retry:
            note = f"{reason}; retrying as attempt {attempt + 1} in {settings.app_retry_after_s} s"
            task_store.release_task(s, task_id, owner, note)
        else:
            gave_up = f"; gave up after {attempt} attempts" if exc.retryable else ""
            task_store.finish_task(s, task_id, owner, TaskStatus.FAILED, error=reason + gave_up, answer=answer)
    log.warning("task %s: %s", task_id, reason)
    events.publish(events.task_channel(task_id), {"type": "status" if retry else "done"})
    return "retrying" if retry else TaskStatus.FAILED


def _release(task_id: str, owner: str, note: str) -> None:
    log.warning("task %s given back to the queue: %s", task_id, note)
    try:
        with session_scope() as s:
            task_store.release_task(s, task_id, owner, note)
            task_store.abandon_running_episodes(s, task_id, "transient_error")
    except Exception as exc:  # the sweeper re-queues it once the lease expires
        log.warning("could not release task %s: %s", task_id, exc)


def _fail(task_id: str, owner: str, episode_id: str | None, error: str) -> None:
    with session_scope() as s:
        if episode_id is not None:
            episode_store.finish_episode(s, episode_id, "failed", "error", error=error)
        task_store.finish_task(s, task_id, owner, TaskStatus.FAILED, error=error)
    events.publish(events.task_channel(task_id), {"type": "done"})
