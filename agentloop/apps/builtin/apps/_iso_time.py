"""Date-times as the built-in apps take them from callers: ISO 8601, stored as UTC `YYYY-MM-DDTHH:MM:SSZ`.

Stored values are canonical so that they compare as strings and evaluation matches them exactly,
whatever spelling (`+00:00`, no seconds, a plain date) the caller used.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agentloop.apps.base import ApiError
from agentloop.apps.builtin.people import iso


def parse_time(value: str, what: str) -> datetime:
    """A date or date-time in UTC; values without an offset are taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ApiError(
            422, f"{what} must be an ISO 8601 date-time such as 2025-06-12T14:30:00Z (UTC); got {value!r}."
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def canonical_time(value: str, what: str) -> str:
    return iso(parse_time(value, what))
