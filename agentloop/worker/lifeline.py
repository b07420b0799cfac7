"""Processes that must not outlive the one that started them, and the one beat a home may run.

`serve` in embedded mode starts its workers and the beat as children; Celery's `worker --beat` (with a
real broker) starts the beat as a child of its worker. Killed with SIGKILL, a parent cannot stop its
children, so each child asks the kernel to send it SIGTERM when its parent dies (Linux
`PR_SET_PDEATHSIG`): a killed `serve` takes its workers and beat with it, a killed worker its beat, and a
restarted worker never adds a second beat. A beat also holds an exclusive lock on a file in the home while
it runs: a second beat on the same home waits until the first is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

PARENT_ENV = "AGENTLOOP_DIE_WITH_PARENT"  # set by a parent that wants its child to die with it: its pid
PR_SET_PDEATHSIG = 1
_held: list[IO[str]] = []  # the beat lock's file, open for the life of the process


def die_with_parent(parent: int | None = None) -> bool:
    """Ask for SIGTERM when the parent process dies. `parent`: the pid the parent should have (if it is already
    gone, this process was adopted: it stops now). False where the kernel offers no such request (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("could not ask to die with the parent process (errno %d)", ctypes.get_errno())
        return False
    if parent is not None and os.getppid() != parent:  # it died before the request was made
        log.error("the parent process (pid %d) is gone; stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def die_with_parent_if_asked() -> None:
    """`die_with_parent` when the environment names the parent (PARENT_ENV), as `serve` does for its workers."""
    parent = os.environ.get(PARENT_ENV)
    if parent and parent.isdigit():
        die_with_parent(int(parent))


def hold_beat_lock(home: Path) -> None:
    """The home's beat lock, for the life of this process: waits (and says so) while another beat holds it."""
    home.mkdir(parents=True, exist_ok=True)
    handle = open(home / "beat.lock", "a+")  # noqa: SIM115 (held open until the process ends)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.warning("another beat runs on %s; waiting until it stops", home)
        fcntl.flock(handle, fcntl.LOCK_EX)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _held.append(handle)
    log.info("beat lock on %s held (pid %d)", home, os.getpid())
