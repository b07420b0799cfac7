"""Generate calls of several threads run as one batch (policy/coalesce.py)."""

import threading
import time

import pytest

from agentloop.policy.coalesce import Coalescer


class Recorder:
    """A `run` that records each batch and answers each request with its double, slowly (a forward)."""

    def __init__(self, seconds: float = 0.05, fail_on: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.seconds = seconds
        self.fail_on = fail_on
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def __call__(self, requests: list[int]) -> list[int]:
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.batches.append(list(requests))
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        if self.fail_on is not None and self.fail_on in requests:
            raise RuntimeError("out of memory")
        return [2 * r for r in requests]


def episodes(coalescer, starts, turns, tool_s=0.005):
    """One thread per start: `turns` calls of [start + turn], a short tool call between them."""
    answers: dict[int, list[list[int]]] = {s: [] for s in starts}

    def episode(start):
        for turn in range(turns):
            answers[start].append(coalescer([start + turn]))
            time.sleep(tool_s)
        coalescer.forget()

    threads = [threading.Thread(target=episode, args=(s,)) for s in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return answers


def test_a_lone_thread_runs_its_own_calls_one_by_one():
    run = Recorder(seconds=0.0)
    coalescer = Coalescer(run, window_s=5.0)  # a lone thread is never expected back: it never waits
    answers = episodes(coalescer, [100], turns=4)
    assert answers[100] == [[200], [202], [204], [206]]
    assert run.batches == [[100], [101], [102], [103]] and coalescer.merged == 0


def test_threads_in_lockstep_decode_together_and_each_gets_its_own_results():
    run = Recorder()
    coalescer = Coalescer(run, window_s=2.0)  # generous: a leader stops waiting as soon as the other is in
    answers = episodes(coalescer, [100, 200, 300], turns=6)
    for start in (100, 200, 300):
        assert answers[start] == [[2 * (start + t)] for t in range(6)]
    assert run.most_running == 1  # one forward at a time
    assert sorted(r for b in run.batches for r in b) == sorted(s + t for s in (100, 200, 300) for t in range(6))
    # the first calls may run alone while the threads start; from then on every batch holds all three
    full = [b for b in run.batches if len(b) == 3]
    assert len(full) >= 4 and len(run.batches) <= 6 + 2 and coalescer.merged >= 4


def test_an_error_of_the_batch_is_every_merged_callers_error():
    run = Recorder(seconds=0.2, fail_on=7)
    coalescer = Coalescer(run)
    errors: dict[int, BaseException] = {}

    def call(request):
        try:
            coalescer([request])
        except RuntimeError as e:
            errors[request] = e

    first = threading.Thread(target=call, args=(1,))
    first.start()
    while not run.batches:  # the first call is decoding: the next two wait and run together after it
        time.sleep(0.001)
    others = [threading.Thread(target=call, args=(r,)) for r in (7, 8)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(timeout=10)
    assert run.batches[0] == [1] and sorted(run.batches[1]) == [7, 8]
    assert set(errors) == {7, 8} and "out of memory" in str(errors[8])
    assert coalescer([5]) == [10]  # the coalescer goes on after a failed batch


def test_a_thread_whose_episode_ended_is_not_waited_for():
    run = Recorder(seconds=0.0)
    coalescer = Coalescer(run, window_s=60.0)
    episodes(coalescer, [100], turns=1)  # this thread said forget() when its episode ended
    done = threading.Event()
    worker = threading.Thread(target=lambda: (coalescer([5]), done.set()))
    worker.start()
    worker.join(timeout=10)  # had it waited for the ended thread, it would sit out the 60 s window
    assert done.is_set()


@pytest.mark.parametrize("window_s", [0.0, 0.02])
def test_no_call_is_lost_or_duplicated_under_many_threads(window_s):
    run = Recorder(seconds=0.001)
    coalescer = Coalescer(run, window_s=window_s)
    starts = [1000 * i for i in range(1, 9)]
    answers = episodes(coalescer, starts, turns=10, tool_s=0.0)
    assert all(answers[s] == [[2 * (s + t)] for t in range(10)] for s in starts)
    assert sorted(r for b in run.batches for r in b) == sorted(s + t for s in starts for t in range(10))
