"""The hot-path counters: the repr format they are read from, and exactness under threads."""

from __future__ import annotations

import threading

from adaptive_lb.core.counting import counter_value, new_counter


def test_value_is_read_without_advancing():
    counter = new_counter()
    assert counter_value(counter) == 0
    for expected in range(1, 1001):
        next(counter)
        assert counter_value(counter) == expected
    assert counter_value(counter) == 1000


def test_large_values_survive_the_repr():
    counter = new_counter()
    for _ in range(10):
        next(counter)
    assert counter_value(counter) == 10
    big = type(counter)(2**70)  # itertools.count past a machine word
    assert counter_value(big) == 2**70


def test_exact_under_threads():
    counter = new_counter()

    def work() -> None:
        for _ in range(20_000):
            next(counter)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter_value(counter) == 8 * 20_000
