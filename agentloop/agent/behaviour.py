"""Behaviour metrics from the LOOP paper's analysis of what training changes in an agent: it reads
the API docs more, gives up less after a failed call, emits one action per turn, and stops making
things up. Computed from an episode's turns (live `Turn`s or stored `Step` rows alike)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentloop.agent.actions import parse_action

CONFABULATION = re.compile(r"\b(dummy|assum(e|es|ed|ing|ption))\b", re.IGNORECASE)


def _call(turn: Any) -> tuple[str, str] | None:
    action = turn.action
    if not action:
        return None
    return str(action.get("app")), str(action.get("api"))


def _failed(turn: Any) -> bool:
    """A call that was executed and answered with an error (not text that failed to parse)."""
    return turn.action is not None and turn.error_kind not in (None, "parse_error")


def _n_actions(turn: Any) -> int:
    n = getattr(turn, "n_actions", None)
    return int(n) if n is not None else len(parse_action(turn.output_text).actions)


def behaviour(episodes: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Each episode as its turns in order.

    api_docs_calls_per_episode   doc lookups: calls to the api_docs app that were answered (a call to an
                                 api_docs API, app or API that does not exist read no docs, so is left out)
    failed_calls_per_episode     calls answered with an error
    give_up_after_failure_rate   of the failed calls, those after which the agent tried nothing else
                                 (its next call ends the task, or there is no next turn)
    multi_action_turn_rate       turns with more than one call (only the first runs)
    confabulation_turn_rate      turns whose text says "dummy" or "assume..."
    """
    n_episodes = len(episodes) or 1
    turns = [t for ep in episodes for t in ep]
    n_turns = len(turns) or 1
    docs = failed = gave_up = 0
    for ep in episodes:
        for i, turn in enumerate(ep):
            call = _call(turn)
            docs += call is not None and call[0] == "api_docs" and turn.error_kind is None
            if not _failed(turn):
                continue
            failed += 1
            following = ep[i + 1] if i + 1 < len(ep) else None
            gave_up += following is None or _call(following) == ("supervisor", "complete_task")
    return {
        "api_docs_calls_per_episode": round(docs / n_episodes, 3),
        "failed_calls_per_episode": round(failed / n_episodes, 3),
        "give_up_after_failure_rate": round(gave_up / failed, 3) if failed else 0.0,
        "multi_action_turn_rate": round(sum(_n_actions(t) > 1 for t in turns) / n_turns, 3),
        "confabulation_turn_rate": round(sum(bool(CONFABULATION.search(t.output_text)) for t in turns) / n_turns, 3),
    }
