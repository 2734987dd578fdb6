"""How long each host has gone without an answer while requests wait on it (pure logic).

Two clocks per host, read at each health refresh from the host's counters (nothing on the
request path):

* **stalled**: tracked attempts in flight and no tracked answer (a timeout is not an
  answer). The stall rule of :mod:`adaptive_lb.health.rules` judges by it: its requests
  are the ones whose answers the window waits for.
* **unanswered**: requests in flight by the driver's count (:attr:`HostStats.in_flight`:
  untracked requests too) and neither a tracked answer nor a probe answer. Under sampling a
  stall may catch only untracked requests, which the stall clock cannot see; this one makes
  the host *suspected* and probed (:mod:`adaptive_lb.health.probes`), and the probe, always
  tracked, decides -- whichever requests happened to be sampled.

Imports the statistics only.
"""

from __future__ import annotations

from collections.abc import Hashable

from adaptive_lb.stats.host import HostStats

__all__ = ["SilenceClocks"]

_NS = 1_000_000_000


class SilenceClocks:
    """The two clocks of every host; used by the health model under its own lock."""

    def __init__(self) -> None:
        self._answered: dict[Hashable, tuple[int, int]] = {}
        """Per host: (answers counted at the last reading, since when it has had tracked
        requests in flight without a new one, ns)."""
        self._heard: dict[Hashable, tuple[tuple[int, int | None], int]] = {}
        """Per host: (answers and last probe answer at the last reading, since when it has
        had requests in flight without either changing, ns)."""

    def stalled_s(self, key: Hashable, host: HostStats, in_flight: int, now_ns: int) -> float:
        """Seconds ``key`` has had ``in_flight`` tracked attempts without answering any.
        Timeouts are not answers; client-side ones are counted the same way as server-side
        ones, so neither is."""
        answers = host.requests_total - host.timeouts_total
        previous = self._answered.get(key)
        if previous is None or previous[0] != answers or in_flight <= 0:
            self._answered[key] = (answers, now_ns)
            return 0.0
        return (now_ns - previous[1]) / _NS

    def unanswered_s(self, key: Hashable, host: HostStats, now_ns: int) -> float:
        """Seconds ``key`` has had requests in flight by the driver's count without a
        tracked answer or a probe answer."""
        heard = (host.requests_total - host.timeouts_total, host.probes.last_answer_ns)
        previous = self._heard.get(key)
        if previous is None or previous[0] != heard or host.in_flight <= 0:
            self._heard[key] = (heard, now_ns)
            return 0.0
        return (now_ns - previous[1]) / _NS

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s clocks (host removed)."""
        self._answered.pop(key, None)
        self._heard.pop(key, None)
