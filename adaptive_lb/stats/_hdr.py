"""Every place adaptive-lb relies on HdrHistogram's internals, in one module.

hdrh's public API is pure Python and costs ~1-2 us per ``record_value``, a Python loop over
every slot per ``reset`` and per percentile query, and ~10 us of range checks per ``add``.
The request path and the health refresh cannot afford that, so they work on hdrh's own
objects through the internals read here and nowhere else: the counts array (a ctypes array,
cleared with one ``memset``), its length and word size, the slot arithmetic of
``record_value`` (which :meth:`adaptive_lb.stats.window.SlidingWindow.replay` inlines from the
numbers of a :class:`HistogramLayout`), the total / min / max attributes, the encoder's
C-level ``add``, and the index <-> value helpers behind the percentile queries.

``tests/unit/test_hdr_contract.py`` fails loudly if an hdrh release renames or changes any of
them: each function here is checked against the hdrh method it replaces.

May import: hdrh and attrs; nothing of adaptive-lb.
"""

from __future__ import annotations

import array
import bisect
import ctypes
import itertools
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

from attrs import define
from hdrh.histogram import HdrHistogram

__all__ = [
    "WORD_SIZE",
    "HistogramLayout",
    "Recorder",
    "merge_into",
    "percentile_values",
]

WORD_SIZE = 4
"""Bytes per histogram counter: 4 halves the memory of hdrh's default 8, and no slot of a
window can reach 2**32 samples. With the default config a histogram holds 2,560 counters
(10 KiB)."""

_TYPECODES = {array.array(code).itemsize: code for code in "QLIH"}
"""array typecode of an unsigned integer, by size in bytes (hdrh's counter word sizes)."""

_L = TypeVar("_L", bound="HistogramLayout")


@define(frozen=True, slots=True)
class HistogramLayout:
    """The range and precision of a family of histograms, with hdrh's numbers for mapping a
    value to its counts slot (:meth:`slot_of`). Every histogram made by
    :meth:`new_histogram` has this layout, so a slot computed from these numbers is a slot
    of any of them."""

    min_us: int
    """Lowest value tracked (hdrh's unit is this rounded down to a power of two)."""
    max_us: int
    """Highest value callers record (they clamp to ``[min_us, max_us]``)."""
    significant_digits: int
    unit_magnitude: int
    sub_bucket_mask: int
    sub_bucket_half: int
    sub_bucket_half_magnitude: int
    bucket_shift: int
    """``unit_magnitude + sub_bucket_half_magnitude + 1``: one subtraction in :meth:`slot_of`."""

    @classmethod
    def of(cls: type[_L], min_us: int, max_us: int, significant_digits: int, **extra: Any) -> _L:
        """The layout of histograms over ``[min_us, max_us]`` with ``significant_digits``
        (``extra``: the fields of a subclass)."""
        probe = _histogram(min_us, max_us, significant_digits)
        magnitude = probe.sub_bucket_half_count_magnitude
        return cls(
            min_us=min_us,
            max_us=max_us,
            significant_digits=significant_digits,
            unit_magnitude=probe.unit_magnitude,
            sub_bucket_mask=probe.sub_bucket_mask,
            sub_bucket_half=probe.sub_bucket_half_count,
            sub_bucket_half_magnitude=magnitude,
            bucket_shift=probe.unit_magnitude + magnitude + 1,
            **extra,
        )

    def new_histogram(self) -> HdrHistogram:
        """An empty histogram of this layout."""
        return _histogram(self.min_us, self.max_us, self.significant_digits)

    def slot_of(self, value: int) -> int:
        """The counts index ``HdrHistogram.record_value(value)`` increments, for ``min_us <=
        value <= max_us`` (hdrh's ``_counts_index_for``, with ``64 - clz`` as
        ``bit_length``)."""
        bucket = (value | self.sub_bucket_mask).bit_length() - self.bucket_shift
        return (
            ((bucket + 1) << self.sub_bucket_half_magnitude)
            + (value >> (bucket + self.unit_magnitude))
            - self.sub_bucket_half
        )


def _histogram(min_us: int, max_us: int, significant_digits: int) -> HdrHistogram:
    # hdrh needs highest >= 2 x lowest; callers clamp values to [min_us, max_us] anyway.
    return HdrHistogram(min_us, max(max_us, 2 * min_us), significant_digits, word_size=WORD_SIZE)


class Recorder:
    """A histogram recorded through its counts array: :meth:`add` (or an inlined copy of
    it) writes a sample's slot, found by :meth:`HistogramLayout.slot_of`, and keeps the
    sample count and range here, in slots (cheaper than the histogram's attributes);
    :meth:`synced_histogram` copies them into the histogram before it is read. The
    histogram is allocated by :meth:`allocate` and then reused: :meth:`clear` empties it."""

    __slots__ = ("counts", "histogram", "max_us", "min_us", "samples")

    def __init__(self) -> None:
        self.samples = 0
        self.min_us = sys.maxsize
        self.max_us = 0
        self.histogram: HdrHistogram | None = None
        self.counts: ctypes.Array[Any] | None = None
        """The histogram's own counts array (ctypes); None until :meth:`allocate`."""

    def allocate(self, layout: HistogramLayout) -> ctypes.Array[Any]:
        """Adopt an empty histogram of ``layout`` for the samples; its counts array."""
        histogram = layout.new_histogram()
        counts: ctypes.Array[Any] = histogram.counts
        self.histogram = histogram
        self.counts = counts
        return counts

    def add(self, counts: ctypes.Array[Any], slot: int, value: int) -> None:
        """Count a sample of ``value``, whose slot in ``counts`` (this recorder's) is
        ``slot``: what ``HdrHistogram.record_value(value)`` does."""
        counts[slot] += 1
        self.samples += 1
        if value > self.max_us:
            self.max_us = value
        if value < self.min_us:
            self.min_us = value

    def synced_histogram(self) -> HdrHistogram | None:
        """The histogram, with its total, min and max brought up to date; None when it holds
        no sample."""
        histogram = self.histogram
        if histogram is None or not self.samples:
            return None
        histogram.total_count = self.samples
        histogram.min_value = self.min_us
        histogram.max_value = self.max_us
        return histogram

    def clear(self) -> None:
        """Forget every sample, as ``HdrHistogram.reset`` does (which loops in Python over
        every slot): one ``memset``. The histogram is kept for reuse."""
        histogram = self.histogram
        if not self.samples or histogram is None:
            return
        self.samples = 0
        self.min_us = sys.maxsize
        self.max_us = 0
        counts = histogram.counts
        ctypes.memset(ctypes.addressof(counts), 0, ctypes.sizeof(counts))
        histogram.total_count = 0
        histogram.min_value = sys.maxsize
        histogram.max_value = 0


def merge_into(target: HdrHistogram, source: HdrHistogram) -> None:
    """Add ``source``'s samples to ``target`` (same layout: both from one
    :class:`HistogramLayout`), as ``target.add(source)`` does, without its ~10 us of Python
    range checks. One difference: ``min_value`` stays exact (``add`` sets it to 0 when
    ``target`` was empty)."""
    target.encoder.add(source.encoder)
    target.total_count += source.total_count
    target.min_value = min(target.min_value, source.min_value)
    target.max_value = max(target.max_value, source.max_value)


def percentile_values(histogram: HdrHistogram, percentiles: Sequence[float]) -> dict[float, int]:
    """The value at each percentile, exactly as ``histogram.get_percentile_to_value_dict``
    gives it (percentiles above 100 are left out), but computed with a C-level cumulative
    sum over the slots between the histogram's min and max values and a binary search per
    percentile, instead of a Python loop over every slot (tens of us instead of ~270-400 us).
    Empty when the histogram holds no sample. ``min_value`` and ``max_value`` must bound the
    recorded values (hdrh keeps them exact; after its ``add``, ``min_value`` may be lower)."""
    total = histogram.get_total_count()
    if not total:
        return {}
    last = histogram.counts_len - 1
    first = min(max(0, histogram.get_counts_array_index(histogram.min_value)), last)
    end = min(max(0, histogram.get_counts_array_index(histogram.max_value)), last) + 1
    size = histogram.word_size
    raw = bytes(histogram.counts)
    counts = array.array(_TYPECODES[size], raw[first * size : end * size])
    cumulative = list(itertools.accumulate(counts))
    result: dict[float, int] = {}
    for percentile in sorted(set(percentiles)):
        if percentile > 100:
            break
        target = histogram.get_target_count_at_percentile(percentile)
        # min(): only if total_count overstated the counts, which Recorder never does.
        offset = min(bisect.bisect_left(cumulative, target), len(cumulative) - 1)
        value = histogram.get_value_from_index(first + offset)
        if percentile:
            result[percentile] = histogram.get_highest_equivalent_value(value)
        else:
            result[percentile] = histogram.get_lowest_equivalent_value(value)
    return result
