"""The plan algorithm: which hosts are tried first, and in which order.

:meth:`Planner.plan` is the policy's hot path. For one statement:

1. the live local replicas of its routing key (:mod:`adaptive_lb.plan.replicas`, cached);
2. candidates: those replicas, filled with random live local hosts up to ``sample_size``;
3. ordered by score (:mod:`adaptive_lb.plan.scoring`), ties broken at random; lightweight
   transactions get the deterministic ring order instead;
4. then the rest of the child's plan, without the hosts already yielded, each host once.

When no non-replica can beat the best replica -- none could (the common case when idle), or
none of the plan's fill hosts does (under load) -- the best replica is yielded before the
other candidates are ordered: the driver usually asks for one host. An exception inside the
algorithm is counted and answered with the child's plan; an exception raised by the child
itself reaches the caller, as it would without adaptive-lb.

With ``policy.enabled: false`` the ordering is off: :meth:`Planner.child_plan` hands over
the child's own plan, untouched (:attr:`Planner.make_plan` is the one swapped on reload, so
the hot path pays nothing to ask).

May import: the rows below it (replicas, topology, scoring, locality, statistics, the
driver's policies, config, counters), attrs and the driver's public API.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from attrs import define
from cassandra import ConsistencyLevel
from cassandra.policies import LoadBalancingPolicy

from adaptive_lb.config import Config, RackLearningConfig
from adaptive_lb.core.counting import counter_value
from adaptive_lb.plan._driver_policies import ChildChain
from adaptive_lb.plan.locality import resolve_local_rack
from adaptive_lb.plan.replicas import ReplicaResolver
from adaptive_lb.plan.scoring import (
    HostView,
    best_replica,
    fill_hosts,
    lowest_score,
    order,
    order_lwt,
)
from adaptive_lb.plan.topology import TopologyBook

if TYPE_CHECKING:
    from adaptive_lb.stats.host import HostStats

__all__ = ["DECISION_POSITIONS", "PlanRecord", "PlanSettings", "Planner"]

log = logging.getLogger("adaptive_lb.policy")

DECISION_POSITIONS = ("replica", "non_replica", "local", "child", "fallback")
"""Where a plan's first host came from: a replica, a non-replica that scored better than
every replica, the least-loaded local host (no routing key or no replica), the child's plan
(no local candidate, a target host, or the ordering off: ``policy.enabled: false``), or the
child's plan after an internal error."""

# A statement is treated as a lightweight transaction when scylla-driver's ``is_lwt()`` says
# so (conditional prepared statements) or when it reads at SERIAL / LOCAL_SERIAL
# (cassandra-driver reports no LWT flag).
_SERIAL = frozenset((ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL))
_HOST = attrgetter("host")


@define(frozen=True, slots=True)
class PlanSettings:
    """The few config values the hot path reads, published as one reference."""

    sample_size: int
    non_replica_penalty: float
    non_local_rack_penalty: float
    token_aware: bool
    lwt_deterministic: bool
    local_rack: str | None
    """The configured rack, else the child's (None: to be learned, or none)."""
    local_rack_source: str = "unknown"
    """``configured``, ``child``, ``learned`` (to be learned: ``local_rack: auto``) or
    ``unknown`` (none)."""
    rack_learning: RackLearningConfig | None = None
    """How to learn the rack (only when ``local_rack_source`` is ``learned``)."""
    enabled: bool = True
    """``policy.enabled``: false, every plan is the child's own (:meth:`Planner.child_plan`)."""

    @classmethod
    def of(cls, config: Config, chain: ChildChain) -> PlanSettings:
        """The settings of ``config``; the local rack falls back to the child's own, then
        (``auto``) to learning it (:func:`adaptive_lb.plan.locality.resolve_local_rack`)."""
        p = config.policy
        child_rack = getattr(chain.base, "local_rack", None) or None
        local_rack, source = resolve_local_rack(p.local_rack, child_rack)
        return cls(
            sample_size=p.sample_size,
            non_replica_penalty=p.non_replica_penalty,
            non_local_rack_penalty=p.non_local_rack_penalty,
            token_aware=p.token_aware,
            lwt_deterministic=p.lwt_deterministic,
            local_rack=local_rack,
            local_rack_source=source,
            rack_learning=p.rack_learning if source == "learned" else None,
            enabled=p.enabled,
        )


@define(slots=True)
class PlanRecord:
    """What a decision was made of, filled by :meth:`Planner.plan` for traced plans only.
    A recorded plan scores every candidate (no first-host shortcut) unless :attr:`brief`."""

    brief: bool = False
    """Only the first host is recorded (its reason, not the other candidates): the plan
    keeps its first-host shortcut, and :attr:`candidates` may hold that host alone."""

    keyspace: str | None = None
    replicas: Sequence[HostView[HostStats]] = ()
    """The candidate replicas of the routing key (empty without one)."""
    candidates: Sequence[HostView[HostStats]] = ()
    """The candidates in the order they were yielded."""
    cache_hit: bool | None = None
    """Replica cache hit (None: not looked up, or a tablet lookup)."""
    lwt: bool = False
    position: str = "child"
    """One of :data:`DECISION_POSITIONS`."""
    fallback: bool = False
    """An internal error made the rest of the plan the child's."""
    local_rack: str | None = None
    """The client's rack in force (None: none known)."""
    local_rack_source: str = "unknown"
    """Where it comes from (:data:`adaptive_lb.plan.locality.LOCAL_RACK_SOURCES`)."""
    enabled: bool = True
    """False: the ordering was off (``policy.enabled``), the plan is the child's own."""


class Planner:
    """Makes plans from the state the policy publishes: the topology snapshot (``book``),
    the :class:`PlanSettings` (``settings``) and the replica resolver (``resolver``, set at
    populate). Counts plans by :data:`DECISION_POSITIONS`; reports its own errors to
    ``on_error``."""

    def __init__(
        self,
        child: LoadBalancingPolicy,
        chain: ChildChain,
        book: TopologyBook,
        settings: PlanSettings,
        on_error: Callable[[], None],
    ) -> None:
        self.child = child
        self.chain = chain
        self.book = book
        self.resolver: ReplicaResolver | None = None
        self._on_error = on_error
        # itertools.count: one C-level next() per plan, atomic, no Python lock.
        self._decisions = {position: itertools.count() for position in DECISION_POSITIONS}
        self.settings = settings
        self.make_plan: Callable[..., Iterator[Any]] = self.plan
        """What makes the next plan: :meth:`plan`, or :meth:`child_plan` while
        ``policy.enabled`` is false. One reference, swapped by :meth:`configure`."""
        self.configure(settings)

    def configure(self, settings: PlanSettings) -> None:
        """Publish ``settings`` (at construction and on reload; a plan in progress keeps
        the ones it started with), and log one INFO line when the ordering turns on or off."""
        was_enabled = self.settings.enabled
        self.settings = settings
        self.make_plan = self.plan if settings.enabled else self.child_plan
        if settings.enabled != was_enabled:
            log.info(
                "adaptive-lb: policy.enabled is now %s: %s",
                "true" if settings.enabled else "false",
                "plans are ordered by load and health again"
                if settings.enabled
                else "every plan is the child policy's own, unchanged (tracking, health, "
                "metrics and decision events carry on)",
            )

    def decisions(self) -> dict[str, int]:
        """Plans made so far, by :data:`DECISION_POSITIONS`."""
        return {position: counter_value(c) for position, c in self._decisions.items()}

    def child_plan(
        self, working_keyspace: str | None, query: Any, record: PlanRecord | None = None
    ) -> Iterator[Any]:
        """The child's plan for this call, exactly: its own iterator, nothing reordered or
        skipped (``policy.enabled: false``). Counted as a ``child`` decision."""
        next(self._decisions["child"])
        if record is not None:
            record.enabled = False
            record.keyspace = getattr(query, "keyspace", None) or working_keyspace
            local_rack = self.book.local_rack
            record.local_rack, record.local_rack_source = local_rack.rack, local_rack.source
        return self.child.make_query_plan(working_keyspace, query)

    def plan(
        self, working_keyspace: str | None, query: Any, record: PlanRecord | None = None
    ) -> Iterator[Any]:
        """Yield the plan's hosts (see the module docstring); fill ``record`` if given."""
        topology = self.book.topology
        settings = self.settings
        chain = self.chain
        if record is not None:
            local_rack = self.book.local_rack
            record.local_rack, record.local_rack_source = local_rack.rack, local_rack.source
        decisions = self._decisions
        yielded: set[int] | None = None
        rest: Iterator[Any] | None = None
        keyspace = working_keyspace
        in_child = False  # an exception raised by the child is the child's, not ours
        # The best replica when it goes first, before the others are ordered. It is yielded
        # outside the try blocks: most plans are dropped after their first host, and a
        # generator closed inside a try block runs its handler (~1,400 instructions).
        head: HostView[HostStats] | None = None
        local: tuple[HostView[HostStats], ...] = ()
        allowed: set[int] | None = None
        replicas: Sequence[HostView[HostStats]] = ()
        fill: list[HostView[HostStats]] | None = None
        try:
            if query is not None:
                keyspace = query.keyspace or working_keyspace
                if chain.target_host_aware and getattr(query, "target_host", None):
                    in_child = True
                    rest = iter(self.child.make_query_plan(working_keyspace, query))
                    in_child = False
                else:
                    local = topology.local
            else:
                local = topology.local

            if local and self.resolver is not None:
                if not chain.membership_known:
                    # A policy we cannot predict: materialise its plan once and choose
                    # candidates only among the hosts it actually yields.
                    in_child = True
                    plan = list(self._rest_plan(keyspace, query))
                    in_child = False
                    rest = iter(plan)
                    allowed = {id(host) for host in plan}

                if settings.token_aware and keyspace is not None and query is not None:
                    routing_key = query.routing_key
                    if routing_key is not None:
                        replicas, cache_hit = self.resolver.replicas(
                            keyspace, routing_key, query, topology
                        )
                        if replicas and (chain.predicates or allowed is not None):
                            # A TokenAwarePolicy yields every live local replica, whatever
                            # its own child's plan holds: only host filters still apply.
                            replicas = self._eligible(
                                replicas, allowed if chain.token_aware is None else None
                            )
                        if record is not None:
                            record.cache_hit = cache_hit
                if record is not None:
                    record.keyspace = keyspace
                    record.replicas = replicas

                lwt = False
                if replicas and settings.lwt_deterministic:
                    is_lwt = getattr(query, "is_lwt", None)
                    lwt = (is_lwt is not None and is_lwt()) or query.consistency_level in _SERIAL
                position: str | None
                if lwt:
                    ordered = order_lwt(replicas)
                    position = "replica"
                    if record is not None:
                        record.lwt = True
                elif replicas:
                    if record is None or record.brief:
                        # The best replica goes first, before the others are ordered, when
                        # no non-replica can beat it: none at all (the common case when
                        # idle), or none of this plan's fill hosts (under load). A plan
                        # recording every candidate orders them all at once.
                        best, best_score = best_replica(replicas)
                        if best_score < settings.non_replica_penalty * topology.min_rack_penalty:
                            head = best
                        else:
                            fill = self._fill(local, allowed, replicas, settings.sample_size)
                            if best_score < lowest_score(fill, settings.non_replica_penalty):
                                head = best
                    if head is None:
                        if fill is None:
                            fill = self._fill(local, allowed, replicas, settings.sample_size)
                        ordered = order(replicas, fill, settings.non_replica_penalty)
                        position = None  # known once ordered: see below
                    else:
                        next(decisions["replica"])
                        if record is not None:  # a brief record is complete here
                            record.position, record.candidates = "replica", (head,)
                else:
                    ordered = order((), self._fill(local, allowed, (), settings.sample_size), 1.0)
                    position = "local"
                if head is None:
                    if record is not None:
                        record.candidates = ordered
                    yielded = set()
                    if ordered:
                        if position is None:
                            position = "replica" if ordered[0] in replicas else "non_replica"
                        next(decisions[position])
                        if record is not None:
                            record.position = position
                    # Recorded before they are yielded: one C-level pass instead of a set
                    # insert per host (nothing between the yields below can raise).
                    yielded.update(map(id, map(_HOST, ordered)))
                    for view in ordered:
                        yield view.host
            if rest is None and head is None:
                in_child = True
                rest = iter(self._rest_plan(keyspace, query))
        except Exception:
            if in_child:
                raise  # as the child alone would have: not ours to count or retry
            head = None
            rest = self._recover(working_keyspace, query, record, rest, yielded)
        else:
            if head is None and not yielded:
                # No local candidate (or a target host): the child's plan decides.
                next(decisions["child"])
                if record is not None:
                    record.position = "child"

        if head is not None:
            yield head.host
            yielded = {id(head.host)}
            try:
                others = list(replicas)
                others.remove(head)  # C-level, by identity first
                if fill is None:
                    fill = self._fill(local, allowed, replicas, settings.sample_size)
                ordered = order(others, fill, settings.non_replica_penalty)
                if record is not None:
                    record.candidates = ordered
                yielded.update(map(id, map(_HOST, ordered)))
                for view in ordered:
                    yield view.host
                if rest is None:
                    in_child = True
                    rest = iter(self._rest_plan(keyspace, query))
            except Exception:
                if in_child:
                    raise
                rest = self._recover(working_keyspace, query, record, rest, yielded)

        # The rest of the child's plan, each host once (a child may repeat a host).
        if yielded is None:
            yielded = set()
        assert rest is not None  # set on every path above
        for host in rest:
            key = id(host)
            if key not in yielded:
                yielded.add(key)
                yield host

    def _recover(
        self,
        working_keyspace: str | None,
        query: Any,
        record: PlanRecord | None,
        rest: Iterator[Any] | None,
        yielded: set[int] | None,
    ) -> Iterator[Any]:
        """After an internal error: count it, and go on with the child's plan (``rest`` if
        it was already asked for). Counted a ``fallback`` decision if no host was out yet."""
        self._on_error()
        if record is not None:
            record.fallback = True
        if rest is None:
            rest = iter(self.child.make_query_plan(working_keyspace, query))
        if not yielded:
            next(self._decisions["fallback"])
            if record is not None:
                record.position = "fallback"
        return rest

    def _rest_plan(self, keyspace: str | None, query: Any) -> Iterator[Any]:
        """The child's plan, looking through the stock wrappers whose work is done here."""
        chain = self.chain
        if chain.token_aware is None and not chain.predicates and not chain.target_host_aware:
            return self.child.make_query_plan(keyspace, query)
        plan = chain.base.make_query_plan(keyspace, query)
        if not chain.predicates:
            return plan
        predicates = chain.predicates
        return (host for host in plan if all(p(host) for p in predicates))

    def _eligible(
        self, views: Sequence[HostView[HostStats]], allowed: set[int] | None
    ) -> list[HostView[HostStats]]:
        predicates = self.chain.predicates
        return [
            view
            for view in views
            if (allowed is None or id(view.host) in allowed)
            and all(p(view.host) for p in predicates)
        ]

    def _fill(
        self,
        local: tuple[HostView[HostStats], ...],
        allowed: set[int] | None,
        replicas: Sequence[HostView[HostStats]],
        sample_size: int,
    ) -> list[HostView[HostStats]]:
        """The plan's fill hosts: up to ``sample_size`` candidates in all with ``replicas``,
        from the local candidates the child would yield (:func:`fill_hosts`)."""
        pool: tuple[HostView[HostStats], ...] | list[HostView[HostStats]] = local
        if allowed is not None or self.chain.predicates:
            pool = self._eligible(local, allowed)
        return fill_hosts(pool, sample_size - len(replicas), replicas)
