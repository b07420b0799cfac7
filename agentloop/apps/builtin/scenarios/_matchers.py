"""Matchers for answers and fields a person writes as free text: dates, dollar amounts, lists, phones."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

from agentloop.apps.evaluation import normalise_text

Matcher = Callable[[Any], bool]

DATE_FORMATS = ("%Y-%m-%d", "%B %d, %Y", "%B %d %Y", "%d %B %Y", "%b %d, %Y", "%b %d %Y", "%d %b %Y", "%m/%d/%Y")
AMOUNT = re.compile(r"(?<![\w.])\$?(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,2})?(?![\d])")
BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


def same_date(expected: str) -> Matcher:
    """Answer matcher: the date YYYY-MM-DD, written in any common way ('June 20, 1997', '1997-06-20', ...)."""
    want = date.fromisoformat(expected)

    def match(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        text = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", value.strip().rstrip("."))
        text = re.sub(r"^[A-Za-z]+day,\s*", "", text)  # 'Friday, June 20, 1997'
        for fmt in DATE_FORMATS:
            try:
                return datetime.strptime(text, fmt).date() == want
            except ValueError:
                continue
        return False

    return match


def amounts_in(text: str) -> list[float]:
    return [float(m.group(1).replace(",", "") + (m.group(2) or "")) for m in AMOUNT.finditer(text)]


def mentions_amount(amount: float) -> Matcher:
    """Field matcher: the text mentions this dollar amount ('$23.40', '23.4', '1,023.40')."""
    return lambda v: isinstance(v, str) and any(abs(x - amount) < 0.005 for x in amounts_in(v))


def only_amount(amount: float) -> Matcher:
    """Answer matcher: the one amount in the answer is this one ('$2,100', '2100 dollars', '67,000 miles')."""
    return lambda v: (
        isinstance(v, str) and len({round(x, 2) for x in amounts_in(v)}) == 1 and mentions_amount(amount)(v)
    )


def listed_lines(items: list[str]) -> Matcher:
    """Field matcher: the text is these items, one per line (bullets or numbering allowed), in any order."""
    want = sorted(normalise_text(i) for i in items)

    def match(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        lines = [normalise_text(BULLET.sub("", line)) for line in value.splitlines()]
        return sorted(line for line in lines if line) == want

    return match


def has_phone(digits: str) -> Matcher:
    """Field matcher: the text gives this phone number, with whatever punctuation."""
    return lambda v: isinstance(v, str) and digits in re.sub(r"\D", "", v)


def lacks(word: str) -> Matcher:
    """Field matcher: the text does not mention this word (case-insensitive, as a whole word)."""
    pattern = re.compile(rf"\b{re.escape(word.casefold())}\b")
    return lambda v: isinstance(v, str) and not pattern.search(v.casefold())


def all_of(*matchers: Matcher) -> Matcher:
    return lambda v: all(m(v) for m in matchers)
