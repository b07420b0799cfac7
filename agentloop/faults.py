"""Crash points for recovery tests: with AGENTLOOP_CRASH_AT=<name> the process kills itself with
SIGKILL (as `kill -9` would) when it reaches `crash_point(<name>)`. Unset, they do nothing."""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    if os.environ.get("AGENTLOOP_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
