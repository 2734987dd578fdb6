"""Active probes, the pure part: which hosts to probe now, and what a probe's outcome
means for a host's health.

A *probe* is a small request of adaptive-lb's own, sent to one host only with a short
timeout (:mod:`adaptive_lb.runtime.prober` sends it through the driver); a user request is never
the probe. Its outcome is counted on the host's
:class:`~adaptive_lb.stats.probe_record.ProbeRecord`, apart from the user's requests, and never
enters the latency window.

**Which hosts** (:class:`ProbeScheduler`, at each health refresh): a host that is

* ERRORING (stalled, or erroring) -- to see it answer again;
* WARMING after a stall, or SLOW -- unless it answered a user request within
  ``probe_interval`` (enough fresh user traffic);
* *suspected*: requests in flight and no answer for ``probe_timeout`` (a probe would have
  failed by then), or a user request failed and nothing answered since;
* *kept away by its latency factor* (above 1, no user answer within ``probe_interval``,
  while other hosts answered this client within it): its probes' round trips hold the
  factor while they show it still clearly slower, so that a busy node a thin client stopped
  sending to is not sent user requests again the moment its window empties
  (:func:`~adaptive_lb.health.peers.still_slow`);
* without fresh evidence: it had user requests in the window, but neither they nor a probe
  answered for 2 x ``probe_interval``, while other hosts answered this client within
  ``probe_interval`` (a client that sends nothing, or waits on a hung request, needs no
  fresh evidence);

and live, with no probe outstanding, and at least ``probe_interval`` (jittered +/- 25 %)
since its last probe. A healthy host answering its user requests is never probed.

**What the outcome means** (:func:`judge`, applied by the health model after
:func:`~adaptive_lb.health.rules.assess` while probes are being sent):

* a probe that timed out makes its host ERRORING (cause ``stall``, penalty
  ``penalties.stalled``) at once -- unless the host answered user requests while the probe
  waited (a busy node is slow, not stalled: on a real 3-node cluster under full scans, a
  healthy replica's 0.5 s probe timeout sent its traffic to a non-replica) -- and one that
  failed ERRORING (cause ``errors``), at once; unless a later probe answered;
* a *stalled* host gets no user request (no user-request probe,
  :class:`~adaptive_lb.health.verdict.Probe`) until a probe answers after its verdict, its
  hold (:func:`~adaptive_lb.health.verdict.hold_s`) is over and nothing caught in the stall
  is in flight on it; then it is HEALTHY at once: the probe waited behind whatever the
  stall had queued, so the host is serving again and nothing in it is cold (a warm-up of
  ``min_state_duration`` would keep a thin client off it that long; a relapse is still
  held longer);
* in a fleet, a probe may wait for a slot of the fleet's budget
  (:mod:`adaptive_lb.stats.fleet`; the wait is noted on the host's record, ``held_ns``):
  the host is then judged by what that probe would have shown. A *suspected* host whose
  requests hang, none answering while its probe waited ``probe_timeout`` (as long as the
  probe would have waited for an answer), is ERRORING (stalled) then, as if the probe had
  timed out, not ``stall_timeout`` after its first request hung; a *stalled* host whose
  connections no longer hold any request (by the driver's count: what the stall had
  caught, timed out or not, was answered) while its probe waited is back on the same terms
  as a probe's answer (the hold over, HEALTHY at once): the client's own requests queued
  behind the stall were answered, as its probe would have been. Nothing is sent;
* an *erroring* host's way back stays the one without probes (its next requests placed as
  healthy, the first failure ends it: a probe's answer shows the host reachable, not the
  user's requests succeeding), but it opens only once a probe answered since the verdict
  and since the last failed try.

No driver import, no thread, no clock of its own. Imports attrs and adaptive-lb's pure
layers only (config, health_verdict, health_return, health_state, probe_record, stats).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping

from attrs import define, evolve

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.verdict import HostHealth, hold_s
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.probe_record import TIMEOUT, ProbeRecord

__all__ = [
    "HELD_AWAY",
    "HUNG",
    "JITTER",
    "PROBE_QUERY",
    "ROUTINE",
    "STALLED",
    "SUSPECTED_PENALTY",
    "ProbeOrder",
    "ProbeScheduler",
    "judge",
    "probe_reason",
]

PROBE_QUERY = "SELECT release_version FROM system.local"
"""What a probe asks: one row the node reads from its own memory, that every role may read
(authentication on or off), in no keyspace of the user's."""
JITTER = 0.25
"""A host's next probe comes ``probe_interval`` x (1 +/- this) after the last: clients
started together do not probe in step."""
IDLE_INTERVALS = 2.0
"""A host with user requests in the window but no answer (user or probe) for this many
``probe_interval`` is probed: its evidence is stale."""

SUSPECTED_PENALTY = 16.0
"""Where a fleet's budget makes probes wait for slots, the least penalty of a host whose
requests have gone a refresh without an answer, until one answers (the health model's
``paced``): below a healthy replica of another rack (``non_local_rack_penalty`` 4) and a
local non-replica (``non_replica_penalty`` 12), so that a thin client does not send a
stalled node a second and a third request before its verdict (in fleet-size-100 most
failed requests were these). Not a verdict: the host's state is unchanged."""
HUNG = "requests in flight without an answer"
"""The reason of a probe of a *suspected* host: its requests hang (:func:`probe_reason`)."""
STALLED = "stalled"
"""The reason of a probe of a host ERRORING by a stall: to see it answer again."""
HELD_AWAY = "kept away by its latency factor"
"""The reason of a probe of a host its latency factor keeps from user requests (see the
module docstring)."""
ROUTINE = "no fresh answer"
"""The reason of a routine probe: the host's evidence is stale, nothing says it is in
trouble (a thin client's host that it sent a request a while ago)."""

_NS = 1_000_000_000


@define(frozen=True, slots=True)
class ProbeOrder:
    """Probe ``key`` now, for ``reason``; no other probe of it before ``next_ns``."""

    key: Hashable
    stats: HostStats
    reason: str
    next_ns: int


def observe(stats: HostStats, now_ns: int) -> int:
    """Note the host's user answer count on its record (``user_answers``, and when it last
    changed: ``user_answer_ns``); when it last answered a user request. Once per host per
    refresh, before :func:`probe_reason`."""
    record = stats.probes
    answers = stats.requests_total - stats.errors_total - stats.timeouts_total
    if record.user_answer_ns is None or answers != record.user_answers:
        record.user_answers = answers
        record.user_answer_ns = now_ns
    return record.user_answer_ns


def probe_reason(
    verdict: HostHealth | None,
    stats: HostStats,
    window: WindowStats | None,
    stalled_s: float,
    now_ns: int,
    interval_s: float,
    busy: bool = True,
    suspect_s: float = 0.5,
) -> str | None:
    """Why a host should be probed now (None: it should not); see the module docstring.
    ``busy``: some host answered this client's requests within ``probe_interval`` (a
    client that sends nothing, or is blocked on a hung request, needs no fresh evidence).
    ``suspect_s``: how long requests in flight without an answer make a host suspected
    (``probe_timeout``: a probe would have failed by then). Call :func:`observe` first;
    updates the record's ``failures_cleared``."""
    record = stats.probes
    failures = stats.errors_total + stats.timeouts_total
    answers = stats.requests_total - failures
    user_answer_ns = record.user_answer_ns if record.user_answer_ns is not None else now_ns
    fresh = now_ns - user_answer_ns < interval_s * _NS
    state = verdict.state if verdict is not None else HealthState.HEALTHY
    if verdict is not None and answers > verdict.evidence.clean_from:
        record.failures_cleared = failures  # a user request answered since the last failure
    if state is HealthState.ERRORING:
        return STALLED if verdict is not None and verdict.cause == "stall" else "erroring"
    if state is HealthState.SLOW and not fresh:
        return "slow"
    if state is HealthState.WARMING and verdict is not None and verdict.warm_up_s is not None:
        return None if fresh else "returning after a stall"
    if stalled_s > 0 and stalled_s >= suspect_s:
        return HUNG
    if failures > record.failures_cleared:
        return "a request failed, none answered since"
    if busy and not fresh and stats.latency_factor > 1.0:
        return HELD_AWAY
    if busy and window is not None and window.requests > 0:
        last = user_answer_ns
        if record.last_answer_ns is not None:
            last = max(last, record.last_answer_ns)
        if now_ns - last >= IDLE_INTERVALS * interval_s * _NS:
            return ROUTINE
    return None


class ProbeScheduler:
    """Decides at each health refresh which hosts get a probe (see the module docstring).

    ``rng`` jitters the interval (tests inject a seeded one)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()

    def due(
        self,
        hosts: Iterable[tuple[Hashable, HostStats, bool]],
        verdict: Mapping[Hashable, HostHealth],
        windows: Mapping[Hashable, WindowStats],
        stalled: Mapping[Hashable, float],
        now_ns: int,
        config: HealthConfig,
    ) -> list[ProbeOrder]:
        """The probes to send now, from ``hosts`` as ``(key, stats, live)`` and the health
        model's last verdicts, windows and stall clocks. No probe when
        ``config.probe_interval`` is 0."""
        interval_s = config.probe_interval
        if interval_s <= 0:
            return []
        listed = list(hosts)
        latest = max((observe(stats, now_ns) for _, stats, _ in listed), default=0)
        busy = bool(listed) and now_ns - latest < interval_s * _NS
        orders = []
        for key, stats, live in listed:
            reason = probe_reason(
                verdict.get(key),
                stats,
                windows.get(key),
                stalled.get(key, 0.0),
                now_ns,
                interval_s,
                busy,
                config.probe_timeout,
            )
            record = stats.probes
            if reason is None or not live or record.outstanding or now_ns < record.next_ns:
                continue
            jitter = 1.0 + JITTER * (2.0 * self._rng.random() - 1.0)
            orders.append(ProbeOrder(key, stats, reason, now_ns + round(interval_s * jitter * _NS)))
        return orders


def _probe_failed(
    new: HostHealth,
    record: ProbeRecord,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
    answers: int,
) -> HostHealth:
    """``new`` after the host's last probe failed (since its last verdict): ERRORING,
    stalled if it timed out while no user request was answered."""
    stall = record.last_outcome == TIMEOUT
    sent_ns = record.last_sent_ns
    answered_users_ns = record.user_answer_ns
    if stall and answered_users_ns is not None and sent_ns is not None:
        stall = answered_users_ns <= sent_ns  # users answered meanwhile: busy
        if not stall:
            return new
    what = "did not answer within" if stall else "failed within"
    reason = f"probe {what} {config.probe_timeout:g}s"
    return _erroring(new, config, now_ns, window_s, answers, stall, reason)


def judge(
    previous: HostHealth,
    new: HostHealth,
    record: ProbeRecord,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
    answers: int,
    in_flight: int,
    pool_in_flight: int | None = None,
) -> HostHealth:
    """``new`` (the verdict :func:`~adaptive_lb.health.rules.assess` gave) corrected by the
    host's probes, while probes are being sent: see the module docstring. ``answers`` is
    the host's user answer total, ``in_flight`` its user attempts in flight,
    ``pool_in_flight`` everything in flight on its connections by the driver's count
    (requests timed out but not answered yet too; None: ``in_flight``)."""
    pool = in_flight if pool_in_flight is None else pool_in_flight
    failed_ns = record.last_failure_ns
    answered_ns = record.last_answer_ns
    failing = failed_ns is not None and (answered_ns is None or failed_ns > answered_ns)
    if new.state is not HealthState.ERRORING:
        if previous.state is HealthState.ERRORING:
            return new
        if failing and failed_ns is not None and failed_ns > previous.since_ns:
            return _probe_failed(new, record, config, now_ns, window_s, answers)
        if (
            _held_in_vain(record, HUNG, now_ns, config.probe_timeout, answers)
            and (answered_ns is None or answered_ns <= (record.held_ns or 0))
            and pool > 0
        ):
            # Its probe waited for the fleet's budget as long as it would have waited for
            # an answer, and nothing answered meanwhile: what that probe would have shown.
            reason = (
                f"no answer within {config.probe_timeout:g}s while its probe waited for "
                "the fleet's budget"
            )
            return _erroring(new, config, now_ns, window_s, answers, True, reason)
        return new
    if new.cause != "stall":
        # Errors: the probe's answer says the host is reachable, not that the user's
        # requests stopped failing (an overloaded table, a broken replica). So it only
        # opens the way back there is without probes: its next requests (CLEAN_STREAK)
        # placed as healthy, ended by the first failure. Never before a probe answered
        # since the verdict and since the last failed try.
        if new.probe is None or new.probe is previous.probe:
            return new
        tried_ns = new.evidence.probe_failed_ns or 0
        if answered_ns is not None and not failing and answered_ns > max(new.since_ns, tried_ns):
            return new
        return evolve(new, probe=None, reason=previous.reason or new.reason)
    probed = answered_ns is not None and not failing and answered_ns > new.since_ns
    back = _back_from_stall(new, record, config, now_ns, window_s, answers, probed)
    if back is not None and in_flight == 0 and (probed or _drained(new, record, pool)):
        return back
    if new.probe is not None:
        # No user request is the probe: the host keeps its penalty until a probe answers.
        return evolve(new, probe=None, reason=previous.reason or new.reason)
    return new


def _drained(new: HostHealth, record: ProbeRecord, pool: int) -> bool:
    """Whether the stalled host's probe waits for the fleet's budget and the requests the
    stall had caught on its connections were all answered meanwhile (``pool``: in flight
    by the driver's count): what that probe would have shown."""
    return (
        record.held_caught
        and record.held_reason == STALLED
        and (record.held_ns or 0) >= new.since_ns
        and pool == 0
    )


def _back_from_stall(
    new: HostHealth,
    record: ProbeRecord,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
    answers: int,
    probed: bool,
) -> HostHealth | None:
    """The stalled host HEALTHY, once its hold is over (None before): the probe waited
    behind whatever the stall had queued on its connection (or those requests were
    answered), so the host is serving again and nothing in it is cold (a warm-up of
    ``min_state_duration`` would keep a thin client off it that long; a relapse is still
    held longer). ``probed``: a probe answered (else what the stall caught did)."""
    hold = hold_s(config.min_state_duration, new.evidence.relapses, window_s)
    if (now_ns - new.since_ns) / _NS < hold:
        return None
    if probed:
        latency = record.last_latency_s or 0.0
        why = f"probe answered in {latency * 1000:.1f} ms after a stall"
    else:
        why = "what the stall had caught was answered while its probe waited for a slot"
    return evolve(
        new,
        state=HealthState.HEALTHY,
        since_ns=now_ns,
        penalty=config.penalties.healthy,
        reason=why,
        cause="",
        evidence=new.evidence.came_back(now_ns, answers),
        probe=None,
        warm_up_s=None,
    )


def _held_in_vain(
    record: ProbeRecord, reason: str, now_ns: int, timeout_s: float, answers: int
) -> bool:
    """Whether a probe due for ``reason`` has waited for a slot of the fleet's budget for
    ``timeout_s`` (a probe's timeout) with no user answer from the host meanwhile."""
    held_ns = record.held_ns
    return (
        held_ns is not None
        and record.held_reason == reason
        and now_ns - held_ns >= timeout_s * _NS
        and answers == record.held_answers
    )


def _erroring(
    new: HostHealth,
    config: HealthConfig,
    now_ns: int,
    window_s: float,
    answers: int,
    stall: bool,
    reason: str,
) -> HostHealth:
    """``new`` made ERRORING by what a probe showed (``stall``: no answer; else a failure)."""
    if new.state in (HealthState.HEALTHY, HealthState.WARMING):
        evidence = new.evidence.turned_bad(now_ns, answers, window_s)
    else:
        evidence = new.evidence.restarted(answers)
    return evolve(
        new,
        state=HealthState.ERRORING,
        since_ns=now_ns,
        penalty=config.penalties.stalled if stall else config.penalties.erroring,
        reason=reason,
        cause="stall" if stall else "errors",
        evidence=evidence,
        probe=None,
        warm_up_s=None,
    )
