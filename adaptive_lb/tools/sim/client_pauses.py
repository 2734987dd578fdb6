"""The client's own pauses: a garbage collection, CPU steal, the GIL held by a busy thread.

A paused client process does nothing: it neither reads its sockets nor sends, and its timers
fire late. :class:`ClientPauses` is one client's pauses (scenario key ``client_pauses``):
Poisson arrivals at ``rate`` a second (each drawn from the end of the previous pause: a
process is not paused twice at once), each lasting a duration drawn uniformly between
``min_ms`` and ``max_ms``, from a random stream of its own (the same for every policy). While
a client is paused (:class:`~adaptive_lb.tools.sim.workload.Client`,
:class:`~adaptive_lb.tools.sim.own_requests.OwnRequests`):

* an answer that arrives is handled at the pause's end: its latency, as the policy's
  ``HostStats`` and the pool count see it, includes the wait (the driver's I/O thread reads
  it then);
* a request the application starts is planned and sent at the pause's end (its latency as
  the application sees it includes the wait; the policy's only from the send);
* a client-side timeout, and a probe's or load read's, fires at the pause's end;
* the periodic tick (:func:`schedule_tick`: adaptive-lb's health refresh, a baseline's
  timer) runs at the pause's end, and adaptive-lb's is told how late it ran first, as
  :class:`adaptive_lb.runtime.refresher.HealthRefresher` measures its own sleep:
  ``policy.health.lateness.observe(now_ns, late_s)``; the next tick is one interval after.

Imports the simulator's engine and (for types) its scenario only.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from adaptive_lb.tools.sim.engine import NS_PER_S, Engine

if TYPE_CHECKING:
    from adaptive_lb.tools.sim.scenario import ClientPausesSpec

__all__ = ["ClientPauses", "client_pauses", "pause_summary", "schedule_tick"]

_NEVER = 2**62


class ClientPauses:
    """One client's pauses, drawn lazily in time order (so a run is a function of its seed
    whatever it asks), and what they delayed. ``rate`` 0: only the given ``windows``."""

    __slots__ = (
        "_high_ns",
        "_low_ns",
        "_mean_gap_ns",
        "_next_ns",
        "_rng",
        "_stop_ns",
        "answers_late",
        "ends",
        "refreshes_late",
        "sends_late",
        "starts",
    )

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        rate: float = 0.0,
        min_ms: float = 5.0,
        max_ms: float = 50.0,
        start_s: float = 0.0,
        end_s: float | None = None,
        windows: Sequence[tuple[int, int]] = (),
    ) -> None:
        self._rng = rng if rng is not None else random.Random(0)
        self._low_ns = round(min_ms * 1e6)
        self._high_ns = round(max_ms * 1e6)
        self._mean_gap_ns = NS_PER_S / rate if rate > 0 else 0.0
        self._stop_ns = round(end_s * NS_PER_S) if end_s is not None else _NEVER
        self.starts: list[int] = [a for a, _ in sorted(windows)]
        """Pause starts, ns (those drawn so far)."""
        self.ends: list[int] = [b for _, b in sorted(windows)]
        """Pause ends, ns: a pause is ``[start, end)``."""
        self._next_ns = _NEVER
        if rate > 0:
            self._next_ns = round(start_s * NS_PER_S) + self._gap()
        self.answers_late = 0
        """Answers (user requests, probes, load reads) and timeouts handled at a pause's end."""
        self.sends_late = 0
        """Requests the application started during a pause, sent at its end."""
        self.refreshes_late = 0
        """Ticks run late, at a pause's end."""

    def _gap(self) -> int:
        return int(self._rng.expovariate(1.0) * self._mean_gap_ns)

    def _draw_until(self, now_ns: int) -> None:
        while self._next_ns <= now_ns and self._next_ns < self._stop_ns:
            start = self._next_ns
            end = start + round(self._rng.uniform(self._low_ns, self._high_ns))
            self.starts.append(start)
            self.ends.append(end)
            self._next_ns = end + self._gap()

    def resume_time(self, now_ns: int) -> int:
        """The end of the pause the client is in at ``now_ns``; ``now_ns`` if it runs."""
        self._draw_until(now_ns)
        i = bisect.bisect_right(self.starts, now_ns) - 1
        if i >= 0 and now_ns < self.ends[i]:
            return self.ends[i]
        return now_ns

    def defer(self, engine: Engine, callback: Callable[[Any], None], arg: Any) -> bool:
        """If the client is paused now, run ``callback(arg)`` at the pause's end instead
        (and say so)."""
        now = engine.now
        resume = self.resume_time(now)
        if resume <= now:
            return False
        engine.at(resume, callback, arg)
        return True

    def windows(self, until_ns: int) -> list[tuple[int, int]]:
        """The pauses that started before ``until_ns``."""
        self._draw_until(until_ns)
        count = bisect.bisect_left(self.starts, until_ns)
        return list(zip(self.starts[:count], self.ends[:count], strict=True))


def client_pauses(spec: ClientPausesSpec, index: int, rng: random.Random) -> ClientPauses | None:
    """The pauses of the ``index``-th client (0-based, in creation order) under ``spec``;
    None when it is not paused."""
    if spec.rate <= 0 or (spec.clients is not None and index >= spec.clients):
        return None
    return ClientPauses(
        rng,
        rate=spec.rate,
        min_ms=spec.min_ms,
        max_ms=spec.max_ms,
        start_s=spec.start,
        end_s=spec.end,
    )


def schedule_tick(
    engine: Engine,
    interval_ns: int,
    tick: Callable[[], Any],
    *,
    start_ns: int,
    pauses: ClientPauses | None = None,
    policy: Any = None,
) -> None:
    """Run ``tick()`` every ``interval_ns`` from ``start_ns``; a tick due while the client
    is paused runs at the pause's end, after ``policy.health.lateness.observe(now_ns,
    late_s)`` (when the policy has one) with how late it ran, and the next is one interval
    after it (the refresh thread sleeps an interval after each refresh)."""
    if pauses is None:
        engine.every(interval_ns, tick, start_ns=start_ns)
        return
    lateness = getattr(getattr(policy, "health", None), "lateness", None)

    def fire(due: int) -> None:
        now = engine.now
        resume = pauses.resume_time(now)
        if resume > now:
            engine.at(resume, fire, due)
            return
        if now > due:
            pauses.refreshes_late += 1
            if lateness is not None:
                lateness.observe(now, (now - due) / NS_PER_S)
        tick()
        engine.at(now + interval_ns, fire, now + interval_ns)

    engine.at(start_ns, fire, start_ns)


def pause_summary(pauses: Sequence[ClientPauses], until_ns: int) -> dict[str, Any]:
    """What the clients' pauses were and what they delayed, for a run that ended at
    ``until_ns``: clients paused, pauses, paused time (ms, all clients), the longest pause
    (ms), answers handled late, sends delayed, ticks run late."""
    windows = [w for p in pauses for w in p.windows(until_ns)]
    lengths = [b - a for a, b in windows]
    return {
        "clients": len(pauses),
        "pauses": len(windows),
        "paused_ms": round(sum(lengths) / 1e6, 1),
        "longest_ms": round(max(lengths, default=0) / 1e6, 1),
        "answers_late": sum(p.answers_late for p in pauses),
        "sends_late": sum(p.sends_late for p in pauses),
        "refreshes_late": sum(p.refreshes_late for p in pauses),
    }
