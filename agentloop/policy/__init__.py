"""Inference backends behind one interface (`Policy`); `get_policy` builds the configured one once
per process."""

from __future__ import annotations

import threading

from agentloop.policy.base import Generation, GenerationRequest, Policy
from agentloop.settings import Settings, get_settings

_policy: Policy | None = None
_lock = threading.Lock()


def get_policy(settings: Settings | None = None) -> Policy:
    global _policy
    with _lock:
        if _policy is None:
            settings = settings or get_settings()
            if settings.policy_backend == "replay":
                from agentloop.policy.replay import ReplayPolicy

                _policy = ReplayPolicy.from_settings(settings)
            elif settings.policy_backend == "remote":
                from agentloop.policy.remote import RemotePolicy

                _policy = RemotePolicy.from_settings(settings)
            else:
                from agentloop.policy.local import LocalPolicy

                _policy = LocalPolicy.from_settings(settings)
        return _policy


def set_policy(policy: Policy | None) -> None:
    """Install a policy for this process (the learner shares its own model with rollouts)."""
    global _policy
    with _lock:
        _policy = policy


__all__ = ["Generation", "GenerationRequest", "Policy", "get_policy", "set_policy"]
