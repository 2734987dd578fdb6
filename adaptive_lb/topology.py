"""The policy's copy-on-write view of the cluster.

A :class:`Topology` is immutable. It is rebuilt (or copied with one host changed) only on
topology events -- populate, on_up, on_down, on_add, on_remove -- and published by swapping
one reference, so :meth:`make_query_plan` reads it without a lock and a plan in progress
keeps the snapshot it started with.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from attrs import define, field

from adaptive_lb.scoring import HostView

__all__ = ["Topology"]


@define(frozen=True, slots=True)
class Topology:
    """Immutable snapshot of the hosts the child policy knows, with their distances."""

    generation: int = 0
    """Increases with every change; replica-cache entries remember the one they saw."""
    by_id: Mapping[int, HostView] = field(factory=dict)
    """Every known host's view, keyed by ``id(host)`` (driver ``Host`` objects are unique
    per endpoint, and ``id`` avoids the driver's Python-level ``Host.__hash__``)."""
    local: tuple[HostView, ...] = ()
    """Candidate-eligible hosts (live and LOCAL/LOCAL_RACK), in a random order."""
    by_host_id: Mapping[Any, HostView] = field(factory=dict)
    """Views keyed by the driver's ``host_id`` (tablet replicas name hosts that way)."""
    min_rack_penalty: float = 1.0
    """Smallest rack penalty among ``local``: a lower bound for any candidate's score factor."""

    @classmethod
    def build(cls, views: Iterable[HostView], generation: int) -> Topology:
        """Make a snapshot from ``views`` (the local order is shuffled)."""
        by_id: dict[int, HostView] = {}
        by_host_id: dict[Any, HostView] = {}
        for view in views:
            by_id[id(view.host)] = view
            host_id = getattr(view.host, "host_id", None)
            if host_id is not None:
                by_host_id[host_id] = view
        local = [view for view in by_id.values() if view.candidate]
        random.shuffle(local)
        return cls(
            generation=generation,
            by_id=by_id,
            local=tuple(local),
            by_host_id=by_host_id,
            min_rack_penalty=min((v.rack_penalty for v in local), default=1.0),
        )

    def with_view(self, view: HostView, generation: int) -> Topology:
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
        return Topology(
            generation=generation,
            by_id=by_id,
            local=tuple(local),
            by_host_id=by_host_id,
            min_rack_penalty=min((v.rack_penalty for v in local), default=1.0),
        )

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
        return Topology(
            generation=generation,
            by_id=by_id,
            local=local,
            by_host_id=by_host_id,
            min_rack_penalty=min((v.rack_penalty for v in local), default=1.0),
        )

    def view_of(self, host: Any) -> HostView | None:
        """The view of ``host`` (the same object the driver passes around), if known."""
        return self.by_id.get(id(host))
