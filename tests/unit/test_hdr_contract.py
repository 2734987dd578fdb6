"""Fails loudly if an hdrh release changes an internal that adaptive_lb.stats._hdr relies on.

Every HdrHistogram internal adaptive-lb touches is in adaptive_lb/stats/_hdr.py; each of its
functions is checked here against the hdrh method it stands in for: the slot arithmetic
against ``record_value``, the recorder against ``record_value`` and ``reset``, the merge
against ``add``, the percentiles against ``get_percentile_to_value_dict``.
"""

from __future__ import annotations

import ctypes
import random
import sys

import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_lb.stats._hdr import (
    WORD_SIZE,
    HistogramLayout,
    Recorder,
    merge_into,
    percentile_values,
)

MAX_US = 60_000_000
LAYOUTS = [
    HistogramLayout.of(min_us, MAX_US, digits)
    for min_us in (1, 10, 300, 1000)
    for digits in (1, 2, 3, 4)
]


def layout_id(layout: HistogramLayout) -> str:
    return f"min{layout.min_us}us-{layout.significant_digits}digits"


def reference(layout: HistogramLayout) -> HdrHistogram:
    """hdrh's own histogram of the same layout, recorded through its public API."""
    return HdrHistogram(
        layout.min_us, max(layout.max_us, 2 * layout.min_us), layout.significant_digits, WORD_SIZE
    )


def values_across(layout: HistogramLayout, seed: int = 1) -> list[int]:
    """Every power-of-two boundary (and its neighbours) in range, the ends, random values."""
    low, high = layout.min_us, layout.max_us
    values = {low, high}
    for bit in range(high.bit_length() + 1):
        values.update(v for v in ((1 << bit) - 1, 1 << bit, (1 << bit) + 1) if low <= v <= high)
    rng = random.Random(seed)
    values.update(rng.randint(low, high) for _ in range(500))
    values.update(int(low * 1.01**k) for k in range(2000) if low * 1.01**k <= high)
    return sorted(values)


def recorded(layout: HistogramLayout, values: list[int]) -> Recorder:
    recorder = Recorder()
    counts = recorder.allocate(layout)
    for value in values:
        recorder.add(counts, layout.slot_of(value), value)
    return recorder


# ----------------------------------------------------------------- the layout numbers


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_layout_numbers_are_hdrh_attributes(layout: HistogramLayout) -> None:
    histogram = layout.new_histogram()
    assert layout.unit_magnitude == histogram.unit_magnitude
    assert layout.sub_bucket_mask == histogram.sub_bucket_mask
    assert layout.sub_bucket_half == histogram.sub_bucket_half_count
    assert layout.sub_bucket_half_magnitude == histogram.sub_bucket_half_count_magnitude
    assert all(
        isinstance(n, int)
        for n in (histogram.unit_magnitude, histogram.sub_bucket_mask, histogram.counts_len)
    )


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_counts_is_one_contiguous_ctypes_array_of_word_size_counters(
    layout: HistogramLayout,
) -> None:
    """What the inlined recording indexes and what clearing memsets."""
    histogram = layout.new_histogram()
    counts = histogram.counts
    assert isinstance(counts, ctypes.Array)
    assert histogram.word_size == WORD_SIZE == ctypes.sizeof(counts._type_)
    assert len(counts) == histogram.counts_len
    assert ctypes.sizeof(counts) == histogram.counts_len * WORD_SIZE
    assert histogram.encoder.get_counts() is counts


# ----------------------------------------------------------------- slot arithmetic


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_slot_of_is_the_slot_record_value_increments(layout: HistogramLayout) -> None:
    histogram = reference(layout)
    for value in values_across(layout):
        slot = layout.slot_of(value)
        before = histogram.counts[slot]
        total = histogram.get_total_count()
        assert histogram.record_value(value)
        assert histogram.counts[slot] == before + 1, value
        assert histogram.get_total_count() == total + 1
        assert histogram.get_counts_array_index(value) == slot, value


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(1, MAX_US), min_size=1, max_size=300),
    layout=st.sampled_from(LAYOUTS),
)
def test_recorder_fills_the_same_histogram_as_record_value(
    values: list[int], layout: HistogramLayout
) -> None:
    values = [min(max(v, layout.min_us), layout.max_us) for v in values]
    expected = reference(layout)
    for value in values:
        assert expected.record_value(value)
    histogram = recorded(layout, values).synced_histogram()
    assert histogram is not None
    assert bytes(histogram.counts) == bytes(expected.counts)
    assert histogram.get_total_count() == expected.get_total_count()
    assert histogram.get_min_value() == expected.get_min_value()
    assert histogram.get_max_value() == expected.get_max_value()
    assert (histogram.min_value, histogram.max_value) == (expected.min_value, expected.max_value)


def test_an_empty_recorder_has_no_histogram_to_read() -> None:
    assert Recorder().synced_histogram() is None
    recorder = Recorder()
    recorder.allocate(LAYOUTS[0])
    assert recorder.synced_histogram() is None


# ----------------------------------------------------------------- clear, merge


@pytest.mark.parametrize("layout", LAYOUTS[::3], ids=layout_id)
def test_clear_equals_reset(layout: HistogramLayout) -> None:
    values = values_across(layout, seed=2)
    recorder = recorded(layout, values)
    expected = reference(layout)
    for value in values:
        expected.record_value(value)
    histogram = recorder.synced_histogram()
    assert histogram is not None
    recorder.clear()
    expected.reset()
    empty = bytes(histogram.counts_len * WORD_SIZE)
    assert bytes(histogram.counts) == bytes(expected.counts) == empty
    assert (histogram.total_count, histogram.min_value, histogram.max_value) == (
        expected.total_count,
        expected.min_value,
        expected.max_value,
    )
    assert (recorder.samples, recorder.min_us, recorder.max_us) == (0, sys.maxsize, 0)
    assert recorder.synced_histogram() is None
    # The same histogram is reused, and records as a fresh one does.
    counts = recorder.counts
    assert counts is not None
    recorder.add(counts, layout.slot_of(layout.min_us), layout.min_us)
    reused = recorder.synced_histogram()
    assert reused is not None and reused is histogram
    expected.record_value(layout.min_us)
    assert bytes(reused.counts) == bytes(expected.counts)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.lists(st.integers(1, MAX_US), max_size=60), min_size=1, max_size=5),
    layout=st.sampled_from(LAYOUTS),
)
def test_merge_into_equals_add(parts: list[list[int]], layout: HistogramLayout) -> None:
    merged = layout.new_histogram()
    added = layout.new_histogram()
    everything = []
    for part in parts:
        part = [min(max(v, layout.min_us), layout.max_us) for v in part]
        everything += part
        source = recorded(layout, part).synced_histogram()
        if source is None:
            continue
        merge_into(merged, source)
        added.add(source)
    assert bytes(merged.counts) == bytes(added.counts)
    assert merged.get_total_count() == added.get_total_count() == len(everything)
    assert merged.get_max_value() == added.get_max_value()
    percentiles = [0.0, 1.0, 50.0, 99.0, 100.0]
    assert percentile_values(merged, percentiles) == percentile_values(added, percentiles)
    # The one difference: add() leaves min_value at 0 when it started empty; ours is exact.
    if everything:
        assert merged.min_value == min(everything)


# ----------------------------------------------------------------- percentiles


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(1, MAX_US), min_size=0, max_size=200),
    percentiles=st.lists(st.floats(0.0, 110.0), min_size=1, max_size=6),
    word_size=st.sampled_from([2, 4, 8]),
)
def test_percentile_values_equal_get_percentile_to_value_dict(
    values: list[int], percentiles: list[float], word_size: int
) -> None:
    histogram = HdrHistogram(1, MAX_US, 2, word_size=word_size)
    for value in values:
        histogram.record_value(value)
    expected = histogram.get_percentile_to_value_dict(list(percentiles)) if values else {}
    assert percentile_values(histogram, percentiles) == expected


def test_percentile_values_after_an_hdrh_add() -> None:
    """hdrh's add() leaves min_value at 0: the slot range must still cover every sample."""
    source = HdrHistogram(1, MAX_US, 2)
    for value in (500, 501, 90_000, 7_000_000):
        source.record_value(value)
    merged = HdrHistogram(1, MAX_US, 2)
    merged.add(source)
    percentiles = [0.0, 25.0, 50.0, 75.0, 100.0]
    expected = source.get_percentile_to_value_dict(percentiles)
    assert percentile_values(merged, percentiles) == expected


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_percentile_values_of_a_recorder_equal_hdrh(layout: HistogramLayout) -> None:
    values = values_across(layout, seed=3)
    expected = reference(layout)
    for value in values:
        expected.record_value(value)
    histogram = recorded(layout, values).synced_histogram()
    assert histogram is not None
    percentiles = [0.0, 0.1, 10.0, 50.0, 90.0, 99.0, 99.99, 100.0]
    assert percentile_values(histogram, percentiles) == expected.get_percentile_to_value_dict(
        percentiles
    )
