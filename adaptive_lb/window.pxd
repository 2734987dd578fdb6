# C types for adaptive_lb/window.py, on the optional compiled hot path
# (adaptive_lb/_extensions.py). Each cdef class declares exactly the __slots__ of its class
# in the .py (tests/unit/test_extensions.py checks).
cimport cython
from adaptive_lb._hdr cimport Recorder

cdef class _Interval(Recorder):
    cdef public long long errors
    cdef public long long successes
    cdef public long long timeouts

cdef class SlidingWindow:
    cdef public object layout
    cdef public list _intervals
    cdef public Py_ssize_t _current
    cdef public object ewma_s

    @cython.locals(min_us=cython.longlong, max_us=cython.longlong, alpha=cython.double,
                   mask=cython.longlong, shift=cython.longlong, half_magnitude=cython.longlong,
                   half=cython.longlong, unit=cython.longlong, interval=_Interval,
                   counts=cython.uint[::1], value=cython.longlong, bucket=cython.longlong,
                   seconds=cython.double, successes=cython.longlong, low=cython.longlong,
                   high=cython.longlong)
    cpdef replay(self, events)
    cpdef _record(self, _Interval interval, latency_ns)
    cpdef _rotate(self, steps)
