"""Generate calls that several threads make at once, run as one batch (leader/follower).

A worker's thread pool runs several episodes at once, each calling the policy turn by turn. One model
can only run one forward at a time, so without this the calls would queue and decode one after
another. Here the calls that wait while a batch decodes are run together by the next caller to go,
and that caller waits a moment (`window_s`) for the threads that were in the last batch and have not
come back yet (their tool call is still running): episodes of different tenants, on different
adapters, then decode in the same forwards. A lone thread never waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

R = TypeVar("R")  # a request
G = TypeVar("G")  # its result


class _Call(Generic[R, G]):
    def __init__(self, requests: list[R], thread: int) -> None:
        self.requests = requests
        self.thread = thread
        self.results: list[G] | None = None
        self.error: BaseException | None = None
        self.done = False


class Coalescer(Generic[R, G]):
    """`coalescer(requests)` returns `run(requests)`'s results, in order; calls from other threads that
    wait meanwhile are merged into the same `run` call. An error of `run` is every merged caller's error."""

    def __init__(self, run: Callable[[list[R]], list[G]], window_s: float = 0.02, recent_s: float = 1.0) -> None:
        self._run = run
        self.window_s = window_s  # how long a leader waits for a thread it expects back
        self.recent_s = recent_s  # a thread whose last call returned longer ago than this is not expected
        self._cv = threading.Condition()
        self._pending: list[_Call[R, G]] = []
        self._busy = False
        self._returned: dict[int, float] = {}  # thread id -> when its last call returned
        self.batches = 0  # `run` calls so far
        self.merged = 0  # of them, those that held more than one caller's requests

    def __call__(self, requests: Sequence[R]) -> list[G]:
        me = threading.get_ident()
        call: _Call[R, G] = _Call(list(requests), me)
        with self._cv:
            self._pending.append(call)
            self._cv.notify_all()
            while self._busy and not call.done:
                self._cv.wait()
            if not call.done:  # this thread leads the next batch
                self._busy = True
                self._gather(me)
                batch, self._pending = self._pending, []
        if not call.done:
            self._lead(batch)
        with self._cv:
            self._returned[me] = time.monotonic()
        if call.error is not None:
            raise call.error
        assert call.results is not None
        return call.results

    def forget(self) -> None:
        """The calling thread is done for now (its episode ended): no leader waits for it."""
        with self._cv:
            self._returned.pop(threading.get_ident(), None)

    def _gather(self, me: int) -> None:
        """Wait (holding the condition's lock between waits) until every recently seen thread has a call
        pending, or the window has passed."""
        deadline = time.monotonic() + self.window_s
        while True:
            now = time.monotonic()
            waiting = {c for c in self._returned if c != me and now - self._returned[c] < self.recent_s}
            if not waiting or now >= deadline:
                return
            if waiting <= {c.thread for c in self._pending}:  # everyone expected is in
                return
            self._cv.wait(deadline - now)

    def _lead(self, batch: list[_Call[R, G]]) -> None:
        flat = [r for c in batch for r in c.requests]
        try:
            results = self._run(flat)
            start = 0
            for c in batch:
                c.results = results[start : start + len(c.requests)]
                start += len(c.requests)
        except BaseException as e:  # handed to every caller whose requests were in the batch
            for c in batch:
                c.error = e
        finally:
            with self._cv:
                self._busy = False
                self.batches += 1
                self.merged += len(batch) > 1
                for c in batch:
                    c.done = True
                self._cv.notify_all()
