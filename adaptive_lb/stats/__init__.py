"""What is measured about each host, off the request path: its counters and sliding window
(``host``, ``window``, ``_hdr``: every HdrHistogram internal), which requests are tracked
(``sampling``), its probes (``probe_record``), the node's own thread pools
(``server_load``), how many clients share the nodes and the budget of reads and probes they
keep to (``fleet``), its latency factor (``latency_factor``), the client's own lateness
(``lateness``), the registry of hosts (``registry``) and the health states published on a
host (``health_state``). Pure logic: no driver import.

Imports :mod:`adaptive_lb.core` and :mod:`adaptive_lb.config`.
"""
