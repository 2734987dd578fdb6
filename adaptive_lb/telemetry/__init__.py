"""What a decision and the hosts look like from outside: decision attributes and events
(``tracing``, ``candidate_entries``), request span names and attributes
(``span_attributes``), and the snapshots the exporters and the CLI read (``snapshot``,
``host_snapshot``).

Imports :mod:`adaptive_lb.health`, :mod:`adaptive_lb.plan`, :mod:`adaptive_lb.stats`,
:mod:`adaptive_lb.config` and :mod:`adaptive_lb.core`; OpenTelemetry's API.
"""
