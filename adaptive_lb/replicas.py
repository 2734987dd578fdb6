"""Replica resolution with an LRU cache.

The driver's ``Metadata.get_replicas`` hashes the routing key (Murmur3), bisects a list of
``Token`` objects with Python-level comparisons and looks the range up: ~10 us per call on
this machine. :class:`ReplicaResolver` reads the same token map, but keeps each keyspace's
ring as plain token values (a C-level bisect on a miss), and caches
``(keyspace, routing key) -> replicas`` in a bounded LRU (:class:`ReplicaCache`) cleared
whenever the driver publishes a new token map object; an entry made from a keyspace replica
map the driver has since replaced (ALTER KEYSPACE) is treated as a miss.

Tablets (scylla-driver): when the table of the statement has a tablet map, the tablet's
replicas are used instead and never cached, since tablets move between hosts.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from adaptive_lb._driver import keyspace_replica_map, tablets_of, token_value_function
from adaptive_lb.scoring import HostView
from adaptive_lb.topology import Topology

__all__ = ["ReplicaCache", "ReplicaResolver"]


class ReplicaCache:
    """A thread-safe LRU map with hit, miss, eviction and invalidation counts.

    Lookups and inserts are made by :meth:`ReplicaResolver.replicas` itself, under
    ``_lock`` (the hot path: a method call per lookup would cost ~0.1 us each); this class
    holds the entries, the counters -- plain ints written under that lock, so none is lost
    -- and the operations made off the hot path.
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


# A cached resolution is a 3-item list, not an object: a miss builds one for every key, and
# a list costs a fraction of a Python ``__init__``. The views of one topology generation
# are stored with it as one (generation, views) tuple, replaced as one reference, so a
# reader never pairs one generation with another generation's views.
_REPLICA_MAP = 0
"""The keyspace replica map the entry was resolved from (stale once the driver replaces it)."""
_REPLICAS = 1
"""The raw replica hosts of the key's ring range."""
_RESOLVED = 2
"""(topology generation, candidate views in that generation)."""


class _KeyspaceRing:
    """One keyspace's ring as parallel lists (token values, replica tuples), so that a cache
    miss costs one C-level ``bisect`` on ints instead of the driver's bisect over ``Token``
    objects with Python-level comparisons. The candidate views of each ring position are
    memoised per topology generation: with NTS every range lists the replicas of every DC,
    and filtering them down to the live local ones is the expensive part of a miss."""

    __slots__ = ("memo", "replica_map", "replicas", "values")

    def __init__(self, ring: list[Any], replica_map: dict[Any, Any]) -> None:
        self.replica_map = replica_map
        self.values = [token.value for token in ring]
        empty: tuple[Any, ...] = ()
        self.replicas = [tuple(replica_map.get(token, empty)) for token in ring]
        # (generation, views per position), swapped as one reference so that a reader never
        # pairs one generation with another generation's list.
        self.memo: tuple[int, list[tuple[HostView, ...] | None]] = (-1, [])

    def candidate_views(self, point: int, topology: Topology) -> tuple[HostView, ...]:
        """The live local replicas of ring range ``point`` in ``topology``."""
        generation, views = self.memo
        if generation != topology.generation:
            views = [None] * len(self.values)
            self.memo = (topology.generation, views)
        found = views[point]
        if found is None:
            found = _candidate_views(self.replicas[point], topology)
            views[point] = found
        return found


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

    ``metadata`` is the driver's ``cassandra.metadata.Metadata``. Replicas are read from its
    current ``token_map`` (the same data ``Metadata.get_replicas`` uses) and, where
    scylla-driver has them, from its tablets.
    """

    __slots__ = (
        "_cache",
        "_metadata",
        "_rings",
        "_tablets",
        "_token_map",
        "_token_value",
        "tablet_lookups",
    )

    def __init__(self, metadata: Any, cache_size: int) -> None:
        self._metadata = metadata
        self._cache = ReplicaCache(cache_size)
        self._token_map: Any = None
        self._token_value: Any = None
        self._rings: dict[str, _KeyspaceRing] = {}
        self._tablets = tablets_of(metadata)
        self.tablet_lookups = 0

    @property
    def cache(self) -> ReplicaCache:
        """The LRU cache (its counters are exported as metrics)."""
        return self._cache

    def replicas(
        self, keyspace: str, routing_key: bytes, query: Any, topology: Topology
    ) -> tuple[tuple[HostView, ...], bool | None]:
        """Candidate replica views of ``routing_key`` in ``keyspace``, in ring order, and
        whether the cache was hit (None for tablet lookups, which are never cached).
        ``query`` is consulted only for its table, where tablets exist."""
        token_map = self._metadata.token_map
        if token_map is None:
            return (), None
        if token_map is not self._token_map:
            self._switch_token_map(token_map)
        tablets = self._tablets
        if tablets is not None:
            table = getattr(query, "table", None)
            if table is not None and tablets.table_has_tablets(keyspace, table):
                return self._tablet_replicas(keyspace, routing_key, table, topology), None
        replica_map = token_map.tokens_to_hosts_by_ks.get(keyspace)
        ring = self._rings.get(keyspace)
        if ring is None or replica_map is None or ring.replica_map is not replica_map:
            ring = self._ring(token_map, keyspace)
            if ring is None or not ring.values:
                return (), False
        key = (keyspace, routing_key)
        generation = topology.generation
        # The cache lookup, the ring lookup of a miss and its insert are inlined below, under
        # one lock round trip: this is the hot path (each Python call saved is ~0.1 us).
        cache = self._cache
        entries = cache._entries
        lock = cache._lock
        lock.acquire()  # not ``with``: half the cost on CPython 3.11
        try:
            entry = entries.get(key)
            if entry is not None and entry[_REPLICA_MAP] is ring.replica_map:
                entries.move_to_end(key)
                cache.hits += 1
                resolved = entry[_RESOLVED]
                if resolved[0] == generation:
                    return resolved[1], True
                # Hosts went up or down since: map the same replicas onto the new snapshot.
                views = _candidate_views(entry[_REPLICAS], topology)
                entry[_RESOLVED] = (generation, views)
                return views, True
            # A miss, or an entry resolved from a replica map the driver has replaced.
            cache.misses += 1
            values = ring.values
            point = bisect_left(values, self._token_value(routing_key))
            if point == len(values):
                # Each ring entry ends its range (inclusive); past the last token wraps.
                point = 0
            memo_generation, memo = ring.memo
            views = memo[point] if memo_generation == generation else None
            if views is None:
                views = ring.candidate_views(point, topology)
            if cache.capacity:
                if entry is not None:
                    entries.move_to_end(key)
                entries[key] = [ring.replica_map, ring.replicas[point], (generation, views)]
                if len(entries) > cache.capacity:
                    entries.popitem(last=False)
                    cache.evictions += 1
            return views, False
        finally:
            lock.release()

    def _switch_token_map(self, token_map: Any) -> None:
        # A new token map object: ring or replication changed, every entry is stale.
        self._rings = {}
        self._token_value = token_value_function(token_map)
        self._token_map = token_map
        self._cache.clear()

    def _ring(self, token_map: Any, keyspace: str) -> _KeyspaceRing | None:
        replica_map = keyspace_replica_map(token_map, keyspace)
        if not replica_map:
            return None
        ring = self._rings.get(keyspace)
        if ring is None or ring.replica_map is not replica_map:
            ring = _KeyspaceRing(token_map.ring, replica_map)
            rings = dict(self._rings)
            rings[keyspace] = ring
            self._rings = rings
        return ring

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
