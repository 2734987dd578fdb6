"""Health rules: the verdict on a host from its statistics window, as pure functions.

:func:`assess` maps the previous verdict, the window and the peers' median to the next
verdict (a :class:`~adaptive_lb.health_verdict.HostHealth`);
:func:`~adaptive_lb.peer_groups.peer_medians` finds each host's peers' median;
:func:`~adaptive_lb.health_verdict.warming_penalty` is the penalty of a host coming back.
No state, no threads, no clock, no driver: :class:`adaptive_lb.health.HealthModel` keeps
the verdicts and applies these rules at each refresh.

May import: the config model, the verdict (:mod:`adaptive_lb.health_verdict`), the ways
back (:mod:`adaptive_lb.health_return`), the evidence rules (:mod:`adaptive_lb.evidence`,
:mod:`adaptive_lb.slowness`),
the health states and the statistics window's type; pure logic only.

States (:class:`HealthState`):

* HEALTHY -- penalty ``penalties.healthy`` (1).
* SLOW -- its latency at ``percentile`` is above ``outlier_factor`` x the median of the
  same percentile among its peers (the other hosts at a comparable distance from this
  client that have ``min_samples``: its rack, else its datacenter corrected by each rack's
  measured distance; see :mod:`adaptive_lb.peer_groups`) *and* above ``slow_floor``, over
  at least ``min_samples`` samples, *and* with at least three answers above that
  threshold (its latency at :func:`~adaptive_lb.evidence.support_percentile` is above it
  too: a stall of the client's own that caught two of its requests is no tail). Penalty
  ``penalties.slow``.
  A host without peers that have data cannot be judged SLOW: there is nothing to be an
  outlier against.
* ERRORING -- (errors + timeouts) / requests above ``error_rate`` over at least
  ``min_samples`` requests; or *stalled*: requests in flight on it and not one answer (a
  timeout is not an answer) for ``stall_timeout``. Wins over SLOW. Penalty
  ``penalties.erroring``, or ``penalties.stalled`` for a stall. Fast errors never enter
  the latency histogram (see :mod:`adaptive_lb.stats`), so a node failing fast is caught
  here and never looks fast. A stall needs no sample count: a node paused by a long GC
  answers nothing, and the few requests caught on it time out far too slowly to reach
  ``min_samples``.
* WARMING -- the host came back (up again:
  :meth:`~adaptive_lb.health.HealthModel.mark_up`, or recovered from SLOW / ERRORING). Its
  penalty decays from ``penalties.warming`` to ``penalties.healthy`` (1) over
  ``slow_start`` seconds so that the share of traffic it gets, about 1 / penalty, ramps up
  *linearly* (:func:`~adaptive_lb.health_verdict.warming_penalty`); then HEALTHY.
  ``slow_start`` 0 skips it.

Quick to protect, slow to forgive:

* Getting worse is immediate: HEALTHY or WARMING -> SLOW / ERRORING, and SLOW -> ERRORING,
  at the first refresh that shows it.
* Getting better needs the *hold* in the state -- ``min_state_duration``, doubled for each
  relapse, at most a window (:func:`~adaptive_lb.health_return.hold_s`; no state other
  than HEALTHY is left sooner) -- *and* evidence. Fresh evidence first (what the host did
  since its verdict, from its answer and failure counts; its window may still hold the bad
  period): a *stalled* host that answers again, or an ERRORING host that answers
  ``CLEAN_STREAK`` (10) times in a row without a failure, starts WARMING at the next
  refresh (:mod:`adaptive_lb.health_return`). An ERRORING host is *probed* once the hold
  is over (a stalled one once nothing caught in the stall is in flight on it any more): it
  stays ERRORING, but its next request (10 for errors) is placed as if it were healthy; a
  probe that hangs costs one request, waiting a window costs the host's whole share. The
  probe succeeds with the streak above; a failure or a stall fails it, and the next probe
  waits twice the hold. Otherwise the window must show
  the numbers clearly back to normal: SLOW is left when the latency is below
  ``recovery_factor`` x the entry threshold (``outlier_factor`` x peer median, or the floor
  if higher), ERRORING when the error rate is below ``recovery_factor`` x ``error_rate``.
  Leaving either goes to WARMING (or to the other bad state if the host is in it).
  HEALTHY is only reached from WARMING, after ``max(slow_start, min_state_duration)``, so
  a host cannot flap between penalised and not penalised faster than that. Leaving SLOW /
  ERRORING restarts the host's statistics window (done by the health model): from then on
  it is judged by what it does, not by the bad period. A host that turns bad again soon
  after a return it had answered well in is a *relapse*: held twice as long next time.
* No evidence is not evidence of recovery: with fewer than ``min_samples`` (samples for
  SLOW, requests for ERRORING) a bad state holds -- but a penalised host gets little
  traffic, so once a whole window has passed in the state without enough fresh evidence,
  it moves to WARMING ("probing"): traffic ramps back, evidence comes in, and if it is
  still bad it goes straight back (ERRORING hosts are probed instead, as above). A SLOW
  host whose peers have no data any more also
  moves to WARMING (it is no longer an outlier of anything).

Imports the config, the statistics, the health states and, of its own row, the verdict, the
way back and the evidence only.
"""

from __future__ import annotations

from adaptive_lb.config import HealthConfig
from adaptive_lb.evidence import (
    DEFAULT_SPREAD,
    MIN_EVIDENCE,
    erroring_by_evidence,
    tail_percentiles,
    twice_as_sure,
)
from adaptive_lb.health_return import (
    CLEAN_STREAK,
    RELAPSE_WINDOWS,
    Evidence,
    Probe,
    hold_s,
    probe_requests,
    probe_wait_s,
    warm_up_s,
)
from adaptive_lb.health_state import HealthState
from adaptive_lb.health_verdict import HostHealth, warming_penalty
from adaptive_lb.slowness import Gap, threshold_text
from adaptive_lb.stats import WindowStats

__all__ = ["assess"]

_NS = 1_000_000_000


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.4f}s"


def assess(
    previous: HostHealth,
    window: WindowStats,
    peer_median: float | None,
    config: HealthConfig,
    now_ns: int,
    window_s: float = 10.0,
    stalled_s: float = 0.0,
    answers: int = 0,
    failures: int = 0,
    *,
    peer_typical: float | None = None,
    spread: float = DEFAULT_SPREAD,
    probe_slow: str | None = None,
    peer_bound: float | None = None,
    lateness_s: float = 0.0,
    typical_lateness_s: float = 0.0,
    recent: WindowStats | None = None,
    peer_body: float | None = None,
) -> HostHealth:
    """The next verdict for a host; a pure function (see the module docstring for the
    rules).

    ``window`` must hold the latency at ``config.percentile`` and at
    :func:`~adaptive_lb.evidence.support_percentile` of its sample count (without it the
    tail rule judges nothing). ``peer_median`` is the median
    of the peers' latency at that percentile (None when no peer has ``min_samples``: then
    the host cannot be SLOW). ``window_s`` is the statistics window's length: after that
    long in SLOW / ERRORING without ``min_samples`` of fresh evidence a host starts WARMING.
    ``stalled_s`` is how long the host has had requests in flight without answering any
    (0 when it has none in flight, or answered since the last refresh). ``answers`` and
    ``failures`` are the host's monotonic totals of successes and of errors + timeouts:
    what it did since the previous verdict is the fresh evidence of a way back
    (:mod:`adaptive_lb.health_return`). ``peer_typical`` (the peers' median p50) and
    ``spread`` feed the rules for hosts with fewer than ``min_samples``
    (:mod:`adaptive_lb.evidence`). ``probe_slow``: why the host's probes say it is still
    clearly slow (:mod:`adaptive_lb.probe_latency`); then a SLOW host is not let back on
    its window's lapse.
    """
    penalties = config.penalties
    latency = window.latency.get(float(config.percentile))
    error_rate = window.error_rate
    enough_requests = window.requests >= config.min_samples
    enough_samples = window.samples >= config.min_samples and latency is not None
    # The tail's threshold: outlier_factor x the peers' estimate and above the peers' own
    # upper confidence bound, plus what the client itself may have added to any answer.
    threshold = (
        None
        if peer_median is None
        else max(config.outlier_factor * peer_median, peer_bound or 0.0, config.slow_floor)
        + lateness_s
    )
    stalled = 0 < config.stall_timeout <= stalled_s
    tail_errors = enough_requests and error_rate > config.error_rate
    # The evidence rules judge hosts the tail rules cannot yet (fewer than min_samples).
    errors_why = None if enough_requests else erroring_by_evidence(window, config)
    erroring = tail_errors or errors_why is not None
    # Its body (adaptive_lb.evidence.body_percentile) against its peers' body.
    body_threshold = (
        None
        if peer_body is None
        else max(config.outlier_factor * peer_body, config.slow_floor) + lateness_s
    )
    returned_ns = previous.evidence.returned_ns
    relapsing = (
        previous.state is HealthState.WARMING
        and returned_ns is not None
        and now_ns - returned_ns < RELAPSE_WINDOWS * window_s * _NS
    )
    least = 1 if relapsing else MIN_EVIDENCE  # just back from SLOW: one clear answer will do
    gap = Gap(
        config,
        peer_typical,
        spread,
        least,
        typical_lateness_s,
        (threshold, threshold_text(config, peer_median, peer_bound, lateness_s)),
        (body_threshold, threshold_text(config, peer_body, None, lateness_s, body=True)),
    )
    # A verdict needs evidence at alpha squared: from the window alone (twice as sure), or
    # at alpha from the window (a suspicion) and again from the answers that came after
    # (``recent``: a disjoint sample). A burst of the client's own is not in both.
    strong_why = gap(window, twice_as_sure(config.certainty), enough_samples)
    weak_why = strong_why or gap(window, config.certainty, enough_samples)
    suspect_since = suspect_interval = None
    if weak_why is not None:
        fresh = previous.suspect_since_ns is None
        suspect_since = now_ns if fresh else previous.suspect_since_ns
        suspect_interval = window.interval if fresh else previous.suspect_interval
    tail_bounds = tail_percentiles(window.samples, config)
    tail_low = None if tail_bounds is None else window.latency.get(tail_bounds[0])
    suspect_ratio = None
    if suspect_since is not None and enough_samples and tail_low is not None and threshold:
        suspect_ratio = tail_low / threshold if tail_low > threshold else None
    slow_why = strong_why
    if slow_why is None and weak_why is not None:
        held_s = 0.0 if suspect_since is None else (now_ns - suspect_since) / _NS
        if recent is not None and recent.interval == window.interval:  # the same moment
            again = gap(recent, config.certainty, True)
            if again is not None:
                slow_why = (
                    f"{weak_why}; again in the {recent.samples} answers of the last {held_s:.1f}s"
                )
        if slow_why is None and relapsing:
            slow_why = f"{weak_why}; just back from SLOW"
    slow = slow_why is not None
    state = previous.state
    in_state_s = (now_ns - previous.since_ns) / _NS
    settled = in_state_s >= config.min_state_duration
    pct = f"p{config.percentile:g}"
    evidence, streak = previous.evidence.observe(answers, failures)
    cause = previous.cause or ("errors" if state is HealthState.ERRORING else "slow")
    # A request to a stalled host hangs until the client's timeout; to an erroring one it
    # fails fast and is retried elsewhere.
    erroring_penalty = penalties.stalled if cause == "stall" else penalties.erroring

    def verdict(
        new_state: HealthState,
        penalty: float,
        reason: str,
        since_ns: int,
        new_cause: str = "",
        new_evidence: Evidence = evidence,
        probe: Probe | None = None,
        warm_up: float | None = None,
    ) -> HostHealth:
        return HostHealth(
            new_state,
            since_ns,
            penalty,
            reason,
            latency=latency,
            peer_median=peer_median,
            error_rate=error_rate,
            samples=window.samples,
            requests=window.requests,
            cause=new_cause,
            evidence=new_evidence,
            probe=probe,
            warm_up_s=warm_up,
            suspect_since_ns=suspect_since,
            suspect_interval=suspect_interval,
            suspect_ratio=suspect_ratio,
        )

    def hold(penalty: float, probe: Probe | None = None) -> HostHealth:
        return verdict(
            state,
            penalty,
            previous.reason,
            previous.since_ns,
            previous.cause,
            probe=probe,
            warm_up=previous.warm_up_s,
        )

    def warming(reason: str, after_stall: bool = False) -> HostHealth:
        warm_up = warm_up_s(config.slow_start, config.min_state_duration) if after_stall else None
        start = HostHealth.warming(now_ns, config, reason, warm_up)
        came_back = evidence.came_back(now_ns, answers)
        return verdict(
            start.state, start.penalty, reason, now_ns, "", came_back, warm_up=start.warm_up_s
        )

    def worse(new_state: HealthState, penalty: float, reason: str, new_cause: str) -> HostHealth:
        if state in (HealthState.HEALTHY, HealthState.WARMING):
            new_evidence = evidence.turned_bad(now_ns, answers, window_s)
        else:
            new_evidence = evidence.restarted(answers)
        return verdict(new_state, penalty, reason, now_ns, new_cause, new_evidence)

    def slow_reason() -> str:
        return slow_why or ""

    # Getting worse: at once.
    if stalled and state is not HealthState.ERRORING:
        return worse(
            HealthState.ERRORING,
            penalties.stalled,
            f"stalled: no answer for {stalled_s:.1f}s with {window.in_flight} requests in flight",
            "stall",
        )
    if erroring and state is not HealthState.ERRORING:
        why = errors_why or (
            f"error+timeout rate {error_rate:.1%} > {config.error_rate:.1%} "
            f"over {window.requests} requests"
        )
        return worse(HealthState.ERRORING, penalties.erroring, why, "errors")
    if slow and state in (HealthState.HEALTHY, HealthState.WARMING):
        return worse(HealthState.SLOW, penalties.slow, slow_reason(), "slow")

    if state is HealthState.ERRORING:
        # The way back from fresh evidence and probes (see adaptive_lb.health_return).
        probe = previous.probe
        # By its window (errors only: a stalled host's window holds the stall's timeouts).
        recovered = (
            cause != "stall"
            and enough_requests
            and error_rate < config.recovery_factor * config.error_rate
        )
        if probe is not None:
            if (stalled or failures > probe.failures_at_start) and not recovered:
                failed = evidence.probe_failed(answers, now_ns)
                wait = probe_wait_s(
                    config.min_state_duration, failed.relapses, failed.failed_probes, window_s
                )
                what = "no answer" if stalled else "a failure"
                return verdict(
                    state,
                    erroring_penalty,
                    f"probe {failed.failed_probes} failed ({what}); the next in {wait:g}s",
                    previous.since_ns,
                    cause,
                    failed,
                )
            if streak >= probe_requests(cause):
                if cause == "stall":
                    return warming(f"probe answered after a stall: {streak} answers", True)
                if slow:
                    return worse(HealthState.SLOW, penalties.slow, slow_reason(), "slow")
                return warming(f"probe answered: {streak} answers in a row, none failed")
        waited_s = in_state_s
        if evidence.probe_failed_ns is not None:
            waited_s = min(waited_s, (now_ns - evidence.probe_failed_ns) / _NS)
        wait_s = probe_wait_s(
            config.min_state_duration, evidence.relapses, evidence.failed_probes, window_s
        )
        if stalled or waited_s < wait_s:
            return hold(erroring_penalty, probe)
        if cause == "stall":
            # Its window holds the stall's timeouts: judge it by what it does now -- once
            # nothing caught in the stall is in flight on it any more (their late answers
            # must not be the first samples of its new window).
            if window.in_flight > 0:
                return hold(erroring_penalty, probe)
            if streak > 0:
                return warming(
                    f"answering again after a stall: {streak} answers, none failed", True
                )
        elif streak >= CLEAN_STREAK:
            if slow:
                return worse(HealthState.SLOW, penalties.slow, slow_reason(), "slow")
            return warming(f"errors stopped: {streak} answers in a row, none failed")
        if probe is None and (cause == "stall" or not recovered):
            requests = probe_requests(cause)
            why = (
                "stalled, nothing in flight on it any more"
                if cause == "stall"
                else f"error+timeout rate {error_rate:.1%} over {window.requests} requests"
            )
            return verdict(
                state,
                erroring_penalty,
                f"probing with {requests} request{'s' if requests > 1 else ''}: {why}",
                previous.since_ns,
                cause,
                evidence,
                Probe(requests, failures),
            )

    if state is HealthState.SLOW and in_state_s < hold_s(
        config.min_state_duration, evidence.relapses, window_s
    ):
        return hold(penalties.slow)

    if state is HealthState.ERRORING:
        if enough_requests and error_rate < config.recovery_factor * config.error_rate:
            if slow:
                return worse(HealthState.SLOW, penalties.slow, slow_reason(), "slow")
            return warming(
                f"recovered: error+timeout rate {error_rate:.1%} < "
                f"{config.recovery_factor:g} x {config.error_rate:.1%} "
                f"over {window.requests} requests"
            )
        return hold(erroring_penalty, previous.probe)

    if state is HealthState.SLOW:
        if enough_samples and latency is not None:
            if threshold is None:
                return warming(f"no peer latency to compare {pct} {_s(latency)} with")
            if latency < config.recovery_factor * threshold and slow_why is None:
                return warming(
                    f"recovered: {pct} {_s(latency)} < {config.recovery_factor:g} x "
                    f"{_s(threshold)} (peer median {_s(peer_median)}), "
                    f"{window.samples} samples"
                )
        elif in_state_s >= window_s and probe_slow is not None:
            return verdict(state, penalties.slow, probe_slow, previous.since_ns, previous.cause)
        elif in_state_s >= window_s:
            return warming(
                f"probing: only {window.samples} samples in the {window_s:g}s "
                f"since it turned slow (min {config.min_samples})"
            )
        return hold(penalties.slow)

    if state is HealthState.WARMING:
        warm_up = config.slow_start if previous.warm_up_s is None else previous.warm_up_s
        if in_state_s >= warm_up and settled:
            return verdict(
                HealthState.HEALTHY,
                penalties.healthy,
                f"warm-up complete after {in_state_s:.1f}s: {pct} {_s(latency)}, "
                f"error+timeout rate {error_rate:.1%}",
                now_ns,
            )
        penalty = warming_penalty(penalties.warming, in_state_s, warm_up, end=penalties.healthy)
        return hold(penalty)

    return verdict(
        HealthState.HEALTHY,
        penalties.healthy,
        f"{pct} {_s(latency)} (peer median {_s(peer_median)}), {window.samples} samples; "
        f"error+timeout rate {error_rate:.1%} over {window.requests} requests",
        previous.since_ns,
    )
