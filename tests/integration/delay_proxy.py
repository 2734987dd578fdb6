"""A TCP proxy that delays every byte by a fixed time each way: a far zone on loopback.

Run as its own process (so that its work never competes with the driver for the test
process's GIL), one listening address per proxied node::

    python -m tests.integration.delay_proxy --delay 0.0015 \\
        127.0.5.2:9042=127.0.3.2:9042 127.0.5.3:9042=127.0.3.3:9042

It prints ``ready`` once every address listens, and stops on SIGTERM or when its stdin
closes. :class:`DelayProxy` starts it and stops it by PID. Each direction of each connection
keeps its order: a chunk read at ``t`` is written at ``t + delay``, after the chunks before
it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((loop.time() + delay, data))
    except ConnectionError:
        pass
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError):
            await sender
        writer.close()


async def _serve(routes: dict[tuple[str, int], tuple[str, int]], delay: float) -> None:
    async def handle(
        listen: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*routes[listen])
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            _pump(reader, up_writer, delay), _pump(up_reader, writer, delay), return_exceptions=True
        )

    servers = []
    for listen in routes:
        servers.append(
            await asyncio.start_server(
                lambda r, w, at=listen: handle(at, r, w), *listen, reuse_address=True
            )
        )
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Connections still open at exit are cancelled: nothing to report about them.
    loop.set_exception_handler(lambda _loop, _context: None)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(0, 1024) else None)
    await stop.wait()
    for server in servers:
        server.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``LISTEN=TARGET`` routes and serve them until stopped."""
    parser = argparse.ArgumentParser(prog="python -m tests.integration.delay_proxy")
    parser.add_argument("--delay", type=float, required=True, help="seconds, each way")
    parser.add_argument("routes", nargs="+", metavar="LISTEN=TARGET")
    args = parser.parse_args(argv)
    routes = {
        _address(listen): _address(target)
        for listen, _, target in (route.partition("=") for route in args.routes)
    }
    asyncio.run(_serve(routes, args.delay))


class DelayProxy:
    """The proxy process: :meth:`start` waits until it listens, :meth:`stop` ends it by PID."""

    def __init__(self, routes: dict[str, str], delay: float) -> None:
        self.routes = routes
        self.delay = delay
        self._process: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 10.0) -> DelayProxy:
        """Start the process; raise if it is not listening within ``timeout`` seconds."""
        command = [
            sys.executable,
            "-m",
            "tests.integration.delay_proxy",
            "--delay",
            str(self.delay),
        ]
        command += [f"{listen}={target}" for listen, target in self.routes.items()]
        process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._process = process
        assert process.stdout is not None
        ready = _read_line(process.stdout.fileno(), timeout)
        if ready.strip() != "ready":
            self.stop()
            raise RuntimeError(f"delay proxy did not start: {ready!r}")
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def _read_line(fd: int, timeout: float) -> str:
    """One line from ``fd``, or what came before ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        line += chunk
    return line.decode()


if __name__ == "__main__":
    main()
