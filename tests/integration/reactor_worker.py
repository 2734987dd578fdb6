"""A worker process for ``test_reactors.py``: an application on gevent or on asyncio.

``python -c "$(cat reactor_worker.py)" gevent|asyncio CONTACT SLOW_ADDRESS SECONDS DIR``
connects the real driver with that reactor (gevent: ``GeventConnection``, or on
scylla-driver, which has none, ``AsyncioConnection``) to a Simulacron cluster (``ks`` and
``QUERY`` primed, ``SLOW_ADDRESS`` slowed), wraps
``TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1"))`` in adaptive-lb, attaches with
Prometheus on port 0, runs ``CONCURRENCY`` concurrent callers (greenlets, or asyncio tasks
awaiting ``execute_async``) for ``SECONDS``, halfway rewrites its config file
(``DIR/adaptive-lb.yaml``, hot reload on), scrapes its own ``/metrics``, prints one
JSON report, shuts the cluster down and exits.

gevent: ``monkey.patch_all()`` comes first, before anything imports ``threading``,
``socket`` or the driver (gevent's rule). Run as ``-c`` from the repository root: by path,
``tests/integration/cassandra.py`` would shadow the driver; as ``-m tests...``, package
``__init__`` files would be imported before the patching.
"""

import os
import sys

MODE = sys.argv[1]
BLOCKED: list[list[str]] = []
"""gevent: the stacks of the greenlets that held the hub longer than ``max_blocking_time``
(gevent's monitor thread reports them)."""
if MODE == "gevent":
    import warnings

    os.environ["GEVENT_MONITOR_THREAD_ENABLE"] = "1"
    os.environ.setdefault("GEVENT_MAX_BLOCKING_TIME", "0.1")  # gevent's default
    warnings.filterwarnings("ignore", "Unable to monitor memory usage")  # (needs psutil)
    from gevent import monkey

    monkey.patch_all()

    import traceback

    import zope.event
    from gevent.events import IEventLoopBlocked

    _MAIN = monkey.get_original("_thread", "get_ident")()  # the hub and every greenlet's

    def _blocked(event) -> None:
        """On the monitor thread: what the main thread is running while the hub waits."""
        if IEventLoopBlocked.providedBy(event):
            frame = sys._current_frames().get(_MAIN)
            stack = traceback.extract_stack(frame) if frame is not None else []
            BLOCKED.append([f"{f.filename}:{f.lineno} {f.name}" for f in stack])

    zope.event.subscribers.append(_blocked)

import collections  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy  # noqa: E402

import adaptive_lb  # noqa: E402
from adaptive_lb.config import parse_config  # noqa: E402
from adaptive_lb.tools.peers.connect import connect_driver, wait_for_pools  # noqa: E402

QUERY = "SELECT v FROM ks.t WHERE k = ?"
CONCURRENCY = 8
CONFIG = """
policy: {local_rack: null}
tracking: {window: 4s, intervals: 4}
health: {percentile: 50, refresh_interval: 0.1s, min_samples: 20, slow_start: 1s,
         probe_interval: 0.2s}
metrics: {prometheus_enabled: true, port: 0}
reload: {enabled: true, interval: 0.1s}
"""
RELOADED = CONFIG.replace("probe_interval: 0.2s", "probe_interval: 0.3s")
"""Written over the attached file halfway: the config watcher's thread (a greenlet under
gevent) reloads it."""


def connection_class():
    if len(sys.argv) > 6:  # by hand, module:Class (docs/deployment.md's caveats)
        module, _, name = sys.argv[6].partition(":")
        return getattr(__import__(module, fromlist=[name]), name)
    if MODE == "gevent":
        try:
            from cassandra.io.geventreactor import GeventConnection
        except ImportError:  # scylla-driver has none: its asyncio reactor runs on gevent
            pass
        else:
            return GeventConnection
    from cassandra.io.asyncioreactor import AsyncioConnection

    return AsyncioConnection


class Counts:
    """Per coordinator address, the requests that ended in each phase (0: warm-up)."""

    def __init__(self) -> None:
        self.by_phase: list[dict[str, int]] = [{}, {}]
        self.failures: list[str] = []
        self.phase = 0
        self.slow_states: set[str] = set()

    def watch(self, policy, slow: str) -> None:
        """Note the slow host's health state (every 0.1 s, from a greenlet or a task)."""
        for view in policy.topology.by_id.values():
            if view.host.address == slow:
                self.slow_states.add(view.stats.health_state.value)

    def answered(self, future) -> None:
        host = future.attempted_hosts[-1].address
        counts = self.by_phase[self.phase]
        counts[host] = counts.get(host, 0) + 1


def run_gevent(session, statement, seconds: float, counts: Counts, watch, halfway) -> None:
    import gevent

    deadline = time.monotonic() + seconds

    def watcher() -> None:
        while time.monotonic() < deadline:
            watch()
            gevent.sleep(0.1)

    def caller(offset: int) -> None:
        k = offset
        while time.monotonic() < deadline:
            k += CONCURRENCY
            try:
                result = session.execute(statement, [k % 5000])
                counts.answered(result.response_future)
            except Exception as exc:
                counts.failures.append(repr(exc))

    callers = [gevent.spawn(caller, i) for i in range(CONCURRENCY)]
    callers.append(gevent.spawn(watcher))
    gevent.sleep(seconds / 2)
    halfway()
    gevent.joinall(callers, timeout=seconds + 30, raise_error=True)


def run_asyncio(session, statement, seconds: float, counts: Counts, watch, halfway) -> None:
    import asyncio

    async def execute(k: int):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        future = session.execute_async(statement, [k % 5000])

        def done(rows, result=True):
            if not waiter.done():
                (waiter.set_result if result else waiter.set_exception)(rows)

        future.add_callbacks(
            lambda rows: loop.call_soon_threadsafe(done, rows),
            lambda exc: loop.call_soon_threadsafe(done, exc, False),
        )
        await waiter
        return future

    async def caller(offset: int, deadline: float) -> None:
        k = offset
        while time.monotonic() < deadline:
            k += CONCURRENCY
            try:
                counts.answered(await execute(k))
            except Exception as exc:
                counts.failures.append(repr(exc))

    async def watcher(deadline: float) -> None:
        while time.monotonic() < deadline:
            watch()
            await asyncio.sleep(0.1)

    async def main() -> None:
        deadline = time.monotonic() + seconds
        tasks = [asyncio.create_task(caller(i, deadline)) for i in range(CONCURRENCY)]
        tasks.append(asyncio.create_task(watcher(deadline)))
        await asyncio.sleep(seconds / 2)
        halfway()
        await asyncio.wait_for(asyncio.gather(*tasks), seconds + 30)

    asyncio.run(main())


def tracing():
    """The OpenTelemetry SDK with an in-memory exporter: request spans are made and ended
    on the reactor's greenlets or threads."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def scraped_requests(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(r"^adaptive_lb_host_requests_total\{[^}]*\} (\S+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def main() -> None:
    contact, slow, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
    config = parse_config(CONFIG)
    policy = adaptive_lb.AdaptiveLoadBalancingPolicy(
        TokenAwarePolicy(DCAwareRoundRobinPolicy("dc1")), config
    )
    cluster, session = connect_driver([contact], policy, connection_class=connection_class())
    provider, spans = tracing()
    path = os.path.join(sys.argv[5] if len(sys.argv) > 5 else ".", "adaptive-lb.yaml")
    with open(path, "w") as handle:
        handle.write(CONFIG)
    attachment = adaptive_lb.attach(session, path, tracer_provider=provider)
    wait_for_pools(session, "dc1")
    statement = session.prepare(QUERY)
    counts = Counts()
    run = run_gevent if MODE == "gevent" else run_asyncio

    def halfway() -> None:
        counts.phase = 1
        with open(path + ".new", "w") as handle:
            handle.write(RELOADED)
        os.replace(path + ".new", path)

    run(session, statement, seconds, counts, lambda: counts.watch(policy, slow), halfway)
    snapshot = policy.snapshot()
    hosts = {h.address: h for h in snapshot.hosts if h.datacenter == "dc1"}
    measured = counts.by_phase[1]
    report = {
        "reactor": cluster.connection_class.__name__,
        "threads": [t.name for t in threading.enumerate()],
        "native_threads": len(os.listdir("/proc/self/task")) if sys.platform == "linux" else None,
        "hub_blocked": len(BLOCKED),
        # Innermost adaptive-lb frame of each block that had one.
        "hub_blocked_in_adaptive_lb": [
            [x for x in b if "/adaptive_lb/" in x][-1]
            for b in BLOCKED
            if any("/adaptive_lb/" in x for x in b)
        ],
        "request_tracking": snapshot.request_tracking,
        "health_refreshes": snapshot.health_refreshes,
        "internal_errors": snapshot.internal_errors,
        "loop_timers_fired": policy.health.lateness.loop_timers_fired,
        "failures": counts.failures[:5],
        "failure_count": len(counts.failures),
        "requests": sum(sum(c.values()) for c in counts.by_phase),
        "second_half": measured,
        "slow_share": measured.get(slow, 0) / max(1, sum(measured.values())),
        "slow_state": hosts[slow].health_state,
        "slow_states_seen": sorted(counts.slow_states),
        "slow_latency_factor": hosts[slow].latency_factor,
        "states": {a: h.health_state for a, h in hosts.items()},
        "probes_sent": sum(h.probes_sent_total for h in hosts.values()),
        "probes_answered": sum(h.probes_answered_total for h in hosts.values()),
        "tracked_requests": sum(h.requests_total for h in hosts.values()),
        "config_reloads": snapshot.config_reloads,
        "probe_interval": policy.config.health.probe_interval,
        "spans": dict(collections.Counter(span.name for span in spans.get_finished_spans())),
        "prometheus_port": attachment.prometheus_port,
        "scraped_requests": scraped_requests(attachment.prometheus_port),
    }
    print(json.dumps(report), flush=True)
    cluster.shutdown()
    print(json.dumps({"shutdown": True}), flush=True)


if __name__ == "__main__":
    main()
