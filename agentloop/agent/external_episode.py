"""The start of an episode on an external app's task: reset the app (a fresh copy of the task's initial
state, its own `Agentloop-Episode`), attach the app to the episode's world, and build the evaluator that
asks the app to score that episode. The one place this happens, for served tasks (runner), `agentloop
eval --app` (eval_runs) and training rollouts (learner)."""

from __future__ import annotations

from dataclasses import dataclass

from agentloop.apps.external import ExternalApp
from agentloop.apps.remote_env import RemoteEnvironment, RemoteEvaluator
from agentloop.apps.world import World


class NotAnEnvironment(ValueError):
    """The app does not declare agentloop_reset and agentloop_evaluate: it has no tasks to reset."""


@dataclass
class ExternalEpisode:
    """One started episode of an app's task: the world it runs in, the app's environment (its client
    carries this episode's header) and the evaluator that scores it."""

    world: World
    environment: RemoteEnvironment
    evaluator: RemoteEvaluator
    episode: str  # the app's id of this episode (the Agentloop-Episode header)


def start_external_episode(app: ExternalApp, task_ref: str, world: World) -> ExternalEpisode:
    """Reset `app` for its task `task_ref` (the app's own ref, without "<app>:") and attach the app to
    `world`, which the caller built for the episode (without the app). Raises NotAnEnvironment, or the
    reset's ApiError when the app cannot be reached or answers badly."""
    episode_app = app.fork()  # a client of its own: K rollouts of one task never share an episode
    environment = episode_app.environment()
    if environment is None:
        raise NotAnEnvironment(f"app {app.name!r} declares no agentloop_reset and agentloop_evaluate operations")
    episode = environment.reset(task_ref)
    world.attach(episode_app.spec())
    return ExternalEpisode(world, environment, RemoteEvaluator(environment, task_ref), episode)
