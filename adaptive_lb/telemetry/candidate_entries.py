"""The text of a decision's candidates: one entry per candidate, ``address:port
in_flight=N health=STATE penalty=P score=S replica=True|False server_load=L latency=F``
(see :data:`adaptive_lb.telemetry.tracing.CANDIDATES_ATTRIBUTE`).

A traced request formats one entry per candidate, and formatting floats is most of what an
entry costs. What changes only with a health refresh -- a host's address, its health
state, penalty and factors -- is formatted once and reused; per request only the in-flight
count and the score are (the score as an integer when the penalty is a whole number, the
common case: the same text ``%.6g`` gives).

May import: the score (:func:`~adaptive_lb.plan.scoring.penalty_of`).
"""

from __future__ import annotations

from typing import Any

from adaptive_lb.plan.scoring import penalty_of

__all__ = ["candidate_entry"]

# One % operation per entry (a format that is a name: ruff's UP031 leaves it be).
_WHOLE = "%s%d%s%d%s"
_ANY = "%s%d%s%.6g%s"
_MIDDLE = " health=%s penalty=%.6g score="
_END = " replica=%s server_load=%.3g latency=%.3g"

_LIMIT = 1024
"""Entries of each memo; a memo holding more is emptied."""

_heads: dict[int, tuple[Any, str]] = {}
"""``id(host) -> (host, "address:port in_flight=")``."""
_tails: dict[tuple[Any, ...], tuple[str, str, int | None]] = {}
"""``(penalty, health, replica, server_load, latency) -> (" health=.. score=", " replica=..
latency=..", the penalty as an int when whole)``."""


def candidate_entry(
    view: Any, is_replica: bool, scored_as_replica: bool, non_replica_penalty: float
) -> str:
    """The entry of the candidate ``view`` (a :class:`~adaptive_lb.plan.scoring.HostView`):
    ``is_replica`` as recorded, ``scored_as_replica`` as scored (every candidate is, without
    a replica set)."""
    host = view.host
    stats = view.stats
    in_flight = stats.in_flight
    penalty = penalty_of(view, scored_as_replica, non_replica_penalty)
    health = stats.health_state._value_  # a str: an Enum's hash is a Python call
    server_load = stats.server_load
    latency = stats.latency_factor
    key = (penalty, health, is_replica, server_load, latency)
    tail = _tails.get(key)
    if tail is None:
        tail = _tail(penalty, health, is_replica, server_load, latency)
        if len(_tails) >= _LIMIT:
            _tails.clear()
        _tails[key] = tail
    known = _heads.get(id(host))
    if known is None or known[0] is not host:
        port = getattr(host.endpoint, "port", None)
        head = f"{host.address} in_flight=" if port is None else f"{host.address}:{port} in_flight="
        if len(_heads) >= _LIMIT:
            _heads.clear()
        _heads[id(host)] = known = (host, head)
    middle, end, whole = tail
    if whole is not None:
        score = (in_flight + 1) * whole
        if score < 1_000_000:  # below 1e6, %.6g writes a whole number as %d does
            return _WHOLE % (known[1], in_flight, middle, score, end)
    return _ANY % (known[1], in_flight, middle, (in_flight + 1) * penalty, end)


def _tail(
    penalty: float, health: str, is_replica: bool, server_load: float, latency: float
) -> tuple[str, str, int | None]:
    middle = _MIDDLE % (health, penalty)
    end = _END % (is_replica, server_load, latency)
    whole = int(penalty) if float(penalty).is_integer() and 0 <= penalty < 1_000_000 else None
    return middle, end, whole
