"""Which requests are tracked: all of them while traffic is thin, a 1-in-k random sample above
``tracking.samples_per_host`` tracked requests per local host per second (pure logic, no
driver import).

Tracking a request (its attempts hooked, counted, timed, their outcomes recorded) is what
costs a busy client its CPU; the plan itself reads in-flight counts from the driver's pools
and needs no tracking. So :mod:`adaptive_lb.runtime.tracking` asks :meth:`Sampler.take` once per
request, before anything is known about it, and tracks only the requests it picks:

* at random, never by outcome: each request with probability 1/k, decided before it is
  sent (a C-level ``next()`` to count it and one ``random()``), so the latencies and
  error rates of the sample are those of all requests, only fewer of them. Not every k-th
  request: a client whose requests cycle through the hosts in step with k would then
  track one host's requests only, or those sent at one phase of its own rhythm;
* k from the measured request rate: ``k = floor(rate / (samples_per_host x local
  hosts))``, at least 1 -- every request while the policy's traffic is within the budget,
  which is where the thin-traffic judgement needs every answer it can get. The rate is
  re-measured on a picked request once ``RESAMPLE_S`` has passed, and a lull turns sampling
  off within one picked request. While every request is tracked, it is re-measured as soon
  as a quarter second's budget of requests (:func:`burst_count`) has come, however soon: a
  burst after a pause (the rate measured across the pause said 1) turns sampling on after
  that many requests, not after a quarter second of tracking all of them;
* ``samples_per_host: 0`` tracks every request (k stays 1).

A host that gets few requests because it is avoided (a SLOW host at 64x penalty) gets few
samples too: the probes (:mod:`adaptive_lb.health.probes`) keep evidence fresh for it.

Imports the counters only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from random import random

from adaptive_lb.core.counting import counter_value

__all__ = ["BURST_FLOOR", "RESAMPLE_S", "Sampler", "burst_count", "sample_every"]

RESAMPLE_S = 0.25
"""Seconds between two measurements of the request rate."""
BURST_FLOOR = 32
"""Fewest requests a rate is measured over before ``RESAMPLE_S`` has passed."""


def sample_every(rate: float, samples_per_host: float, hosts: int) -> int:
    """k, for tracking one request in k: 1 while ``rate`` (requests per second) is within
    ``samples_per_host`` x ``hosts`` (or sampling is off: ``samples_per_host`` 0)."""
    budget = samples_per_host * max(hosts, 1)
    if budget <= 0 or rate <= budget:
        return 1
    return max(1, math.floor(rate / budget))


def burst_count(samples_per_host: float, hosts: int) -> float:
    """Requests after which the rate is re-measured at once while every request is tracked:
    the budget of ``RESAMPLE_S`` (at least :data:`BURST_FLOOR`; never with sampling off)."""
    if samples_per_host <= 0:
        return math.inf
    return max(BURST_FLOOR, samples_per_host * max(hosts, 1) * RESAMPLE_S)


class Sampler:
    """Picks the requests of one policy that are tracked (see the module docstring).

    ``hosts()`` counts the policy's local candidate hosts; ``now_ns()`` is its clock.
    Read by every request without a lock: ``every`` (k) and ``count``; a race between two
    threads re-measuring at once only measures twice."""

    __slots__ = (
        "_burst",
        "_last_n",
        "_last_ns",
        "count",
        "every",
        "hosts",
        "now_ns",
        "samples_per_host",
    )

    def __init__(
        self, samples_per_host: float, hosts: Callable[[], int], now_ns: Callable[[], int]
    ) -> None:
        self.samples_per_host = samples_per_host
        self.hosts = hosts
        self.now_ns = now_ns
        self.count = itertools.count()
        """Requests planned by the policy and seen by tracking (``next()`` per request)."""
        self.every = 1
        """k: each request is tracked with probability 1 / ``every``."""
        self._last_n = 0
        self._last_ns = now_ns()
        self._burst = burst_count(samples_per_host, 0)

    def take(self) -> bool:
        """Whether the request being sent is tracked (call once per request). Tracking
        inlines the same test; this is its reference form."""
        n = next(self.count)
        every = self.every
        if every > 1 and random() * every >= 1.0:
            return False
        self.picked(n)
        return True

    def picked(self, n: int) -> None:
        """Request ``n`` was picked: re-measure the rate if ``RESAMPLE_S`` has passed, or
        (every request tracked) once :func:`burst_count` requests have come."""
        now = self.now_ns()
        elapsed_s = (now - self._last_ns) / 1e9
        if elapsed_s < RESAMPLE_S and (self.every > 1 or n - self._last_n < self._burst):
            return
        rate = (n - self._last_n) / max(elapsed_s, 1e-6)
        self._last_n, self._last_ns = n, now
        hosts = self.hosts()
        self.every = sample_every(rate, self.samples_per_host, hosts)
        self._burst = burst_count(self.samples_per_host, hosts)

    def configure(self, samples_per_host: float) -> None:
        """Adopt a new ``tracking.samples_per_host`` (0: every request, at once)."""
        self.samples_per_host = samples_per_host
        self._burst = burst_count(samples_per_host, self.hosts())
        if samples_per_host <= 0:
            self.every = 1

    @property
    def requests(self) -> int:
        """Requests counted so far (tracked or not)."""
        return counter_value(self.count)
