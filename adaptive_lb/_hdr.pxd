# C types for adaptive_lb/_hdr.py, on the optional compiled hot path
# (adaptive_lb/_extensions.py). Each cdef class declares exactly the __slots__ of its class
# in the .py (tests/unit/test_extensions.py checks).
cdef class Recorder:
    cdef public object counts
    cdef public object histogram
    cdef public long long max_us
    cdef public long long min_us
    cdef public long long samples
