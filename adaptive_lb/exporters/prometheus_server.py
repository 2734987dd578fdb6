"""Serving ``/metrics``: one collector per registry for every policy exported to it, one HTTP
server per address and port shared by every call that asks for it, and a forked child that
starts afresh (:func:`start_prometheus_server`). The metric families themselves are
:class:`adaptive_lb.exporters.prometheus.AdaptiveLbCollector`'s.

Imports prometheus-client, forks and the exporters' members and collector only.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from adaptive_lb.core import forks
from adaptive_lb.exporters.members import policy_list
from adaptive_lb.exporters.prometheus import AdaptiveLbCollector

__all__ = ["PrometheusServer", "start_prometheus_server"]


class _Endpoint:
    """One HTTP server of ``/metrics`` and how many :class:`PrometheusServer` hold it."""

    def __init__(self, httpd: Any, thread: Any, registry: CollectorRegistry, key: Any) -> None:
        self.httpd, self.thread, self.registry, self.key = httpd, thread, registry, key
        self.holders = 0


# Guards both maps, and the registration and unregistration of the shared collectors.
_lock = threading.RLock()
# The collector serving every policy exported to a registry, while it serves any.
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, AdaptiveLbCollector] = (
    weakref.WeakKeyDictionary()
)
# The running servers by (address, port), each serving one registry.
_endpoints: dict[tuple[str, int], _Endpoint] = {}


def _after_fork_in_child() -> None:
    """A forked child serves none of the parent's endpoints or policies
    (:mod:`adaptive_lb.core.forks`): their threads stayed there, their sockets are closed here,
    and attachments made in the child start afresh on the same collectors."""
    global _lock
    _lock = threading.RLock()
    for endpoint in _endpoints.values():
        with contextlib.suppress(OSError):
            endpoint.httpd.socket.close()
    _endpoints.clear()
    for collector in list(_collectors.values()):
        collector.members.clear()


forks.on_fork_in_child(_after_fork_in_child)


def _join(registry: CollectorRegistry, policies: list[Any], names: Sequence[str] | None) -> None:
    collector = _collectors.get(registry)
    if collector is not None:
        collector.add(policies, names)
        return
    collector = AdaptiveLbCollector(policies, names)
    registry.register(collector)  # may raise: the caller's own collector has these names
    _collectors[registry] = collector


def _leave(registry: CollectorRegistry, policies: list[Any]) -> None:
    collector = _collectors.get(registry)
    if collector is None:
        return
    collector.remove(policies)
    if len(collector.members) == 0:
        del _collectors[registry]
        registry.unregister(collector)


def _open_endpoint(addr: str, port: int, registry: CollectorRegistry) -> _Endpoint:
    endpoint = _endpoints.get((addr, port)) if port else None
    if endpoint is None:
        httpd, thread = start_http_server(port, addr=addr, registry=registry)
        key = (addr, httpd.server_port)
        endpoint = _endpoints[key] = _Endpoint(httpd, thread, registry, key)
    elif endpoint.registry is not registry:
        raise OSError(
            errno.EADDRINUSE,
            "adaptive-lb already serves another Prometheus registry there "
            "(the same address and port share one registry)",
        )
    endpoint.holders += 1
    return endpoint


class PrometheusServer:
    """What :func:`start_prometheus_server` returns: one hold on the HTTP server of an
    address and port, which every call asking for that address and port shares.
    :meth:`shutdown` (or :meth:`server_close`, or :meth:`close`) stops serving this call's
    policies, and stops the server when no other call holds it. ``server_port``,
    ``server_address`` and the other attributes are the underlying server's."""

    def __init__(self, endpoint: _Endpoint, registry: CollectorRegistry, policies: list[Any]):
        self._endpoint = endpoint
        self._registry = registry
        self._policies = policies
        self.closed = False

    @property
    def server_port(self) -> int:
        return int(self._endpoint.httpd.server_port)

    @property
    def server_address(self) -> Any:
        return self._endpoint.httpd.server_address

    def close(self) -> None:
        """Stop serving this call's policies; the last holder stops the server. Idempotent."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            _leave(self._registry, self._policies)
            endpoint = self._endpoint
            endpoint.holders -= 1
            if endpoint.holders > 0 or _endpoints.get(endpoint.key) is not endpoint:
                return  # held by another call, or the parent's (this is a forked child)
            _endpoints.pop(endpoint.key, None)
            # Under the lock: an attach racing this one binds the port once it is free.
            endpoint.httpd.shutdown()
            endpoint.httpd.server_close()

    def shutdown(self) -> None:
        """:meth:`close` (the name ``http.server`` gives it)."""
        self.close()

    def server_close(self) -> None:
        """:meth:`close` (the name ``http.server`` gives it)."""
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._endpoint.httpd, name)


def start_prometheus_server(
    port: int,
    addr: str = "127.0.0.1",
    policies: Any | Iterable[Any] = (),
    registry: CollectorRegistry | None = None,
    names: Sequence[str] | None = None,
) -> tuple[PrometheusServer, Any]:
    """Serve ``/metrics`` for ``policies`` (a policy or several, see
    :class:`AdaptiveLbCollector`) on ``addr:port`` -- loopback by default; port 0 picks a
    free one. ``registry`` defaults to prometheus_client's global one (which also exposes
    the process and platform collectors).

    Calls may repeat, for as many sessions as the process has: one collector per registry
    serves every policy given to any call (``names`` default to the lowest free ``"0"``,
    ``"1"``, ...; a name already another policy's raises ``ValueError``), and calls asking
    for the same address and port share one server (a different registry there raises
    ``OSError``). Returns ``(server, thread)``: ``server.server_port`` is the port,
    ``server.shutdown()`` removes this call's policies (their series disappear) and stops
    the server when no other call holds it."""
    registry = registry if registry is not None else REGISTRY
    served = policy_list(policies)
    with _lock:
        if served:
            _join(registry, served, names)
        try:
            endpoint = _open_endpoint(addr, port, registry)
        except BaseException:
            _leave(registry, served)
            raise
    return PrometheusServer(endpoint, registry, served), endpoint.thread
