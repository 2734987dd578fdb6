"""Shared pieces of the reliability suite.

Every test here is bounded in time at CI scale. ``ADAPTIVE_LB_RELIABILITY_SCALE`` (default
1) multiplies the work of the long-running tests (threads x cycles, requests, add/remove
cycles); ``docs/reliability.md`` gives the figures of the last full-scale run.
"""

from __future__ import annotations

import logging
import os

import pytest
from cassandra.query import SimpleStatement

SCALE = max(1, int(os.environ.get("ADAPTIVE_LB_RELIABILITY_SCALE", "1")))
"""How much longer than CI scale to run (an integer >= 1)."""


def scaled(count: int) -> int:
    """``count`` at CI scale, times :data:`SCALE`."""
    return count * SCALE


def statement(key: bytes | None, keyspace: str | None = "ks", **kwargs) -> SimpleStatement:
    """A statement routed by ``key`` in ``keyspace`` (no bound values are ever logged)."""
    return SimpleStatement(
        "SELECT v FROM ks.t WHERE k = %s", routing_key=key, keyspace=keyspace, **kwargs
    )


class LogCapture(logging.Handler):
    """Every record logged under ``adaptive_lb`` and ``cassandra`` while installed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def texts(self) -> list[str]:
        """Each record as a formatter would write it, traceback included."""
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        return [formatter.format(record) for record in self.records]

    def matching(self, text: str) -> list[logging.LogRecord]:
        """Records whose message contains ``text``."""
        return [r for r in self.records if text in r.getMessage()]


@pytest.fixture
def captured_logs():
    """Capture the adaptive_lb and cassandra loggers at DEBUG for the test."""
    handler = LogCapture()
    loggers = [logging.getLogger("adaptive_lb"), logging.getLogger("cassandra")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
