"""Candidate choice and the weighted least-loaded order (pure logic, no driver import).

The score of a candidate host is Netflix's WLLLB formula::

    score = (in_flight + 1)
            x non_local_rack_penalty   if the host is not in the client's rack
              x proximity              how much farther its rack is than the nearest
                                       remote rack (1 .. rack_proximity_cap)
            x non_replica_penalty      if the host is not a replica of the routing key
            x health_penalty           (1 when healthy, up to 64 when not)
            x server_load              the node's own view of its queues, damped
                                       (1 .. health.server_load.cap; adaptive_lb.stats.server_load)
            x latency_factor           how surely slower than its peers it answers, beyond a
                                       dead band, decaying with time (1 ..
                                       health.latency_factor.cap; adaptive_lb.stats.latency_factor)

Lower is better. Equal scores are broken at random so that equal hosts share the load
evenly (replicas by a tiny jitter, fill hosts by their random window order); LWT plans use
:func:`order_lwt` instead, which is deterministic so that every client picks the same Paxos
coordinator.

Everything here works on :class:`HostView` objects, which carry an opaque ``host`` (a driver
``Host`` in production, anything hashable in the simulator) and a live statistics object with
five attributes read lock-free: ``in_flight``, ``rack_penalty``, ``health_penalty``,
``server_load`` and ``latency_factor``.

Imports attrs only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import itemgetter
from random import random
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from attrs import define, field

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "TIE_JITTER",
    "HostLoad",
    "HostView",
    "HostWindow",
    "best_replica",
    "fill_hosts",
    "lowest_score",
    "order",
    "order_lwt",
    "penalty_of",
    "score_of",
]

TIE_JITTER = 1e-9
"""Relative random jitter added to scores: breaks exact ties uniformly at random and is far
too small to reorder hosts whose scores really differ."""


class HostLoad(Protocol):
    """What scoring reads of a host's live statistics (see
    :class:`adaptive_lb.stats.host.HostStats`)."""

    in_flight: int
    rack_penalty: float
    health_penalty: float
    server_load: float
    latency_factor: float


_Load_co = TypeVar("_Load_co", bound=HostLoad, covariant=True)
_Load = TypeVar("_Load", bound=HostLoad)
_T_co = TypeVar("_T_co", covariant=True)


@define(frozen=True, slots=True, eq=False)
class HostView(Generic[_Load_co]):
    """One host as the planner sees it in a topology snapshot.

    Generic in its statistics: scoring reads only their :class:`HostLoad` part, the policy
    (``HostView[HostStats]``) and its exporters read the rest.

    Compared by identity (``eq=False``): a view belongs to exactly one snapshot entry, and
    identity comparison keeps membership tests on the hot path cheap.
    """

    host: Any
    """The driver's ``Host`` (or a simulator's host key)."""
    stats: _Load_co
    """Live numbers of this host: at least ``in_flight``, ``rack_penalty``,
    ``health_penalty``."""
    datacenter: str | None = None
    rack: str | None = None
    is_local: bool = False
    """The child policy's distance is LOCAL or LOCAL_RACK."""
    live: bool = True
    """The child policy has been told the host is up (on_up/on_add/populate, no on_down since)."""
    rack_penalty: float = 1.0
    """``non_local_rack_penalty`` when a local rack is known and this host is outside it:
    the static part of ``stats.rack_penalty``, which also holds the rack's proximity factor
    (a lower bound of it)."""
    candidate: bool = field(init=False)
    """Live and local: may be scored and yielded ahead of the child's plan."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "candidate", self.live and self.is_local)


class HostWindow(Protocol[_T_co]):
    """What :func:`fill_hosts` needs of its fill pool: a tuple or a list (sliced and concatenated
    with itself, where a ``Sequence`` need not support ``+``)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[_T_co]: ...
    def __getitem__(self, index: slice, /) -> Self: ...
    def __add__(self, other: Self, /) -> Self: ...


# The score formula lives in this module only. score_of() is its reference form (used by
# decision records and tests); best_replica(), lowest_score() and order() inline the same
# expression, since a call per candidate would cost ~0.1 us on the hot path.
# tests/unit/test_scoring.py checks that their results are score_of's.


def penalty_of(view: HostView[HostLoad], is_replica: bool, non_replica_penalty: float) -> float:
    """The multiplier of ``in_flight + 1`` in ``view``'s score: rack x health penalties x
    server load x latency factor, x ``non_replica_penalty`` unless ``is_replica``."""
    stats = view.stats
    penalty = stats.rack_penalty * stats.health_penalty * stats.server_load * stats.latency_factor
    return penalty if is_replica else penalty * non_replica_penalty


def score_of(view: HostView[HostLoad], is_replica: bool, non_replica_penalty: float) -> float:
    """The WLLLB score of ``view`` (without tie-break jitter)."""
    return (view.stats.in_flight + 1) * penalty_of(view, is_replica, non_replica_penalty)


def best_replica(replicas: Sequence[HostView[_Load]]) -> tuple[HostView[_Load], float]:
    """The lowest-scored of ``replicas`` (not empty) and its score, exact ties broken
    uniformly at random (a jitter of :data:`TIE_JITTER`, one ``random()`` per replica)."""
    best = replicas[0]
    best_score = _INFINITY
    for view in replicas:
        stats = view.stats
        score = (
            (stats.in_flight + 1)
            * stats.rack_penalty
            * stats.health_penalty
            * stats.server_load
            * stats.latency_factor
            * (1.0 + TIE_JITTER * random())
        )
        if score < best_score:
            best_score = score
            best = view
    return best, best_score


def fill_hosts(
    local: HostWindow[HostView[_Load]], fill_count: int, exclude: Sequence[HostView[_Load]]
) -> list[HostView[_Load]]:
    """Up to ``fill_count`` hosts of ``local`` not in ``exclude``: a window of ``local``
    starting at a random offset.

    ``local`` must hold candidates only, in a random order (``Topology.local`` is shuffled
    when a snapshot is built), so the window is random across plans for one ``random()``
    call, where ``random.sample`` costs ~4 us for 8 of 45 on this machine; its order is
    random too.
    """
    fill: list[HostView[_Load]] = []
    n = len(local)
    if fill_count > 0 and n:
        offset = int(random() * n)
        # Two C-level slices: cheaper than index arithmetic per host.
        for view in local[offset:] + local[:offset] if offset else local:
            if view not in exclude:
                fill.append(view)
                fill_count -= 1
                if not fill_count:
                    break
    return fill


def lowest_score(fill: Sequence[HostView[_Load]], non_replica_penalty: float) -> float:
    """The lowest score among the fill hosts ``fill`` (scored as non-replicas); infinity
    when there is none."""
    lowest = _INFINITY
    for view in fill:
        stats = view.stats
        score = (
            (stats.in_flight + 1)
            * stats.rack_penalty
            * stats.health_penalty
            * stats.server_load
            * stats.latency_factor
            * non_replica_penalty
        )
        if score < lowest:
            lowest = score
    return lowest


def order(
    replicas: Sequence[HostView[_Load]],
    fill: Sequence[HostView[_Load]],
    non_replica_penalty: float,
) -> list[HostView[_Load]]:
    """``replicas`` and the fill hosts ``fill`` (from :func:`fill_hosts`, scored with
    ``non_replica_penalty``) by ascending score.

    Exact ties among replicas are broken uniformly at random (a jitter of
    :data:`TIE_JITTER`). Ties among fill hosts keep their window order (the sort is
    stable), which is random already: among equal hosts each is first equally often, with
    no ``random()`` call per host.
    """
    keyed: list[tuple[float, HostView[_Load]]] = []
    append = keyed.append
    for view in replicas:
        stats = view.stats
        append(
            (
                (stats.in_flight + 1)
                * stats.rack_penalty
                * stats.health_penalty
                * stats.server_load
                * stats.latency_factor
                * (1.0 + TIE_JITTER * random()),
                view,
            )
        )
    for view in fill:
        stats = view.stats
        append(
            (
                (stats.in_flight + 1)
                * stats.rack_penalty
                * stats.health_penalty
                * stats.server_load
                * stats.latency_factor
                * non_replica_penalty,
                view,
            )
        )
    keyed.sort(key=_first)
    return [view for _, view in keyed]


def order_lwt(replicas: Sequence[HostView[_Load]]) -> list[HostView[_Load]]:
    """Deterministic order for lightweight transactions: the token ring's replica order,
    with hosts whose health penalty is above 1 moved last (stable, by penalty).

    In-flight counts differ between clients, so they are deliberately ignored here: every
    client must agree on the first replica to avoid Paxos contention.
    """
    if all(view.stats.health_penalty <= 1.0 for view in replicas):
        return list(replicas)
    return sorted(replicas, key=_health_penalty)


_INFINITY = float("inf")
_first = itemgetter(0)
"""Sort key of a (score, view) pair: C-level, where a Python function costs a call per
candidate."""


def _health_penalty(view: HostView[HostLoad]) -> float:
    return view.stats.health_penalty
