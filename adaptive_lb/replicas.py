"""Replica resolution with an LRU cache.

The driver's ``Metadata.get_replicas`` hashes the routing key (Murmur3), bisects the ring
and looks the range up: ~10 us per call on this machine. Keys repeat, so
:class:`ReplicaResolver` caches ``(keyspace, routing key) -> replicas`` in a bounded LRU
(:class:`ReplicaCache`), cleared whenever the driver publishes a new token map object.

Tablets (scylla-driver): when the table of the statement has a tablet map, the tablet's
replicas are used instead and never cached, since tablets move between hosts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from adaptive_lb.scoring import HostView
from adaptive_lb.topology import Topology

__all__ = ["ReplicaCache", "ReplicaResolver"]


class ReplicaCache:
    """A thread-safe LRU map with hit, miss, eviction and invalidation counts.

    One lock acquisition per :meth:`get` (~0.1 us); the counters are plain ints written under
    that lock, so none is lost.
    """

    __slots__ = ("_entries", "_lock", "capacity", "evictions", "hits", "invalidations", "misses")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0

    def get(self, key: Hashable) -> Any | None:
        """Return the value for ``key`` (marking it recently used) or None, counting a hit
        or a miss."""
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
            else:
                self._entries.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key: Hashable, value: Any) -> None:
        """Insert ``key``, evicting the least recently used entries beyond capacity."""
        if self.capacity == 0:
            return
        with self._lock:
            entries = self._entries
            entries[key] = value
            entries.move_to_end(key)
            while len(entries) > self.capacity:
                entries.popitem(last=False)
                self.evictions += 1

    def clear(self) -> None:
        """Drop every entry (counted as one invalidation)."""
        with self._lock:
            self._entries.clear()
            self.invalidations += 1

    def resize(self, capacity: int) -> None:
        """Change the capacity, evicting as needed."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        with self._lock:
            self.capacity = capacity
            while len(self._entries) > capacity:
                self._entries.popitem(last=False)
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses), 0 when nothing was looked up."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Entry:
    """A cached resolution: the raw replicas and their candidate views for one snapshot."""

    __slots__ = ("generation", "replicas", "views")

    def __init__(self, generation: int, replicas: tuple[Any, ...], views: tuple[HostView, ...]):
        self.generation = generation
        self.replicas = replicas
        self.views = views


def _candidate_views(replicas: tuple[Any, ...], topology: Topology) -> tuple[HostView, ...]:
    by_id = topology.by_id
    views = []
    for host in replicas:
        view = by_id.get(id(host))
        if view is not None and view.candidate:
            views.append(view)
    return tuple(views)


class ReplicaResolver:
    """Finds the candidate replicas (live, local) of a routing key.

    ``metadata`` is the driver's ``cassandra.metadata.Metadata``; only its public
    ``token_map`` / ``get_replicas`` and, where scylla-driver has them, its tablets are used.
    """

    __slots__ = ("_cache", "_metadata", "_tablets", "_token_map", "tablet_lookups")

    def __init__(self, metadata: Any, cache_size: int) -> None:
        self._metadata = metadata
        self._cache = ReplicaCache(cache_size)
        self._token_map = getattr(metadata, "token_map", None)
        # scylla-driver only: the tablet map (see adaptive_lb._driver for why it is read).
        from adaptive_lb._driver import tablets_of

        self._tablets = tablets_of(metadata)
        self.tablet_lookups = 0

    @property
    def cache(self) -> ReplicaCache:
        """The LRU cache (its counters are exported as metrics)."""
        return self._cache

    def replicas(
        self, keyspace: str, routing_key: bytes, table: str | None, topology: Topology
    ) -> tuple[tuple[HostView, ...], bool | None]:
        """Candidate replica views of ``routing_key`` in ``keyspace``, in ring order, and
        whether the cache was hit (None for tablet lookups, which are never cached)."""
        metadata = self._metadata
        token_map = metadata.token_map
        if token_map is None:
            return (), None
        if token_map is not self._token_map:
            # A new token map object: ring or replication changed, every entry is stale.
            self._token_map = token_map
            self._cache.clear()
        tablets = self._tablets
        if tablets is not None and table is not None and tablets.table_has_tablets(keyspace, table):
            return self._tablet_replicas(keyspace, routing_key, table, topology), None
        key = (keyspace, routing_key)
        entry = self._cache.get(key)
        if entry is None:
            replicas = tuple(metadata.get_replicas(keyspace, routing_key))
            entry = _Entry(topology.generation, replicas, _candidate_views(replicas, topology))
            self._cache.put(key, entry)
            return entry.views, False
        if entry.generation != topology.generation:
            # Hosts went up or down since: map the same replicas onto the new snapshot.
            views = _candidate_views(entry.replicas, topology)
            entry.views = views
            entry.generation = topology.generation
            return views, True
        return entry.views, True

    def _tablet_replicas(
        self, keyspace: str, routing_key: bytes, table: str, topology: Topology
    ) -> tuple[HostView, ...]:
        self.tablet_lookups += 1
        token = self._metadata.token_map.token_class.from_key(routing_key)
        tablet = self._tablets.get_tablet_for_key(keyspace, table, token)
        if tablet is None:
            return ()
        by_host_id = topology.by_host_id
        views = []
        for host_id, _shard in tablet.replicas:
            view = by_host_id.get(host_id)
            if view is not None and view.candidate:
                views.append(view)
        return tuple(views)

    def clear(self) -> None:
        """Invalidate the cache."""
        self._cache.clear()
