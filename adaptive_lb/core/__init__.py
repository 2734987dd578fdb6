"""The bottom of the library: the clock every duration is measured with, counters read
without a lock, the library's own error accounting, and what a forked child must forget.

Imports the standard library only (and, for ``forks``, nothing of adaptive-lb above it).
"""
