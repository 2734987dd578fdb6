"""Every host's :class:`~adaptive_lb.stats.host.HostStats`, and where their in-flight counts come
from (no driver import).

One registry per policy. Request tracking adds an in-flight source per session it tracks
(reading the driver's pools, :func:`adaptive_lb.runtime._driver.pool_in_flight_reader`); every
host's ``in_flight`` is then the sum of the sources for its key, live, and the attempts counted on
the host again once no source is left.

Imports the statistics, the config and the clock only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from functools import partial

from adaptive_lb.config import TrackingConfig
from adaptive_lb.core.clock import Clock
from adaptive_lb.stats.host import HostStats

__all__ = ["InFlightSource", "StatsRegistry"]

InFlightSource = Callable[[Hashable], int]
"""Reads one session's in-flight count of a host key (the driver's pools)."""


class StatsRegistry:
    """Host key -> :class:`HostStats`. Lookups of existing keys take no lock (a dict read);
    creation and removal do.

    With in-flight sources (one per tracked session, :meth:`add_in_flight_source`), every
    host's :attr:`HostStats.in_flight` is the sum of theirs for its key."""

    def __init__(self, config: TrackingConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._stats: dict[Hashable, HostStats] = {}
        self._lock = threading.Lock()
        self._sources: tuple[InFlightSource, ...] = ()

    def get(self, key: Hashable) -> HostStats:
        """The stats of ``key``, created on first use."""
        stats = self._stats.get(key)
        if stats is None:
            with self._lock:
                stats = self._stats.get(key)
                if stats is None:
                    stats = HostStats(self._config, self._clock)
                    stats.read_in_flight_from(_reader(self._sources, key))
                    self._stats[key] = stats
        return stats

    def add_in_flight_source(self, source: InFlightSource) -> None:
        """Count in flight with ``source`` too (a session's pools), for every host."""
        with self._lock:
            if source not in self._sources:
                self._sources = (*self._sources, source)
                self._publish_sources()

    def remove_in_flight_source(self, source: InFlightSource | None = None) -> None:
        """Stop counting with ``source`` (None: with every source; the attempts counted
        here count again when none is left)."""
        with self._lock:
            self._sources = tuple(s for s in self._sources if source is not None and s != source)
            self._publish_sources()

    @property
    def in_flight_sources(self) -> int:
        """How many sessions' pools the in-flight counts are read from (0: counted here)."""
        return len(self._sources)

    def _publish_sources(self) -> None:
        # Caller holds the lock.
        for key, stats in self._stats.items():
            stats.read_in_flight_from(_reader(self._sources, key))

    def peek(self, key: Hashable) -> HostStats | None:
        """The stats of ``key`` if it has any (never creates them)."""
        return self._stats.get(key)

    def remove(self, key: Hashable) -> None:
        """Forget ``key``; its memory goes once nothing refers to it. A HostStats still
        referenced (requests in flight) keeps working, it is just no longer listed."""
        with self._lock:
            self._stats.pop(key, None)

    def reconfigure(self, config: TrackingConfig) -> None:
        """Apply a new tracking config to every host (their windows restart empty)."""
        with self._lock:
            self._config = config
            stats = list(self._stats.values())
        for host_stats in stats:
            host_stats.reconfigure(config)

    def keys(self) -> list[Hashable]:
        """The known keys (a copy)."""
        return list(self._stats)

    def items(self) -> list[tuple[Hashable, HostStats]]:
        """(key, stats) pairs (a copy)."""
        return list(self._stats.items())

    def __len__(self) -> int:
        return len(self._stats)

    def __contains__(self, key: object) -> bool:
        return key in self._stats

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._stats))


def _reader(sources: tuple[InFlightSource, ...], key: Hashable) -> Callable[[], int] | None:
    """``key``'s in-flight count from ``sources``: one call for the usual single session."""
    if not sources:
        return None
    if len(sources) == 1:
        return partial(sources[0], key)
    return partial(_sum_of, sources, key)


def _sum_of(sources: tuple[InFlightSource, ...], key: Hashable) -> int:
    return sum(source(key) for source in sources)
