"""How instructions say dates and times: 'Thursday, June 12', '14:30'."""

from __future__ import annotations

from datetime import datetime


def day_label(timestamp: str) -> str:
    dt = datetime.fromisoformat(timestamp)
    return f"{dt:%A}, {dt:%B} {dt.day}"


def clock(timestamp: str) -> str:
    return datetime.fromisoformat(timestamp).strftime("%H:%M")
