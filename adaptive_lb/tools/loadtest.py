"""``adaptive-lb loadtest``: drive a load through the stock policy or adaptive-lb (or both,
one after the other) against your cluster or a simulated one, and compare.

By default the load is an *open loop*: ``--rate`` requests a second (500) whatever the
answers do, so both policies of ``--compare`` carry the same offered load and their
latencies compare like for like. ``--closed N`` runs a *closed loop* instead: N requests in
flight, each sent when the previous answers, as fast as the client goes; a policy that
answers faster then also gets more load (its throughput rises, and on a busy client its
median with it). The report says which loop ran.

    adaptive-lb loadtest --simulated --slow-node 2 --delay 20 --compare
    adaptive-lb loadtest --contact-points 10.0.0.1 --local-dc dc1 \\
        --query "SELECT * FROM app.users WHERE id = ?" --key-range 100000 \\
        --config adaptive-lb.yaml --compare

``--simulated`` starts Simulacron (fetched from Maven Central with ``mvn``; Java needed):
3 datacenters x 3 nodes on loopback, keyspace ``ks`` (NetworkTopologyStrategy, RF 2 per
DC), and optionally one slow ``dc1`` node. Only reads are sent; against a real cluster,
``--query`` is a statement with at most one ``?`` (an int drawn from ``--key-range``).

May import the library and the peers' load loop and Simulacron (on first use); the library
never imports a tool.
"""

from __future__ import annotations

import json
import random
import sys
from contextlib import ExitStack
from typing import Any, TextIO

from attrs import define, field

__all__ = ["SIMULATED_QUERY", "LoadtestOptions", "RunReport", "run_loadtest"]

SIMULATED_QUERY = "SELECT v FROM ks.t WHERE k = ?"


@define
class LoadtestOptions:
    """Everything a load test run needs."""

    contact_points: list[str] = field(factory=list)
    port: int = 9042
    local_dc: str = "dc1"
    query: str | None = None
    key_range: int = 100_000
    rate: float = 500.0
    """Open loop: requests sent a second (ignored with ``closed``)."""
    closed: int | None = None
    """A closed loop of this many requests in flight instead of the open loop."""
    duration: float = 10.0
    timeout: float = 2.0
    policy: str = "adaptive"
    config: str | None = None
    compare: bool = False
    prometheus_port: int | None = None
    otlp_endpoint: str | None = None
    simulated: bool = False
    slow_node: int | None = None
    delay_ms: int = 20
    seed: int = 1
    json: bool = False
    snapshot: bool = False


@define
class RunReport:
    """What one policy did during one run."""

    policy: str
    requests: int
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int]
    """Exception type name -> failed requests."""
    error_messages: dict[str, str]
    """Exception type name -> the first such failure's message."""
    hosts: list[dict[str, Any]]
    load: dict[str, Any] = field(factory=dict)
    """The loop that ran: ``{"loop": "open", "rate": R, "offered": N}`` or ``{"loop":
    "closed", "in_flight": N}``."""
    snapshot: dict[str, Any] | None = None
    """The adaptive policy's ``snapshot().to_dict()`` at the end of the run (None: stock)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {
            "policy": self.policy,
            "requests": self.requests,
            "throughput": round(self.throughput, 1),
            "p50_ms": round(self.p50_ms, 2),
            "p95_ms": round(self.p95_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "errors": self.errors,
            "error_messages": self.error_messages,
            "hosts": self.hosts,
            "load": self.load,
            "snapshot": self.snapshot,
        }


def _make_policy(kind: str, options: LoadtestOptions, tracer_provider: Any = None) -> Any:
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    child = TokenAwarePolicy(DCAwareRoundRobinPolicy(options.local_dc))
    if kind == "stock":
        return child
    from adaptive_lb.config import Config
    from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy

    config = Config()
    if options.config:
        from adaptive_lb.config import load_config

        config = load_config(options.config)
    return AdaptiveLoadBalancingPolicy(child, config, tracer_provider=tracer_provider)


class _Progress:
    """A run's progress on ``err``: rewritten in place about once a second on a terminal;
    elsewhere (a pipe, a file) only the last state, once, when the run ends."""

    def __init__(self, label: str, err: TextIO, duration: float) -> None:
        self.label = label
        self.err = err
        self.duration = duration
        self.tty = bool(getattr(err, "isatty", lambda: False)())
        self.line = ""

    def show(self, elapsed: float, completed: int) -> None:
        """The state ``elapsed`` seconds in, ``completed`` requests answered or failed."""
        rate = completed / elapsed if elapsed > 0 else 0.0
        self.line = (
            f"  {self.label:<9} {min(elapsed, self.duration):5.1f}/{self.duration:.0f}s "
            f"{completed:>9,} requests {rate:>8,.0f} req/s"
        )
        if self.tty:
            self.err.write("\r" + self.line)
            self.err.flush()

    def done(self) -> None:
        """End the line (on a terminal) or write the last state (elsewhere)."""
        self.err.write("\n" if self.tty else self.line + "\n")
        self.err.flush()


def describe_load(load: dict[str, Any]) -> str:
    """One sentence saying which loop ran (the report's first line)."""
    if load.get("loop") == "closed":
        return (
            f"closed loop: {load['in_flight']} requests in flight, each sent when one answers: "
            "a policy that answers faster also gets more load (open loop: without --closed)"
        )
    return (
        f"open loop: {load['rate']:,g} requests a second offered to each policy, whatever "
        "the answers do: the same load, latencies compared like for like (--closed N: a "
        "closed loop)"
    )


def _drive(
    options: LoadtestOptions,
    session: Any,
    make_statement: Any,
    progress: _Progress,
    request_context: Any,
) -> tuple[Any, dict[str, Any]]:
    """Run the loop the options ask for: (its :class:`LoadResult`, the report's ``load``)."""
    from adaptive_lb.tools.peers.load import closed_loop, open_loop

    if options.closed is not None:
        result = closed_loop(
            session,
            make_statement,
            options.closed,
            options.duration,
            timeout=options.timeout,
            progress=progress.show,
            request_context=request_context,
        )
        return result, {"loop": "closed", "in_flight": options.closed}
    result = open_loop(
        session,
        make_statement,
        options.rate,
        options.duration,
        timeout=options.timeout,
        progress=progress.show,
        request_context=request_context,
    )
    return result, {"loop": "open", "rate": options.rate, "offered": result.offered}


def _one_run(
    kind: str,
    options: LoadtestOptions,
    contact_points: list[str],
    err: TextIO,
    connect: Any,
    tracer_provider: Any = None,
) -> RunReport:
    from adaptive_lb.runtime.attachment import attach
    from adaptive_lb.runtime.policy import AdaptiveLoadBalancingPolicy
    from adaptive_lb.tools.peers.load import key_maker

    policy = _make_policy(kind, options, tracer_provider)
    request_context = None
    if tracer_provider is not None:
        # One span per request, so the policy has a recording parent for its decision.
        tracer = tracer_provider.get_tracer("adaptive_lb.loadtest")

        def request_context() -> Any:
            return tracer.start_as_current_span(f"loadtest {kind} request")

    cluster, session = connect(contact_points, policy, port=options.port)
    with ExitStack() as stack:
        stack.callback(cluster.shutdown)
        if isinstance(policy, AdaptiveLoadBalancingPolicy):
            # Tracking, health, and a request span per request when tracing to OTLP.
            attach(session, tracer_provider=tracer_provider)
            if options.prometheus_port is not None:
                from adaptive_lb.exporters import start_prometheus_server

                server, _thread = start_prometheus_server(
                    options.prometheus_port, policies=[policy]
                )
                stack.callback(server.close)  # this run's series go with it
        query = options.query or ("SELECT release_version FROM system.local")
        has_key = "?" in query
        statement = session.prepare(query) if has_key else query
        rng = random.Random(options.seed)
        key_range = options.key_range

        key = key_maker(statement) if has_key else None

        def make_statement(_i: int) -> tuple[Any, Any]:
            return statement, ([key(rng.randrange(key_range))] if key else None)

        progress = _Progress(kind, err, options.duration)
        result, load = _drive(options, session, make_statement, progress, request_context)
        progress.done()
        hosts = []
        total = sum(result.attempts.values()) or 1
        health = {}
        snapshot = None
        if isinstance(policy, AdaptiveLoadBalancingPolicy):
            taken = policy.snapshot()
            health = {h.address: h for h in taken.hosts}
            snapshot = taken.to_dict()
        for host in sorted(cluster.metadata.all_hosts(), key=lambda h: (h.datacenter, h.address)):
            attempts = result.attempts.get(host.address, 0)
            if not attempts and host.datacenter != options.local_dc:
                continue
            entry = {
                "address": host.address,
                "dc": host.datacenter,
                "rack": host.rack,
                "attempts": attempts,
                "share": round(attempts / total, 4),
            }
            if host.address in health:
                entry["health"] = health[host.address].health_state
                entry["penalty"] = round(health[host.address].health_penalty, 2)
            hosts.append(entry)
        return RunReport(
            policy=kind,
            requests=result.requests,
            throughput=result.requests / options.duration,
            p50_ms=result.percentile(50) * 1000,
            p95_ms=result.percentile(95) * 1000,
            p99_ms=result.percentile(99) * 1000,
            errors=dict(result.errors),
            error_messages=dict(result.error_messages),
            hosts=hosts,
            load=load,
            snapshot=snapshot,
        )


def _print_report(reports: list[RunReport], out: TextIO) -> None:
    if reports:
        out.write(describe_load(reports[0].load) + "\n")
    for report in reports:
        offered = report.load.get("offered")
        if offered and report.requests < 0.99 * offered:
            out.write(
                f"\n{report.policy}: sent {report.requests:,} of the {offered:,} requests "
                "offered: the client could not keep up (a lower --rate compares better)"
            )
        out.write(
            f"\n{report.policy}: {report.requests:,} requests ({report.throughput:,.0f}/s), "
            f"p50 {report.p50_ms:.2f} ms, p95 {report.p95_ms:.2f} ms, "
            f"p99 {report.p99_ms:.2f} ms, errors {sum(report.errors.values())}"
            f"{' ' + str(report.errors) if report.errors else ''}\n"
        )
        for name, message in report.error_messages.items():
            out.write(f"  {name}: {message}\n")
        out.write(f"  {'host':<18}{'dc':<6}{'rack':<6}{'attempts':>10}{'share':>9}  health\n")
        for host in report.hosts:
            health = host.get("health", "")
            if health:
                health = f"{health} (x{host['penalty']:g})"
            out.write(
                f"  {host['address']:<18}{host['dc']:<6}{host['rack'] or '':<6}"
                f"{host['attempts']:>10,}{host['share']:>9.1%}  {health}\n"
            )
    if len(reports) == 2:
        a, b = reports
        out.write(f"\n  {'':<12}{a.policy:>12}{b.policy:>12}\n")
        for label, x, y in (
            ("throughput", f"{a.throughput:,.0f}/s", f"{b.throughput:,.0f}/s"),
            ("p50", f"{a.p50_ms:.2f} ms", f"{b.p50_ms:.2f} ms"),
            ("p95", f"{a.p95_ms:.2f} ms", f"{b.p95_ms:.2f} ms"),
            ("p99", f"{a.p99_ms:.2f} ms", f"{b.p99_ms:.2f} ms"),
            ("errors", str(sum(a.errors.values())), str(sum(b.errors.values()))),
        ):
            out.write(f"  {label:<12}{x:>12}{y:>12}\n")


def run_loadtest(
    options: LoadtestOptions, out: TextIO | None = None, err: TextIO | None = None
) -> list[RunReport]:
    """Run the load test(s) and print the report (default: to ``sys.stdout``, progress to
    ``sys.stderr``, as they are when called); returns the reports."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from adaptive_lb.tools.peers.simulacron import connect_driver

    kinds = ["stock", "adaptive"] if options.compare else [options.policy]
    with ExitStack() as stack:
        contact_points = list(options.contact_points)
        provider = None
        if options.otlp_endpoint:
            from adaptive_lb.config import OtlpConfig, TracingConfig
            from adaptive_lb.exporters import setup_tracing

            provider = setup_tracing(
                TracingConfig(otlp=OtlpConfig(endpoint=options.otlp_endpoint, protocol="http"))
            )
            stack.callback(provider.shutdown)
        if options.simulated:
            contact_points = _start_simulated(options, stack, err)
        if not contact_points:
            raise SystemExit("give --contact-points, or --simulated")
        reports = [
            _one_run(kind, options, contact_points, err, connect_driver, provider) for kind in kinds
        ]
    if options.json:
        out.write(json.dumps([r.as_dict() for r in reports], indent=2) + "\n")
    else:
        _print_report(reports, out)
        if options.snapshot:
            for report in reports:
                if report.snapshot is not None:
                    out.write(f"\n{report.policy} policy snapshot:\n")
                    out.write(json.dumps(report.snapshot, indent=2) + "\n")
    return reports


def _start_simulated(options: LoadtestOptions, stack: ExitStack, err: TextIO) -> list[str]:
    from adaptive_lb.tools.peers.simulacron import Simulacron, ensure_simulacron_jar

    err.write("starting Simulacron (3 DCs x 3 nodes)...\n")
    sim = Simulacron(ensure_simulacron_jar(), fine_timer=True)
    sim.start()
    stack.callback(sim.stop)
    nodes = sim.create_cluster("loadtest", [["r1", "r2", "r3"]] * 3)
    sim.prime_keyspace("ks", {"dc1": 2, "dc2": 2, "dc3": 2})
    rows, column_types, param_types = [{"v": 1}], {"v": "int"}, {"k": "int"}
    sim.prime(SIMULATED_QUERY, rows, column_types, param_types=param_types)
    options.local_dc = "dc1"
    options.query = options.query or SIMULATED_QUERY
    options.key_range = min(options.key_range, 100_000)
    if options.slow_node is not None:
        address = nodes["dc1"][options.slow_node - 1]
        delay = options.delay_ms if sim.fine_timer else max(100, options.delay_ms)
        sim.prime(
            SIMULATED_QUERY,
            rows,
            column_types,
            param_types=param_types,
            delay_ms=delay,
            scope=sim.scope_of(address),
        )
        err.write(f"slow node: {address} (+{delay} ms)\n")
    return [nodes["dc1"][0]]
