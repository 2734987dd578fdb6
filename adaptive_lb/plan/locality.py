"""Locality: how far each rack is from this client, and which rack is the client's own,
learned from the latency already measured (pure logic, no driver import, no clock: callers
pass the time).

:class:`RackDistances` keeps each rack's distance: the lower quartile of its healthy
hosts' p50 (so that a slow host, not flagged yet, cannot pull its rack away), smoothed over
a statistics window and remembered while the rack gets too little traffic to
be measured. The health peers use it (:mod:`adaptive_lb.health.peers`): a far rack's hosts
are compared with their datacenter's hosts moved to the same distance, so distance alone
never makes a host SLOW.

:class:`LocalRack` is the client's rack as the policy uses it (``policy.local_rack``): the
configured rack, else the child policy's, else -- with ``auto`` -- the rack
:class:`RackLearner` learned: the rack of the local datacenter whose healthy hosts (each
with ``min_samples``) answer fastest at the median, by ``rack_learning.margin``, for
``rack_learning.learn_after``. Only *fresh* measurements count (racks measured at this
refresh), and only once every rack with live hosts is measured: a rack that gets no traffic,
or whose hosts are all unhealthy, is never assumed near or far. A learned rack is
doubted when another rack beats it by the margin, or when it got slower by the margin than
when it was learned (the client moved: what was near is far now, and the racks that are
near now may get no traffic to show it); doubted for ``rack_learning.relearn_after``, it
is forgotten, which spreads traffic over every rack again (no rack penalty) and lets the
nearest one be learned from fresh numbers. Unhealthy hosts are not measured, and a rack
without a measured host leaves the verdict as it is: one slow local node (SLOW), a restart
(down, then WARMING) or a GC pause (ERRORING) never flips it.

:func:`rack_proximity` ranks the other racks: ``non_local_rack_penalty`` treats every rack
but the client's own alike, but from zone A, zone C may be 250 µs away and zone B 800 µs;
when the local replica is busy or unhealthy the request should go to the nearer remote
replica. At each health refresh the median of each remote rack's hosts' p50 is compared
with the lowest of those medians::

    proximity(rack) = clamp(median(rack) / min over remote racks of median(rack'), 1, cap)

and the rack factor of the score becomes ``non_local_rack_penalty x proximity``. A rack
without enough samples keeps its previous factor (avoided racks get few requests;
forgetting what was learned about them would send traffic back just to learn it again).

Imports the config only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Hashable, Mapping, Sequence

from adaptive_lb.config import RackLearningConfig

__all__ = [
    "LOCAL_RACK_SOURCES",
    "LocalRack",
    "RackDistances",
    "RackKey",
    "RackLearner",
    "rack_proximity",
    "resolve_local_rack",
]

LOCAL_RACK_SOURCES = ("configured", "child", "learned", "unknown")
"""Where the local rack in force comes from: ``policy.local_rack``, the child policy's
``local_rack``, learned (``policy.local_rack: auto``), or none known (no rack penalty)."""
AUTO = "auto"

RackKey = tuple[Hashable, Hashable]
"""``(datacenter, rack)``: rack names need not be unique across datacenters."""


class RackDistances:
    """Each rack's distance from this client, in seconds.

    :meth:`update` takes, per rack, the p50 latencies of its hosts that are HEALTHY and
    have ``min_samples`` (a SLOW host must not move its rack, nor excuse itself); the
    rack's measurement is their lower quartile (the lowest of up to four hosts): network
    distance is a floor every answer pays, while a host slower than its rack-mates -- one
    not flagged yet, in a rack of two -- must not pass its slowness on to its rack. The
    first measurement is taken as it is; later ones move the distance exponentially, with a
    time constant of one statistics window: a host that suddenly slows down is judged
    against the distance its rack had before. A rack measured no more keeps its last
    distance. Not thread-safe: the health refresh
    (one at a time) owns it; readers get :attr:`distances`, replaced, never mutated.
    """

    def __init__(self) -> None:
        self.distances: Mapping[RackKey, float] = {}
        """Rack -> distance (seconds), as of the last update (a new mapping each time)."""
        self._updated_ns: dict[RackKey, int] = {}

    def update(
        self, measured: Mapping[RackKey, Sequence[float]], now_ns: int, time_constant_s: float
    ) -> None:
        """Blend in this refresh's measurements (see the class docstring)."""
        if not any(measured.values()):
            return
        distances = dict(self.distances)
        for rack, values in measured.items():
            if not values:
                continue
            value = sorted(values)[(len(values) - 1) // 4]
            old = distances.get(rack)
            if old is not None and time_constant_s > 0:
                elapsed_s = max(0.0, (now_ns - self._updated_ns[rack]) / 1e9)
                value = old + (value - old) * (1.0 - math.exp(-elapsed_s / time_constant_s))
            distances[rack] = value
            self._updated_ns[rack] = now_ns
        self.distances = distances

    def forget(self, racks: set[RackKey]) -> None:
        """Forget every rack not in ``racks`` (they left the topology)."""
        if any(rack not in racks for rack in self.distances):
            self.distances = {r: d for r, d in self.distances.items() if r in racks}
            self._updated_ns = {r: t for r, t in self._updated_ns.items() if r in racks}


def resolve_local_rack(configured: str | None, child_rack: str | None) -> tuple[str | None, str]:
    """The local rack from the config and the child, and its source; ``(None, "learned")``
    when it is to be learned (``auto`` and the child names none), ``(None, "unknown")``
    when there is none (null and the child names none)."""
    if configured is not None and configured != AUTO:
        return configured, "configured"
    if child_rack:
        return child_rack, "child"
    return None, "learned" if configured == AUTO else "unknown"


def _clear_fastest(medians: Mapping[Hashable, float], margin: float) -> Hashable | None:
    """The rack whose median is at most (1 - margin) x every other's (None: no such rack,
    or fewer than two racks)."""
    if len(medians) < 2:
        return None
    ordered = sorted(medians.items(), key=lambda item: item[1])
    (best, fastest), (_, second) = ordered[0], ordered[1]
    return best if fastest <= (1.0 - margin) * second else None


class RackLearner:
    """Learns the client's rack from each refresh's fresh rack medians (see the module
    docstring). Not thread-safe: the health refresh (one at a time) drives it."""

    def __init__(self) -> None:
        self.rack: Hashable | None = None
        """The learned rack (None: not learned, or forgotten)."""
        self.learned_ns: int | None = None
        """When :attr:`rack` was learned."""
        self.baseline: float | None = None
        """The learned rack's median latency when it was learned (seconds)."""
        self.changes = 0
        """Times the learned rack changed (learned, forgotten)."""
        self._candidate: Hashable | None = None
        self._since_ns = 0
        self._doubt_since_ns: int | None = None

    def reset(self) -> None:
        """Forget everything learned."""
        if self.rack is not None:
            self.changes += 1
        self.rack = self.learned_ns = self.baseline = self._candidate = None
        self._doubt_since_ns = None

    def observe(
        self,
        medians: Mapping[Hashable, float],
        now_ns: int,
        config: RackLearningConfig,
        racks: Collection[Hashable] | None = None,
        required: Collection[Hashable] = (),
    ) -> bool:
        """Take this refresh's fresh medians (rack -> median p50 of its healthy hosts that
        have ``min_samples``, local datacenter only); ``racks``, when given, are the local
        datacenter's racks (a learned rack no longer among them is forgotten); a rack is
        learned only when every rack of ``required`` (those with live hosts) is measured:
        a rack that cannot be measured might be the nearest. True when :attr:`rack`
        changed."""
        if self.rack is not None and racks is not None and self.rack not in racks:
            self.reset()
            return True
        margin = config.margin
        if self.rack is None:
            complete = all(rack in medians for rack in required)
            best = _clear_fastest(medians, margin) if complete else None
            if best is None or best != self._candidate:
                self._candidate, self._since_ns = best, now_ns
                if best is None or config.learn_after > 0:
                    return False
            if (now_ns - self._since_ns) / 1e9 < config.learn_after:
                return False
            self.rack, self.learned_ns, self.baseline = best, now_ns, medians[best]
            self._candidate, self._doubt_since_ns = None, None
            self.changes += 1
            return True
        current = medians.get(self.rack)
        if current is None:  # not measured now: no evidence either way
            return False
        beaten = any(
            median <= (1.0 - margin) * current
            for rack, median in medians.items()
            if rack != self.rack
        )
        moved = self.baseline is not None and (1.0 - margin) * current > self.baseline
        if not (beaten or moved):
            self._doubt_since_ns = None
            return False
        if self._doubt_since_ns is None:
            self._doubt_since_ns = now_ns
        if (now_ns - self._doubt_since_ns) / 1e9 < config.relearn_after:
            return False
        self.reset()
        return True


class LocalRack:
    """The client's rack as the policy uses it -- configured, the child's, or learned --
    and where it comes from (:data:`LOCAL_RACK_SOURCES`). Read lock-free (a rack name and
    a source string); written by :meth:`configure` (topology rebuilds) and :meth:`observe`
    (the health refresh)."""

    def __init__(self) -> None:
        self.learner = RackLearner()
        self._fixed: str | None = None
        self._fixed_source = "unknown"
        self._learning: RackLearningConfig | None = None
        self.rack: str | None = None
        """The rack in force (None: none known; no rack penalty)."""
        self.source = "unknown"
        """One of :data:`LOCAL_RACK_SOURCES`."""

    @property
    def learning(self) -> bool:
        """The rack is to be learned (``local_rack: auto`` and the child names none)."""
        return self._learning is not None

    @property
    def learned(self) -> str | None:
        """The learned rack (None when not learning, or not learned yet)."""
        rack = self.learner.rack
        return None if self._learning is None or rack is None else str(rack)

    def configure(
        self, rack: str | None, source: str, learning: RackLearningConfig | None
    ) -> str | None:
        """Use ``rack`` from ``source`` (see :func:`resolve_local_rack`), or learn it with
        ``learning``; returns the rack in force. Cheap when nothing changed."""
        if rack != self._fixed or source != self._fixed_source or learning != self._learning:
            if learning is None:
                self.learner.reset()
            self._fixed, self._fixed_source, self._learning = rack, source, learning
            self._publish()
        return self.rack

    def observe(
        self,
        medians: Mapping[Hashable, float],
        racks: Collection[Hashable],
        now_ns: int,
        required: Collection[Hashable] = (),
    ) -> bool:
        """Feed the learner one refresh's fresh rack medians (see :meth:`RackLearner.observe`)
        when learning; True when the rack in force changed."""
        if self._learning is None:
            return False
        changed = self.learner.observe(medians, now_ns, self._learning, racks, required)
        if changed:
            self._publish()
        return changed

    def _publish(self) -> None:
        if self._fixed is not None:
            self.rack, self.source = self._fixed, self._fixed_source
        elif self._learning is not None and self.learner.rack is not None:
            self.rack, self.source = str(self.learner.rack), "learned"
        else:
            self.rack, self.source = None, "unknown"


def rack_proximity(
    latencies: Mapping[Hashable, Sequence[float]],
    previous: Mapping[Hashable, float],
    cap: float,
) -> dict[Hashable, float]:
    """The proximity factor of each remote rack.

    ``latencies`` maps a remote rack to the p50 latencies (seconds) of its hosts that have
    enough samples; ``previous`` holds the factors of the last refresh. Returns a factor in
    ``[1, cap]`` for every rack of ``latencies`` and of ``previous``. A rack with no
    measured host keeps its previous factor (or 1); so does every rack when fewer than two
    are measured (nothing to compare). ``cap`` <= 1 turns proximity off: every factor 1.
    """
    racks = {*latencies, *previous}
    if cap <= 1.0:
        return dict.fromkeys(racks, 1.0)
    result = {rack: min(cap, max(1.0, previous.get(rack, 1.0))) for rack in racks}
    medians = {rack: statistics.median(values) for rack, values in latencies.items() if values}
    nearest = min(medians.values(), default=0.0)
    if len(medians) < 2 or nearest <= 0.0:
        return result  # nothing to compare with: keep what was learned
    for rack, median in medians.items():
        result[rack] = min(cap, max(1.0, median / nearest))
    return result
