"""The policy's copy-on-write view of the cluster.

A :class:`Topology` is immutable. It is rebuilt (or copied with one host changed) only on
topology events -- populate, on_up, on_down, on_add, on_remove -- and published by swapping
one reference, so :meth:`make_query_plan` reads it without a lock and a plan in progress
keeps the snapshot it started with. :class:`TopologyBook` keeps the hosts a policy knows and
publishes the snapshots.

Imports attrs, the score, the locality and the statistics only.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from attrs import define, field

from adaptive_lb.plan.locality import LocalRack
from adaptive_lb.plan.scoring import HostView

if TYPE_CHECKING:
    from adaptive_lb.stats.host import HostStats

__all__ = ["Topology", "TopologyBook"]


@define(frozen=True, slots=True)
class Topology:
    """Immutable snapshot of the hosts the child policy knows, with their distances."""

    generation: int = 0
    """Increases with every change; replica-cache entries remember the one they saw."""
    by_id: Mapping[int, HostView[HostStats]] = field(factory=dict)
    """Every known host's view, keyed by ``id(host)`` (driver ``Host`` objects are unique
    per endpoint, and ``id`` avoids the driver's Python-level ``Host.__hash__``)."""
    local: tuple[HostView[HostStats], ...] = ()
    """Candidate-eligible hosts (live and LOCAL/LOCAL_RACK), in a random order."""
    by_host_id: Mapping[Any, HostView[HostStats]] = field(factory=dict)
    """Views keyed by the driver's ``host_id`` (tablet replicas name hosts that way)."""
    min_rack_penalty: float = 1.0
    """Smallest rack penalty among ``local``: a lower bound for any candidate's score factor."""

    @classmethod
    def _of(
        cls,
        generation: int,
        by_id: Mapping[int, HostView[HostStats]],
        local: Iterable[HostView[HostStats]],
        by_host_id: Mapping[Any, HostView[HostStats]],
    ) -> Topology:
        local = tuple(local)
        return cls(
            generation=generation,
            by_id=by_id,
            local=local,
            by_host_id=by_host_id,
            min_rack_penalty=min((v.rack_penalty for v in local), default=1.0),
        )

    @classmethod
    def build(cls, views: Iterable[HostView[HostStats]], generation: int) -> Topology:
        """Make a snapshot from ``views`` (the local order is shuffled)."""
        by_id: dict[int, HostView[HostStats]] = {}
        by_host_id: dict[Any, HostView[HostStats]] = {}
        for view in views:
            by_id[id(view.host)] = view
            host_id = getattr(view.host, "host_id", None)
            if host_id is not None:
                by_host_id[host_id] = view
        local = [view for view in by_id.values() if view.candidate]
        random.shuffle(local)
        return cls._of(generation, by_id, local, by_host_id)

    def with_view(self, view: HostView[HostStats], generation: int) -> Topology:
        """A copy with ``view`` added or replacing the view of the same host: O(N) copies of
        C-level containers, no per-host Python work for the other hosts."""
        key = id(view.host)
        by_id = dict(self.by_id)
        old = by_id.get(key)
        by_id[key] = view
        local = [v for v in self.local if v is not old] if old is not None else list(self.local)
        if view.candidate:
            local.insert(random.randint(0, len(local)), view)
        by_host_id = self.by_host_id
        host_id = getattr(view.host, "host_id", None)
        if host_id is not None:
            by_host_id = dict(by_host_id)
            by_host_id[host_id] = view
        return Topology._of(generation, by_id, local, by_host_id)

    def without_host(self, host: Any, generation: int) -> Topology:
        """A copy with ``host`` forgotten."""
        key = id(host)
        old = self.by_id.get(key)
        if old is None:
            return self
        by_id = dict(self.by_id)
        del by_id[key]
        local = tuple(v for v in self.local if v is not old)
        by_host_id = self.by_host_id
        host_id = getattr(host, "host_id", None)
        if host_id is not None and by_host_id.get(host_id) is old:
            by_host_id = dict(by_host_id)
            del by_host_id[host_id]
        return Topology._of(generation, by_id, local, by_host_id)

    def view_of(self, host: Any) -> HostView[HostStats] | None:
        """The view of ``host`` (the same object the driver passes around), if known."""
        return self.by_id.get(id(host))


class TopologyBook:
    """The hosts a policy knows (populate / on_add, until on_remove) and which of them are
    live, published as :class:`Topology` snapshots in :attr:`topology`.

    ``make_view(host, live)`` builds a host's view (distance, rack, statistics: the
    policy's knowledge); ``local_dc()`` names the child's local datacenter, which a
    ``DCAwareRoundRobinPolicy`` may infer from the first host it sees -- when it changes,
    every distance may have, and the snapshot is rebuilt. Writers serialise on :attr:`lock`
    (reentrant: callers may hold it across several calls); readers take :attr:`topology`
    without a lock.
    """

    def __init__(
        self, make_view: Callable[[Any, bool], HostView[HostStats]], local_dc: Callable[[], Any]
    ) -> None:
        self.lock = threading.RLock()
        self.topology = Topology()
        """The snapshot in force (read lock-free)."""
        self._make_view = make_view
        self._local_dc = local_dc
        self._local_dc_seen: Any = None
        self._generation = 0
        self._hosts: dict[int, Any] = {}
        self._live: set[int] = set()
        self.local_rack = LocalRack()
        """The client's rack: configured, the child's or learned (``make_view`` reads it;
        the health refresh learns it and rebuilds the snapshot when it changes)."""

    def knows(self, host: Any) -> bool:
        """``host`` was added and not removed since."""
        return id(host) in self._hosts

    def is_live(self, host: Any) -> bool:
        """``host`` is known and was last reported up."""
        return id(host) in self._live

    def reset(self, hosts: Iterable[Any]) -> list[Any]:
        """Know exactly ``hosts``, all live (populate); returns the hosts forgotten."""
        with self.lock:
            previous = self._hosts
            self._hosts = {id(host): host for host in hosts}
            self._live = set(self._hosts)
            self.rebuild()
            return [host for key, host in previous.items() if key not in self._hosts]

    def rebuild(self) -> None:
        """Rebuild the snapshot from scratch (every view made anew)."""
        with self.lock:
            self._local_dc_seen = self._local_dc()
            self._generation += 1
            live = self._live
            views = [self._make_view(host, key in live) for key, host in self._hosts.items()]
            self.topology = Topology.build(views, self._generation)

    def set_live(self, host: Any, live: bool, known_only: bool = False) -> bool:
        """Record ``host`` as live or not (adding it if unknown, unless ``known_only``) and
        publish the change; True if published."""
        with self.lock:
            key = id(host)
            if known_only and key not in self._hosts:
                return False
            self._hosts[key] = host
            if live:
                self._live.add(key)
            else:
                self._live.discard(key)
            if self._local_dc() != self._local_dc_seen:
                self.rebuild()
                return True
            self._generation += 1
            self.topology = self.topology.with_view(self._make_view(host, live), self._generation)
            return True

    def remove(self, host: Any) -> None:
        """Forget ``host`` and publish a snapshot without it."""
        with self.lock:
            self._hosts.pop(id(host), None)
            self._live.discard(id(host))
            self._generation += 1
            self.topology = self.topology.without_host(host, self._generation)
