# C types for adaptive_lb/tracking.py, on the optional compiled hot path
# (adaptive_lb/_extensions.py). Each cdef class declares exactly the __slots__ of its class
# in the .py (tests/unit/test_extensions.py checks).
cimport cython
from adaptive_lb.stats cimport HostStats

cdef class _Attempts(dict):
    cdef public object policy

    @cython.locals(stats=HostStats)
    cpdef sent(self, host)
    cpdef not_sent(self, host)
    @cython.locals(stats=HostStats)
    cpdef answered(self, host, response)
    @cython.locals(stats=HostStats)
    cpdef ended(self, exception)
