"""What adaptive-lb's numbers are exported through: a Prometheus collector computed at
scrape time, and (see :mod:`adaptive_lb.exporters.prometheus`) an HTTP endpoint for it."""

from adaptive_lb.exporters.prometheus import AdaptiveLbCollector, start_prometheus_server

__all__ = ["AdaptiveLbCollector", "start_prometheus_server"]
