# C types for adaptive_lb/stats.py, on the optional compiled hot path
# (adaptive_lb/_extensions.py). Each cdef class declares exactly the __slots__ of its class
# in the .py (tests/unit/test_extensions.py checks).
cimport cython
from adaptive_lb.window cimport SlidingWindow

cdef class HostStats:
    cdef object __weakref__
    cdef public object _clock_now
    cdef public long long _deadline_ns
    cdef public list _events
    cdef public object _lock
    cdef public double _penalty_after_probe
    cdef public object _replay_lock
    cdef public SlidingWindow _window
    cdef public long long abandons_total
    cdef public long long errors_total
    cdef public double health_penalty
    cdef public object health_state
    cdef public long long in_flight
    cdef public long long probe_left
    cdef public double rack_penalty
    cdef public long long requests_total
    cdef public long long timeouts_total
    cdef public long long underflows
    cdef public long long unsent_total

    cpdef on_send(self)
    @cython.locals(now=cython.longlong, events=list)
    cpdef on_success(self, latency_ns)
    cpdef on_abandon(self)
    cpdef on_unsent(self)
    @cython.locals(now=cython.longlong)
    cpdef _settle(self, tuple event)
    cpdef _release(self)
    @cython.locals(interval_ns=cython.longlong, steps=cython.longlong)
    cpdef _mark_rotation(self, long long now)
    cpdef SlidingWindow _replay(self)
