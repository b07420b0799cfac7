"""State-based evaluation, as in AppWorld: diff the world before and after the episode.

A task passes when every expected change is present, nothing else changed (no collateral damage)
and the answer, for questions, is right. Reward = fraction of tests passed; success = all passed.
Everything here is pure: states in, verdict out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.apps.world import WorldState


@dataclass(frozen=True)
class Change:
    app: str
    table: str
    key: str
    kind: str  # added | removed | updated
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def fields(self) -> frozenset[str]:
        if self.kind != "updated" or self.before is None or self.after is None:
            return frozenset()
        keys = set(self.before) | set(self.after)
        return frozenset(k for k in keys if self.before.get(k) != self.after.get(k))

    def describe(self) -> str:
        what = f"{self.app}.{self.table}[{self.key}]"
        if self.kind == "updated":
            return f"{what} updated ({', '.join(sorted(self.fields))})"
        return f"{what} {self.kind}"


def diff_states(
    before: WorldState, after: WorldState, volatile: Mapping[str, frozenset[str]] | None = None
) -> list[Change]:
    """Every record added, removed or changed; tables starting with "_" and volatile fields are ignored."""
    volatile = volatile or {}
    changes: list[Change] = []
    for app in sorted(set(before) | set(after)):
        skip = volatile.get(app, frozenset())
        b_app, a_app = before.get(app, {}), after.get(app, {})
        for table in sorted(set(b_app) | set(a_app)):
            if table.startswith("_"):
                continue
            b_rows, a_rows = b_app.get(table, {}), a_app.get(table, {})
            if b_rows == a_rows:  # most tables of an episode are untouched: compared in C, not row by row
                continue
            for key in sorted(set(b_rows) | set(a_rows), key=_natural):
                b, a = b_rows.get(key), a_rows.get(key)
                if b is None and a is not None:
                    changes.append(Change(app, table, key, "added", None, a))
                elif a is None and b is not None:
                    changes.append(Change(app, table, key, "removed", b, None))
                elif a is not None and b is not None and a != b:
                    if skip:  # volatile fields (e.g. `read`) neither count as changes nor spoil expectations
                        b = {k: v for k, v in b.items() if k not in skip}
                        a = {k: v for k, v in a.items() if k not in skip}
                    if a != b:
                        changes.append(Change(app, table, key, "updated", b, a))
    return changes


def _natural(key: str) -> tuple[int, Any]:
    return (0, int(key)) if key.isdigit() else (1, key)


# --- value matching ---------------------------------------------------------------------------


def normalise_text(value: Any) -> str:
    text = str(value).casefold().strip()
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .!\"'")


def values_match(expected: Any, actual: Any) -> bool:
    if callable(expected):
        return bool(expected(actual))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected == actual
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return abs(float(expected) - float(actual)) < 0.005
    if isinstance(expected, str) and isinstance(actual, str):
        return normalise_text(expected) == normalise_text(actual)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(values_match(e, a) for e, a in zip(expected, actual, strict=True))
    return bool(expected == actual)


def contains(text: str) -> Callable[[Any], bool]:
    """Field matcher: the value contains `text` (case-insensitive)."""
    return lambda v: isinstance(v, str) and normalise_text(text) in normalise_text(v)


def same_items(items: list[Any]) -> Callable[[Any], bool]:
    """Field matcher: a list with these items in any order."""
    want = sorted(normalise_text(i) for i in items)
    return lambda v: isinstance(v, list) and sorted(normalise_text(i) for i in v) == want


def same_digits(expected: str) -> Callable[[Any], bool]:
    """Answer/field matcher for phone numbers and the like: equal once everything but digits is dropped."""
    want = re.sub(r"\D", "", expected)
    return lambda v: isinstance(v, str) and re.sub(r"\D", "", v) == want


def answer_matches(expected: Any, answer: str | None) -> bool:
    """Questions: numbers compare as numbers, lists as sets of comma-separated items, text normalised;
    a callable decides for itself (e.g. `same_digits` for phone numbers)."""
    if answer is None:
        return False
    if callable(expected):
        return bool(expected(answer))
    if isinstance(expected, list):
        got = [normalise_text(part) for part in re.split(r",|\n|;| and ", answer) if part.strip()]
        return sorted(got) == sorted(normalise_text(e) for e in expected)
    if isinstance(expected, bool):
        return normalise_text(answer) in (("yes", "true") if expected else ("no", "false"))
    if isinstance(expected, int | float):
        number = re.sub(r"[$,\s]", "", answer)
        try:
            return abs(float(number) - float(expected)) < 0.005
        except ValueError:
            return False
    return normalise_text(expected) == normalise_text(answer)


# --- expectations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """One expected change. `match` gives field values (or matchers) the record must have."""

    kind: str  # added | removed | updated
    app: str
    table: str
    key: str | None = None  # the record id, for removed/updated
    match: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def matches(self, change: Change) -> bool:
        if (change.kind, change.app, change.table) != (self.kind, self.app, self.table):
            return False
        if self.key is not None and change.key != str(self.key):
            return False
        record = change.after if change.kind != "removed" else change.before
        assert record is not None
        if any(f not in record or not values_match(v, record[f]) for f, v in self.match.items()):
            return False
        # an update must not touch fields the task did not ask to change
        return not (self.kind == "updated" and not change.fields <= set(self.match) | {"updated_at"})

    def describe(self) -> str:
        if self.label:
            return self.label
        key = f"[{self.key}]" if self.key is not None else ""
        fields = ", ".join(f"{k}={v!r}" for k, v in self.match.items() if not callable(v))
        return f"{self.app}.{self.table}{key} {self.kind}" + (f" with {fields}" if fields else "")


def added(app: str, table: str, label: str = "", **match: Any) -> Expect:
    return Expect("added", app, table, None, match, label)


def removed(app: str, table: str, key: Any, label: str = "") -> Expect:
    return Expect("removed", app, table, str(key), {}, label)


def updated(app: str, table: str, key: Any, label: str = "", **match: Any) -> Expect:
    return Expect("updated", app, table, str(key), match, label)


@dataclass
class TestResult:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class Verdict:
    tests: list[TestResult]
    # a world that grades with partial credit (ScienceWorld's 0-100 score) gives the reward itself, in [0, 1];
    # None: the fraction of tests passed
    score: float | None = None

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def reward(self) -> float:
        if self.score is not None:
            return self.score
        return self.passed / self.total if self.total else 0.0

    @property
    def success(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "total": self.total,
            "reward": self.reward,
            "success": self.success,
            "tests": [{"name": t.name, "passed": t.passed, "detail": t.detail} for t in self.tests],
        }


NO_ANSWER = object()


class Evaluator(Protocol):
    """Judges an episode from the world's state before and after it and the agent's answer."""

    def evaluate(self, before: WorldState, after: WorldState, answer: str | None) -> Verdict: ...


@dataclass(frozen=True)
class StateEvaluator:
    """Expected changes + (for questions) the expected answer, checked against a state diff."""

    expectations: tuple[Expect, ...] = ()
    answer: Any = NO_ANSWER
    volatile: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def evaluate(self, before: WorldState, after: WorldState, answer: str | None) -> Verdict:
        changes = diff_states(before, after, self.volatile)
        tests: list[TestResult] = []
        explained: set[int] = set()
        for exp in self.expectations:
            hit = next((i for i, ch in enumerate(changes) if i not in explained and exp.matches(ch)), None)
            if hit is not None:
                explained.add(hit)
            tests.append(TestResult(f"expected: {exp.describe()}", hit is not None))
        extra = [ch.describe() for i, ch in enumerate(changes) if i not in explained]
        tests.append(
            TestResult(
                "no collateral damage",
                not extra,
                "unexpected changes: " + "; ".join(extra[:10]) if extra else "",
            )
        )
        if self.answer is not NO_ANSWER:
            ok = answer_matches(self.answer, answer)
            tests.append(TestResult("answer is correct", ok, "" if ok else f"got {answer!r}"))
        return Verdict(tests)
