"""Event counters for the hot path: exact under threads, with no Python lock.

An ``itertools.count`` advanced with ``next()`` is one C call, atomic under the GIL (and per
object on free-threaded CPython), where ``x += 1`` on an attribute can lose counts between
threads and a lock costs ~0.1 us. Its value is read without advancing it from its ``repr``
(``"count(5)"``), the one place that relies on that format:
``tests/unit/test_counting.py`` pins it.

Imports the standard library only (the bottom layer).
"""

from __future__ import annotations

import itertools

__all__ = ["counter_value", "new_counter"]


def new_counter() -> itertools.count[int]:
    """A counter at 0: count an event with ``next(counter)``."""
    return itertools.count()


def counter_value(counter: itertools.count[int]) -> int:
    """The events ``counter`` has counted (its next value), without advancing it."""
    return int(repr(counter)[6:-1])
