"""Judgement proportional to the evidence: few answers settle a large gap, never a small one."""

from __future__ import annotations

import math
import random

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive_lb.config import HealthConfig, TrackingConfig
from adaptive_lb.core.clock import ManualClock
from adaptive_lb.health.evidence import (
    DEFAULT_SPREAD,
    MIN_EVIDENCE,
    MIN_SPREAD,
    Baseline,
    error_rate_lower_bound,
    erroring_by_evidence,
    false_alarm,
    latency_spread,
    samples_needed,
    slow_by_evidence,
    tail_percentiles,
    tail_ranks,
    twice_as_sure,
)
from adaptive_lb.health.model import HealthModel, HealthState
from adaptive_lb.stats.host import HostStats, WindowStats
from adaptive_lb.stats.lateness import _majority_tail, majority_lateness

MS = 1_000_000
S = 1_000_000_000
CONFIG = HealthConfig()


def window(samples: int, p50: float | None, p95: float | None = None, errors: int = 0):
    return WindowStats(
        requests=samples + errors,
        successes=samples,
        errors=errors,
        timeouts=0,
        samples=samples,
        latency={50.0: p50, 95.0: p95 if p95 is not None else p50},
    )


def test_the_answers_needed_fall_with_the_gap():
    needed = [samples_needed(ms, 2.0, 0.5, 3.0) for ms in (50, 10, 4, 3, 2.5, 2.1)]
    assert needed[:2] == [MIN_EVIDENCE, MIN_EVIDENCE]  # the docstring's figures
    assert [math.ceil(n) for n in needed[2:5]] == [8, 22, 71]
    assert needed == sorted(needed)
    assert samples_needed(2.0, 2.0, 0.5, 3.0) == math.inf  # not above the factor: never
    assert samples_needed(1.5, 2.0, 0.5, 3.0) == math.inf
    # A noisier cluster or a surer verdict needs more.
    assert samples_needed(3, 2.0, 1.0, 3.0) > samples_needed(3, 2.0, 0.5, 3.0)
    assert samples_needed(3, 2.0, 0.5, 4.0) > samples_needed(3, 2.0, 0.5, 3.0)


@given(
    failures=st.integers(0, 500),
    extra=st.integers(0, 500),
    certainty=st.floats(1.0, 10.0),
)
def test_the_error_rate_bound_is_below_the_rate_and_rises_with_evidence(failures, extra, certainty):
    requests = failures + extra
    bound = error_rate_lower_bound(failures, requests, certainty)
    assert 0.0 <= bound <= (failures / requests if requests else 0.0) + 1e-12
    # Twice the requests at the same rate: surer, so a higher bound.
    if requests:
        assert error_rate_lower_bound(2 * failures, 2 * requests, certainty) >= bound - 1e-12


def test_four_failures_in_four_are_enough_five_in_ten_are_not():
    assert erroring_by_evidence(window(0, None, errors=4), CONFIG) is not None
    assert erroring_by_evidence(window(0, None, errors=3), CONFIG) is None  # 3: the floor
    assert erroring_by_evidence(window(5, 0.001, errors=5), CONFIG) is None
    reason = erroring_by_evidence(window(0, None, errors=4), CONFIG)
    assert reason == "4 of 4 requests failed: error+timeout rate at least 30.8% > 25.0%"


def test_a_slow_verdict_from_few_answers_names_its_evidence():
    assert slow_by_evidence(window(3, 0.050), 0.001, 0.5, CONFIG) == (
        "p50 0.0500s = 50.0 x peer median 0.0010s, 3 samples (>= 3 needed at spread 0.50)"
    )
    assert slow_by_evidence(window(2, 0.050), 0.001, 0.5, CONFIG) is None  # below the floor
    assert slow_by_evidence(window(10, 0.003), 0.001, 0.5, CONFIG) is None  # 22 needed
    assert slow_by_evidence(window(22, 0.003), 0.001, 0.5, CONFIG) is not None
    assert slow_by_evidence(window(3, 0.050), None, 0.5, CONFIG) is None  # no peers
    # Under the absolute floor (2 ms), however many times its peers.
    assert slow_by_evidence(window(99, 0.0019), 0.0001, 0.5, CONFIG) is None


def test_a_median_from_few_answers_of_a_saturated_client_is_not_a_verdict():
    # Seen with a closed loop of 32 beside two CPU hogs (test_false_verdicts_simulacron):
    # an equal host's 24 answers at a median of 2.1 ms against its peers' 0.3 ms. The
    # client's median lateness was small, its largest 20 ms: a burst of the client's own
    # delay can hold all of a host's few answers, so it floors the spread too.
    quiet = slow_by_evidence(window(24, 0.0026), 0.0003, 0.91, CONFIG, 0.0005)
    assert quiet is not None and quiet.startswith("p50 0.0021s = 7.0 x")
    assert slow_by_evidence(window(24, 0.0026), 0.0003, 0.91, CONFIG, 0.0005, noise_s=0.020) is None
    # A host 50 ms slower still stands out from three answers beside such a client.
    assert slow_by_evidence(window(3, 0.050), 0.0003, 0.91, CONFIG, 0.0005, noise_s=0.020)


def test_the_lateness_most_answers_may_share_falls_from_the_largest_with_their_count():
    # 100 observations of the client's timer: 1 ms to 100 ms, one each.
    levels = tuple(ms / 1000 for ms in range(1, 101))
    alpha = false_alarm(CONFIG.certainty)
    # One answer, or three, may all have come in the client's worst moment.
    assert majority_lateness(levels, 1, alpha) == 0.100
    assert majority_lateness(levels, 3, alpha) >= 0.098
    # More answers are spread over more moments: a majority of 100 seldom shares the
    # client's worst third (about the 65th percentile at alpha 0.00135).
    shares = [majority_lateness(levels, n, alpha) for n in (3, 9, 20, 46, 100, 400)]
    assert shares == sorted(shares, reverse=True)
    assert 0.060 <= majority_lateness(levels, 100, alpha) <= 0.070
    # Surer (alpha squared) takes a higher level; nothing seen is no lateness.
    sure = false_alarm(twice_as_sure(CONFIG.certainty))
    assert majority_lateness(levels, 100, sure) > majority_lateness(levels, 100, alpha)
    assert majority_lateness((), 100, alpha) == 0.0
    # Counted up to MAJORITY_SAMPLES: 10,000 answers are judged as 400.
    assert majority_lateness(levels, 10_000, alpha) == majority_lateness(levels, 400, alpha)


@pytest.mark.parametrize("samples", [1, 2, 3, 9, 46, 100, 400])
def test_the_majority_tail_is_the_binomial_sum(samples):
    for p in (1e-6, 0.001, 0.1, 0.3, 0.45, 0.5):
        exact = sum(
            math.comb(samples, k) * p**k * (1 - p) ** (samples - k)
            for k in range(samples // 2 + 1, samples + 1)
        )
        assert _majority_tail(samples, p) == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_many_answers_of_a_slow_host_beside_a_saturated_client_are_a_verdict():
    # test_slow_node_gets_almost_nothing[32] beside a CPU hog: the +20 ms host's median
    # 38 ms against its peers' 12.7 ms; the client mostly 2-5 ms late, once 60 ms. With the
    # largest lateness as the noise of every median, 150 answers are no verdict (about 400
    # would be); what a majority of 150 answers may share (the 4 ms level) leaves 100.
    levels = tuple(sorted([0.002] * 40 + [0.004] * 40 + [0.005] * 19 + [0.060]))
    shared = Baseline(typical=0.0127, spread=0.5, lateness_levels=levels)
    assert (shared.lateness_s, shared.typical_lateness_s) == (0.060, 0.004)
    sure = twice_as_sure(CONFIG.certainty)
    slow = window(150, 0.038)
    assert slow_by_evidence(slow, 0.0127, 0.5, CONFIG, 0.004, sure, noise_s=0.060) is None
    assert shared.noise(150, sure) == 0.004
    assert "(>= 100 needed at spread 0.50)" in shared.gap(slow, CONFIG, sure, tails=False)
    # ...while three answers beside that client still count its worst moment.
    assert shared.noise(3, sure) == 0.060


def test_on_a_steady_cluster_the_client_jitter_sets_the_spread():
    # 3 ms among peers at 1.2 ms, cluster spread 0.2: 1 ms of the client's own noise is a
    # log-spread of ln(1 + 1/3) = 0.29 at 3 ms, so 24 answers are needed, not 12.
    assert samples_needed(2.5, 2.0, math.log1p(1 / 3), 3.0) == pytest.approx(23.5, abs=0.1)
    assert slow_by_evidence(window(23, 0.003), 0.0012, 0.2, CONFIG) is None
    assert slow_by_evidence(window(24, 0.003), 0.0012, 0.2, CONFIG) == (
        "p50 0.0030s = 2.5 x peer median 0.0012s, 24 samples (>= 24 needed at spread 0.29)"
    )
    no_jitter = attrs.evolve(CONFIG, latency_factor=attrs.evolve(CONFIG.latency_factor, jitter=0.0))
    assert slow_by_evidence(window(12, 0.003), 0.0012, 0.2, no_jitter) is not None
    # Where the cluster's own spread is wider, the jitter adds nothing.
    assert slow_by_evidence(window(22, 0.003), 0.001, 0.5, CONFIG) is not None


def test_the_spread_is_measured_on_hosts_with_enough_answers():
    assert latency_spread([]) == DEFAULT_SPREAD
    assert latency_spread([window(9, 0.001, 0.010)]) == DEFAULT_SPREAD  # too few answers
    measured = latency_spread([window(10, 0.001, 0.002)] * 3 + [window(50, 0.001, 0.100)])
    assert measured == pytest.approx(math.log(2) / 1.6449)  # the median host, not the odd one
    assert latency_spread([window(10, 0.001, 0.001)]) == MIN_SPREAD


class Thin:
    """Three hosts, each answering about three times a second (10 requests a second)."""

    def __init__(self, seed: int = 1, config: HealthConfig | None = None) -> None:
        self.clock = ManualClock(0)
        self.config = config or HealthConfig()
        self.stats = {key: HostStats(TrackingConfig(), self.clock) for key in ("a", "b", "c")}
        self.model = HealthModel(self.config, self.clock, window_s=10.0)
        self.random = random.Random(seed)

    def second(self, extra_ms: dict[str, float]) -> None:
        """One second: three answers per host (log-normal around 0.7 ms), then refreshes."""
        for key, stats in self.stats.items():
            for _ in range(3):
                latency = 0.7 * self.random.lognormvariate(0.0, 0.4) + extra_ms.get(key, 0.0)
                stats.on_send()
                stats.on_success(int(latency * MS))
        for _ in range(5):
            self.clock.advance(S // 5)
            self.model.refresh(self.stats, dict.fromkeys(self.stats, "dc1"))

    def state(self, key: str) -> HealthState:
        return self.stats[key].health_state


def test_ten_requests_a_second_find_a_node_50_ms_slower_within_two_seconds():
    thin = Thin()
    thin.second({"b": 50.0})
    thin.second({"b": 50.0})
    assert thin.state("b") is HealthState.SLOW
    assert "x peer median" in thin.model.health("b").reason
    assert thin.state("a") is thin.state("c") is HealthState.HEALTHY


@pytest.mark.parametrize("seed", range(20))
def test_ten_requests_a_second_to_equal_nodes_make_no_verdict(seed):
    # No slow_floor: the statistics alone keep the verdicts away (with certainty 1 and
    # outlier_factor 1.2 they would not: 10 of these 20 seeds then flag a host).
    thin = Thin(seed, HealthConfig(slow_floor=0.0))
    for _ in range(30):
        thin.second({})
        assert {thin.state(key) for key in thin.stats} == {HealthState.HEALTHY}


@pytest.mark.parametrize(
    ("samples", "ranks"),
    [(3, (2, 1)), (50, (5, 1)), (100, (6, 1)), (1000, (22, 2)), (5000, (73, 30))],
)
def test_the_p99_interval_is_the_binomial_order_statistics(samples, ranks):
    """The docstring's figures, and what they mean: the answers above the true p99 are
    Binomial(n, 0.01), so the ``low``-th slowest is above it with probability <= alpha
    and fewer than ``high`` answers are above it with probability <= alpha too."""
    alpha = false_alarm(CONFIG.certainty)
    assert alpha == pytest.approx(0.00135, abs=1e-5)
    low, high = tail_ranks(samples, 99.0, alpha)
    assert (low, high) == ranks
    tail = [math.comb(samples, k) * 0.01**k * 0.99 ** (samples - k) for k in range(low + 1)]
    assert 1.0 - sum(tail[:low]) <= alpha < 1.0 - sum(tail[: low - 1])
    assert sum(tail[: high - 1]) <= alpha or high == 1


@pytest.mark.parametrize(
    ("samples", "expected"),
    [(2, None), (3, (33.33, 100.0)), (50, (92.0, 100.0)), (1000, (97.9, 99.9))],
)
def test_the_tail_bounds_are_read_as_percentiles_on_three_answers_at_least(samples, expected):
    """From three answers; the lower bound never on fewer than three slow answers."""
    bounds = tail_percentiles(samples, CONFIG)
    if expected is None:
        assert bounds is None
    else:
        assert bounds == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    ("slow", "peers", "judged"), [(3, 0, False), (6, 0, False), (7, 0, True), (7, 1, False)]
)
def test_a_client_stall_on_a_few_answers_is_no_tail(slow, peers, judged):
    """128 answers at 5 ms, peers' too, and ``slow`` of them caught by a 150 ms stall: the
    p99 is 150 ms either way, but the p99 of 128 answers is surely above 5 ms only when its
    lower confidence bound, the 7th slowest, is (health_rules): then it is a suspicion, a
    verdict only if it persists (tests/unit/test_health.py). When the stall caught one
    answer of each peer (``peers``) too, their p99's upper bound is 150 ms: the host's
    tail is no slower than theirs could be."""
    clock = ManualClock(0)
    stats = {k: HostStats(TrackingConfig(), clock) for k in ("h0", "h1", "h2")}
    for key, host in stats.items():
        caught = slow if key == "h0" else peers
        for i in range(128):
            host.on_send()
            host.on_success((150 if i < caught else 5) * MS)
    model = HealthModel(CONFIG, clock)
    model.refresh(stats, dict.fromkeys(stats, "dc1"))
    health = model.health("h0")
    assert health is not None
    assert model.windows["h0"].latency[99.0] == pytest.approx(0.150, rel=0.01)
    assert health.state is HealthState.HEALTHY, health.reason
    assert (health.slowness.suspect_since_ns is not None) is judged
