"""SlidingWindow: replaying recorded events gives what recording each one at once gives."""

from __future__ import annotations

import sys

from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb.config import TrackingConfig
from adaptive_lb.stats.window import ERROR, ROTATE, TIMEOUT, SlidingWindow, WindowLayout

_EVENT = st.one_of(
    st.integers(-10, 90_000_000_000),  # a success (ns; a clock that went back included)
    st.tuples(st.just(TIMEOUT), st.integers(0, 90_000_000_000)),
    st.tuples(st.just(ERROR), st.none() | st.integers(0, 90_000_000_000)),
    st.tuples(st.just(ROTATE), st.integers(1, 9)),
)


class _Reference:
    """The window as recorded one event at a time with hdrh's own record_value."""

    def __init__(self, layout: WindowLayout, intervals: int) -> None:
        self.layout = layout
        self.slices = [self._empty() for _ in range(intervals)]
        self.current = 0

    def _empty(self) -> dict[str, object]:
        layout = self.layout
        histogram = HdrHistogram(layout.min_us, layout.max_us, layout.significant_digits, 4)
        return {"successes": 0, "errors": 0, "timeouts": 0, "histogram": histogram}

    def apply(self, event: int | tuple[int, int | None]) -> None:
        if isinstance(event, int):
            kind, latency_ns = "successes", event
        elif event[0] == ROTATE:
            for _ in range(min(event[1] or 0, len(self.slices))):
                self.current = (self.current + 1) % len(self.slices)
                self.slices[self.current] = self._empty()
            return
        else:
            kind = "timeouts" if event[0] == TIMEOUT else "errors"
            latency_ns = event[1]
        piece = self.slices[self.current]
        piece[kind] += 1  # type: ignore[operator]
        if latency_ns is not None:
            value = min(max(latency_ns // 1000, self.layout.min_us), self.layout.max_us)
            assert piece["histogram"].record_value(value)  # type: ignore[attr-defined]


@settings(max_examples=80, deadline=None)
@given(
    batches=st.lists(st.lists(_EVENT, max_size=60), min_size=1, max_size=6),
    intervals=st.integers(1, 6),
    digits=st.integers(1, 3),
)
def test_replaying_in_batches_equals_recording_each_event(
    batches: list[list[int | tuple[int, int | None]]], intervals: int, digits: int
) -> None:
    """However the events are cut into batches, the intervals end up with the same counts,
    histogram slots and min / max as hdrh recording each event as it came."""
    config = TrackingConfig(intervals=intervals, significant_digits=digits, latency_max=60.0)
    layout = WindowLayout.for_config(config)
    window = SlidingWindow(layout)
    reference = _Reference(layout, intervals)
    for batch in batches:
        window.replay(batch)
        for event in batch:
            reference.apply(event)
    for offset in range(intervals):  # compare slice by slice, from the current one back
        mine = window._intervals[(window._current - offset) % intervals]
        theirs = reference.slices[(reference.current - offset) % intervals]
        assert (mine.successes, mine.errors, mine.timeouts) == (
            theirs["successes"],
            theirs["errors"],
            theirs["timeouts"],
        )
        expected: HdrHistogram = theirs["histogram"]  # type: ignore[assignment]
        synced = mine.synced_histogram()
        if expected.get_total_count() == 0:
            assert synced is None
            continue
        assert synced is not None
        assert bytes(synced.counts) == bytes(expected.counts)
        assert synced.get_total_count() == expected.get_total_count()
        assert (synced.get_min_value(), synced.get_max_value()) == (
            expected.get_min_value(),
            expected.get_max_value(),
        )


def test_counts_sum_the_intervals_and_merge_their_samples() -> None:
    layout = WindowLayout.for_config(TrackingConfig(intervals=3))
    window = SlidingWindow(layout)
    window.replay([1_000_000, 2_000_000, (ERROR, None), (ROTATE, 1), (TIMEOUT, 5_000_000)])
    counts = window.counts()
    assert (counts.successes, counts.errors, counts.timeouts, counts.samples) == (2, 1, 1, 3)
    assert counts.histogram is not None and counts.histogram.get_total_count() == 3
    window.replay([(ROTATE, 3)])  # a whole window later: empty, histograms kept for reuse
    counts = window.counts()
    assert (counts.successes, counts.errors, counts.timeouts, counts.samples) == (0, 0, 0, 0)
    assert counts.histogram is None
    assert sum(h is not None for h in window.histograms()) == 2
    assert window.current_interval().min_us == sys.maxsize
