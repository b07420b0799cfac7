"""Process-wide logging setup (one format for API, worker and CLI)."""

from __future__ import annotations

import logging


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "urllib3", "kombu", "amqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
