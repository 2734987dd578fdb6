"""Replica resolution with an LRU cache.

The driver's ``Metadata.get_replicas`` hashes the routing key (Murmur3), bisects a list of
``Token`` objects and looks the range up. :class:`ReplicaResolver` reads the same token map,
but keeps each keyspace's ring as plain token values (a C-level bisect on a miss) and the
live local replicas of each ring range memoised per topology generation, and caches
``(keyspace, routing key) -> ring range`` in a bounded LRU (:class:`ReplicaCache`) cleared
whenever the driver publishes a new token map object -- while that cache pays for itself
(:mod:`adaptive_lb.plan.replica_cache`). The keyspace's ring object stands for
the keyspace in the cache key: when the driver replaces the keyspace's replica map (ALTER
KEYSPACE), a new ring is built, and keys resolved from the old one miss.

Tablets (scylla-driver): when the table of the statement has a tablet map, the tablet's
replicas are used instead and never cached, since tablets move between hosts.

Imports the driver's token map (:mod:`adaptive_lb.plan._driver_policies`), the replica cache, the
topology, the score and the statistics only.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from adaptive_lb.plan._driver_policies import keyspace_replica_map, tablets_of, token_value_function
from adaptive_lb.plan.replica_cache import ReplicaCache
from adaptive_lb.plan.scoring import HostView
from adaptive_lb.plan.topology import Topology

if TYPE_CHECKING:
    from adaptive_lb.stats.host import HostStats

__all__ = ["MAX_CACHED_KEY_BYTES", "ReplicaCache", "ReplicaResolver"]

MAX_CACHED_KEY_BYTES = 256
"""Routing keys longer than this are resolved without the cache (counted as bypassed):
the cache holds its keys, so its memory is bounded by ``capacity`` x (this + ~200 bytes of
entry overhead) -- about 1.8 MiB at the default 4,096 entries, where 64 KiB keys would
otherwise pin 256 MiB. Real partition keys are a few to a few dozen bytes."""


class _KeyspaceRing:
    """One keyspace's ring as parallel lists (token values, replica tuples), so that a cache
    miss costs one C-level ``bisect`` on ints instead of the driver's bisect over ``Token``
    objects. The candidate views of each ring position are memoised per topology
    generation: with NTS every range lists the replicas of every DC, and filtering them down
    to the live local ones is the expensive part of a resolution."""

    __slots__ = ("memo", "replica_map", "replicas", "values")

    def __init__(self, ring: list[Any], replica_map: dict[Any, Any]) -> None:
        self.replica_map = replica_map
        self.values = [token.value for token in ring]
        empty: tuple[Any, ...] = ()
        self.replicas = [tuple(replica_map.get(token, empty)) for token in ring]
        # (generation, views per position), swapped as one reference so that a reader never
        # pairs one generation with another generation's list.
        self.memo: tuple[int, list[tuple[HostView[HostStats], ...] | None]] = (-1, [])

    def candidate_views(self, point: int, topology: Topology) -> tuple[HostView[HostStats], ...]:
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


def _candidate_views(
    replicas: tuple[Any, ...], topology: Topology
) -> tuple[HostView[HostStats], ...]:
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
        self._cache = ReplicaCache(cache_size, self._ring_position)
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
    ) -> tuple[tuple[HostView[HostStats], ...], bool | None]:
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
                return (
                    self._tablet_replicas(tablets, keyspace, routing_key, table, topology),
                    None,
                )
        replica_map = token_map.tokens_to_hosts_by_ks.get(keyspace)
        ring = self._rings.get(keyspace)
        if ring is None or replica_map is None or ring.replica_map is not replica_map:
            ring = self._ring(token_map, keyspace)
            if ring is None or not ring.values:
                return (), False
        cache = self._cache
        hit: bool | None
        if cache.active and len(routing_key) <= MAX_CACHED_KEY_BYTES:
            missed_here = cache.missed_here
            missed_here.missed = False
            point = cache.lookup(ring, routing_key)
            hit = not missed_here.missed
        else:
            cache.bypass()
            point = self._ring_position(ring, routing_key)
            hit = None
        # candidate_views' memo check, inlined: this is the hot path.
        generation, memo = ring.memo
        views = memo[point] if generation == topology.generation else None
        if views is None:
            views = ring.candidate_views(point, topology)
        return views, hit

    def _ring_position(self, ring: _KeyspaceRing, routing_key: bytes) -> int:
        # The cache's computation (on a miss, in the calling thread), or the whole lookup
        # while the cache stands aside.
        values = ring.values
        point = bisect_left(values, self._token_value(routing_key))
        # Each ring entry ends its range (inclusive); past the last token wraps around.
        return point if point < len(values) else 0

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
        self, tablets: Any, keyspace: str, routing_key: bytes, table: str, topology: Topology
    ) -> tuple[HostView[HostStats], ...]:
        self.tablet_lookups += 1
        token = self._metadata.token_map.token_class.from_key(routing_key)
        tablet = tablets.get_tablet_for_key(keyspace, table, token)
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
