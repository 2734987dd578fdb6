"""Health rules: the next verdict on a host, as a pure function (:func:`assess`).

:func:`assess` reads a host's window once (stalled, erroring, slow:
:func:`~adaptive_lb.health.evidence.judge_slowness`) and moves it between HEALTHY, WARMING,
SLOW and ERRORING: worse at the first refresh that shows it (a stall or errors win over
slowness), back only on evidence and always through WARMING
(:mod:`adaptive_lb.health.verdict`). docs/design.md ("Health") tells the rules with their
figures.

Imports the config, the verdict, the evidence rules and the statistics' types.
"""

from __future__ import annotations

from attrs import define, field

from adaptive_lb.config import HealthConfig
from adaptive_lb.health.evidence import Baseline, Slowness, erroring_by_evidence, judge_slowness
from adaptive_lb.health.evidence import seconds_text as _s
from adaptive_lb.health.verdict import (
    CLEAN_STREAK,
    Evidence,
    HostHealth,
    Probe,
    hold_s,
    probe_requests,
    warm_up_s,
    warming_penalty,
)
from adaptive_lb.stats.health_state import HealthState
from adaptive_lb.stats.host import WindowStats

__all__ = ["Baseline", "assess"]

_NS = 1_000_000_000
_FINE = (HealthState.HEALTHY, HealthState.WARMING)


@define
class _Step:
    """One host's refresh: the inputs, what its window signals (read once, before any state
    is considered), and the verdicts it may give."""

    previous: HostHealth
    window: WindowStats
    baseline: Baseline
    config: HealthConfig
    now_ns: int
    window_s: float
    stalled_s: float
    answers: int
    failures: int
    latency: float | None = field(init=False)
    """Its latency at ``health.percentile``."""
    stalled: bool = field(init=False)
    errors_why: str | None = field(init=False)
    """Why it is erroring (None: it is not)."""
    slowness: Slowness = field(init=False)
    evidence: Evidence = field(init=False)
    streak: int = field(init=False)
    """Answers in a row, none failed (:meth:`~adaptive_lb.health.verdict.Evidence.observe`)."""

    def __attrs_post_init__(self) -> None:
        previous, window, config = self.previous, self.window, self.config
        self.latency = window.latency.get(float(config.percentile))
        self.errors_why = erroring_by_evidence(window, config)
        self.stalled = 0 < config.stall_timeout <= self.stalled_s
        self.slowness = judge_slowness(
            window, self.baseline, config, self.now_ns, previous.slowness
        )
        self.evidence, self.streak = previous.evidence.observe(self.answers, self.failures)

    @property
    def state(self) -> HealthState:
        return self.previous.state

    @property
    def in_state_s(self) -> float:
        return (self.now_ns - self.previous.since_ns) / _NS

    @property
    def cause(self) -> str:
        return self.previous.cause or ("errors" if self.state is HealthState.ERRORING else "slow")

    @property
    def erroring_penalty(self) -> float:
        # A request to a stalled host hangs until the client's timeout; to an erroring one
        # it fails fast and is retried elsewhere.
        penalties = self.config.penalties
        return penalties.stalled if self.cause == "stall" else penalties.erroring

    def verdict(
        self,
        state: HealthState,
        penalty: float,
        reason: str,
        since_ns: int,
        cause: str = "",
        evidence: Evidence | None = None,
        probe: Probe | None = None,
        warm_up: float | None = None,
    ) -> HostHealth:
        window, slowness = self.window, self.slowness
        return HostHealth(
            state,
            since_ns,
            penalty,
            reason,
            latency=self.latency,
            peer_median=self.baseline.tail,
            error_rate=window.error_rate,
            samples=window.samples,
            requests=window.requests,
            cause=cause,
            evidence=self.evidence if evidence is None else evidence,
            probe=probe,
            warm_up_s=warm_up,
            slowness=slowness,
        )

    def hold(self, penalty: float, probe: Probe | None = None) -> HostHealth:
        """The same state, since the same moment, with ``penalty``."""
        old = self.previous
        return self.verdict(
            old.state,
            penalty,
            old.reason,
            old.since_ns,
            old.cause,
            probe=probe,
            warm_up=old.warm_up_s,
        )

    def warming(self, reason: str, after_stall: bool = False) -> HostHealth:
        """Back: WARMING from now (HEALTHY at once without a warm-up)."""
        config = self.config
        warm_up = warm_up_s(config.slow_start, config.min_state_duration) if after_stall else None
        start = HostHealth.warming(self.now_ns, config, reason, warm_up)
        came_back = self.evidence.came_back(self.now_ns, self.answers)
        return self.verdict(
            start.state, start.penalty, reason, self.now_ns, "", came_back, warm_up=start.warm_up_s
        )

    def worse(self, state: HealthState, penalty: float, reason: str, cause: str) -> HostHealth:
        """Penalised from now."""
        if self.state in _FINE:
            evidence = self.evidence.turned_bad(self.now_ns, self.answers, self.window_s)
        else:
            evidence = self.evidence.restarted(self.answers)
        return self.verdict(state, penalty, reason, self.now_ns, cause, evidence)

    def slow(self) -> HostHealth:
        """SLOW from now, for the signals' reason."""
        return self.worse(
            HealthState.SLOW, self.config.penalties.slow, self.slowness.why or "", "slow"
        )

    def back(self, reason: str) -> HostHealth:
        """Back from errors: WARMING, unless its window shows it slow (then SLOW)."""
        return self.slow() if self.slowness.why is not None else self.warming(reason)

    def probe_wait_s(self, evidence: Evidence) -> float:
        """How long this ERRORING host waits before its next probe (:func:`hold_s`)."""
        config = self.config
        return hold_s(
            config.min_state_duration, evidence.relapses, self.window_s, evidence.failed_probes
        )

    def recovered_errors(self) -> bool:
        """Its window shows an error rate back below ``recovery_factor`` x ``error_rate``."""
        config, window = self.config, self.window
        return (
            window.requests >= config.min_samples
            and window.error_rate < config.recovery_factor * config.error_rate
        )


def assess(
    previous: HostHealth,
    window: WindowStats,
    baseline: Baseline,
    config: HealthConfig,
    now_ns: int,
    *,
    window_s: float = 10.0,
    stalled_s: float = 0.0,
    answers: int = 0,
    failures: int = 0,
) -> HostHealth:
    """The next verdict for a host (see the module docstring). ``window`` holds the latency
    at ``config.percentile`` and at :func:`~adaptive_lb.health.evidence.bound_percentiles`.
    ``window_s``: the statistics window's length; ``stalled_s``: how long the host has had
    requests in flight and answered none; ``answers``, ``failures``: its monotonic totals
    of successes and of errors + timeouts."""
    step = _Step(previous, window, baseline, config, now_ns, window_s, stalled_s, answers, failures)
    verdict = _worse(step)
    if verdict is not None:
        return verdict
    if step.state is HealthState.ERRORING:
        return _erroring(step)
    if step.state is HealthState.SLOW:
        return _slow(step)
    if step.state is HealthState.WARMING:
        return _warming(step)
    pct = f"p{config.percentile:g}"
    return step.verdict(
        HealthState.HEALTHY,
        config.penalties.healthy,
        f"{pct} {_s(step.latency)} (peer median {_s(baseline.tail)}), "
        f"{window.samples} samples; "
        f"error+timeout rate {window.error_rate:.1%} over {window.requests} requests",
        previous.since_ns,
    )


def _worse(step: _Step) -> HostHealth | None:
    """Getting worse: at once."""
    penalties, state = step.config.penalties, step.state
    if step.stalled and state is not HealthState.ERRORING:
        return step.worse(
            HealthState.ERRORING,
            penalties.stalled,
            f"stalled: no answer for {step.stalled_s:.1f}s with "
            f"{step.window.in_flight} requests in flight",
            "stall",
        )
    if step.errors_why is not None and state is not HealthState.ERRORING:
        return step.worse(HealthState.ERRORING, penalties.erroring, step.errors_why, "errors")
    if step.slowness.why is not None and state in _FINE:
        return step.slow()
    return None


def _erroring(step: _Step) -> HostHealth:
    """An ERRORING host: its probe, its fresh answers, then its window
    (:mod:`adaptive_lb.health.verdict`)."""
    verdict = _probe_outcome(step) or _fresh_answers(step)
    if verdict is not None:
        return verdict
    if step.recovered_errors():
        config, window = step.config, step.window
        return step.back(
            f"recovered: error+timeout rate {window.error_rate:.1%} < "
            f"{config.recovery_factor:g} x {config.error_rate:.1%} "
            f"over {window.requests} requests"
        )
    return step.hold(step.erroring_penalty, step.previous.probe)


def _probe_outcome(step: _Step) -> HostHealth | None:
    """The probe in progress failed, or answered for long enough; None: neither yet."""
    probe, cause, state = step.previous.probe, step.cause, step.state
    if probe is None:
        return None
    # By its window (errors only: a stalled host's window holds the stall's timeouts).
    recovered = cause != "stall" and step.recovered_errors()
    if (step.stalled or step.failures > probe.failures_at_start) and not recovered:
        failed = step.evidence.probe_failed(step.answers, step.now_ns)
        wait = step.probe_wait_s(failed)
        what = "no answer" if step.stalled else "a failure"
        return step.verdict(
            state,
            step.erroring_penalty,
            f"probe {failed.failed_probes} failed ({what}); the next in {wait:g}s",
            step.previous.since_ns,
            cause,
            failed,
        )
    if step.streak >= probe_requests(cause):
        if cause == "stall":
            return step.warming(f"probe answered after a stall: {step.streak} answers", True)
        return step.back(f"probe answered: {step.streak} answers in a row, none failed")
    return None


def _fresh_answers(step: _Step) -> HostHealth | None:
    """Once its wait is over: back on fresh answers, or a probe starts; None: neither."""
    evidence, cause = step.evidence, step.cause
    probe = step.previous.probe
    waited_s = step.in_state_s
    if evidence.probe_failed_ns is not None:
        waited_s = min(waited_s, (step.now_ns - evidence.probe_failed_ns) / _NS)
    if step.stalled or waited_s < step.probe_wait_s(evidence):
        return step.hold(step.erroring_penalty, probe)
    if cause == "stall":
        # Its window holds the stall's timeouts: judge it by what it does now -- once
        # nothing caught in the stall is in flight on it any more (their late answers
        # must not be the first samples of its new window).
        if step.window.in_flight > 0:
            return step.hold(step.erroring_penalty, probe)
        if step.streak > 0:
            return step.warming(
                f"answering again after a stall: {step.streak} answers, none failed", True
            )
    elif step.streak >= CLEAN_STREAK:
        return step.back(f"errors stopped: {step.streak} answers in a row, none failed")
    if probe is None and (cause == "stall" or not step.recovered_errors()):
        window = step.window
        requests = probe_requests(cause)
        why = (
            "stalled, nothing in flight on it any more"
            if cause == "stall"
            else f"error+timeout rate {window.error_rate:.1%} over {window.requests} requests"
        )
        return step.verdict(
            step.state,
            step.erroring_penalty,
            f"probing with {requests} request{'s' if requests > 1 else ''}: {why}",
            step.previous.since_ns,
            cause,
            probe=Probe(requests, step.failures),
        )
    return None


def _slow(step: _Step) -> HostHealth:
    """A SLOW host: held, then back when its window is clearly back to normal, or after a
    window without the answers to tell (unless its probes say it is still slow)."""
    config, previous = step.config, step.previous
    penalty = config.penalties.slow
    in_state_s = step.in_state_s
    if in_state_s < hold_s(config.min_state_duration, step.evidence.relapses, step.window_s):
        return step.hold(penalty)
    latency, threshold = step.latency, step.baseline.reference(config)
    pct = f"p{config.percentile:g}"
    if step.window.samples >= config.min_samples and latency is not None:
        if threshold is None:
            return step.warming(f"no peer latency to compare {pct} {_s(latency)} with")
        suspected = step.slowness.suspect_since_ns is not None
        if latency < config.recovery_factor * threshold and not suspected:
            return step.warming(
                f"recovered: {pct} {_s(latency)} < {config.recovery_factor:g} x "
                f"{_s(threshold)} (peer median {_s(step.baseline.tail)}), "
                f"{step.window.samples} samples"
            )
    elif in_state_s >= step.window_s and (still := step.baseline.probe_slow) is not None:
        return step.verdict(previous.state, penalty, still, previous.since_ns, previous.cause)
    elif in_state_s >= step.window_s:
        return step.warming(
            f"probing: only {step.window.samples} samples in the {step.window_s:g}s "
            f"since it turned slow (min {config.min_samples})"
        )
    return step.hold(penalty)


def _warming(step: _Step) -> HostHealth:
    """A WARMING host: HEALTHY after its warm-up (and ``min_state_duration``); meanwhile its
    penalty decays."""
    config, previous = step.config, step.previous
    penalties = config.penalties
    in_state_s = step.in_state_s
    warm_up = config.slow_start if previous.warm_up_s is None else previous.warm_up_s
    if in_state_s >= warm_up and in_state_s >= config.min_state_duration:
        window = step.window
        return step.verdict(
            HealthState.HEALTHY,
            penalties.healthy,
            f"warm-up complete after {in_state_s:.1f}s: p{config.percentile:g} "
            f"{_s(step.latency)}, error+timeout rate {window.error_rate:.1%}",
            step.now_ns,
        )
    return step.hold(warming_penalty(penalties.warming, in_state_s, warm_up, end=penalties.healthy))
