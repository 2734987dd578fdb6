"""Loopback ports for the test servers: pick a free one, check one can be bound or is open.

Imports the standard library only.
"""

from __future__ import annotations

import socket

__all__ = ["can_bind", "free_tcp_port", "port_open"]


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def can_bind(ip: str, port: int) -> bool:
    """True if a server could listen on ``ip:port`` now (TIME_WAIT leftovers do not count,
    as for the JVM's server sockets, which set ``SO_REUSEADDR``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
        return True


def port_open(address: str, port: int, timeout: float = 0.5) -> bool:
    """True if a TCP connection to ``address:port`` succeeds within ``timeout`` seconds."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False
