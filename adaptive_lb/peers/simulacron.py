"""Run Simulacron (a simulated CQL cluster) and drive it over its REST API.

Simulacron (``com.datastax.oss.simulacron:simulacron-standalone``) is a Java process that
speaks the CQL native protocol on many loopback addresses (one per simulated node) and answers
whatever was *primed* through its REST API: rows, errors, delays, hangs. The real Python driver
connects to it as to a real cluster, so a load-balancing policy can be tested end to end.

Typical use (see ``conftest.py`` for the pytest fixtures)::

    jar = ensure_simulacron_jar()
    with Simulacron(jar, fine_timer=True) as sim:
        nodes = sim.create_cluster("c1", [["r1", "r2", "r3"]] * 3)   # 3 DCs x 3 nodes
        sim.prime_keyspace("ks", {"dc1": 2, "dc2": 2, "dc3": 2})
        sim.prime("SELECT v FROM ks.t WHERE k = ?", rows=[{"v": 1}],
                  column_types={"v": "int"}, param_types={"k": "int"})
        sim.prime("SELECT v FROM ks.t WHERE k = ?", rows=[{"v": 1}],
                  column_types={"v": "int"}, param_types={"k": "int"},
                  delay_ms=100, scope=("dc1", "node2"))          # one slow node
        cluster, session = connect_driver([nodes["dc1"][0]], TokenAwarePolicy(...))

Facts that shape this module (measured, see ``/work/shared/notes/simulacron.md``):

* The stock jar's timer ticks every 100 ms, so a 1..99 ms ``delay_in_ms`` becomes ~100 ms.
  ``fine_timer=True`` starts the same server through a tiny launcher class with a 1 ms
  ``HashedWheelTimer`` (compiled on first use with ``javac``); it falls back to the stock
  jar when ``javac`` is missing or the launcher fails.
* Priming the same query twice in one scope keeps the FIRST prime: call
  :meth:`Simulacron.clear_primes` for that scope before re-priming.
* ``DELETE /prime/{cluster}`` also removes the ``system_schema.keyspaces`` prime; the driver then
  forgets the keyspace on its next schema refresh. :meth:`Simulacron.clear_primes` re-primes
  the keyspaces afterwards unless told not to.
* The driver must use ``protocol_version=4`` (v5 fails against Simulacron).

Only the standard library is used here; the driver is imported lazily by
:func:`connect_driver`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session
    from cassandra.policies import LoadBalancingPolicy

__all__ = [
    "DEFAULT_CACHE_DIR",
    "ERROR_RESULTS",
    "SIMULACRON_ARTIFACT",
    "SIMULACRON_VERSION",
    "Scope",
    "Simulacron",
    "SimulacronError",
    "build_fine_timer_launcher",
    "connect_driver",
    "ensure_simulacron_jar",
    "free_tcp_port",
    "pick_node_ip",
    "wait_for_pools",
]

SIMULACRON_VERSION = "0.12.0"
SIMULACRON_ARTIFACT = f"com.datastax.oss.simulacron:simulacron-standalone:{SIMULACRON_VERSION}"
DEFAULT_CACHE_DIR = (
    Path(os.environ["ADAPTIVE_LB_CACHE"]) / "simulacron"
    if os.environ.get("ADAPTIVE_LB_CACHE")
    else Path.home() / ".cache" / "adaptive-lb" / "simulacron"
)
"""Where the jar and the launcher are kept (``$ADAPTIVE_LB_CACHE/simulacron`` if set)."""
CQL_PORT = 9042

#: Where a prime or a fault applies: ``None`` = the whole cluster, ``"dc1"`` = one data center,
#: ``("dc1", "node2")`` = one node. Data centers and nodes may be given by name or by numeric
#: id (ints are ids: node id 0 is named ``node1``).
Scope = str | int | tuple[str | int, str | int] | None

#: Error results accepted by :meth:`Simulacron.prime_error`, with the default ``then`` fields
#: each needs (any of them can be overridden through keyword arguments).
ERROR_RESULTS: dict[str, dict[str, Any]] = {
    "overloaded": {"message": "simulated overload"},
    "server_error": {"message": "simulated server error"},
    "is_bootstrapping": {"message": "simulated bootstrap"},
    "unavailable": {"consistency_level": "LOCAL_QUORUM", "required": 2, "alive": 1},
    "read_timeout": {
        "consistency_level": "LOCAL_QUORUM",
        "received": 1,
        "block_for": 2,
        "data_present": False,
    },
    "write_timeout": {
        "consistency_level": "LOCAL_QUORUM",
        "received": 1,
        "block_for": 2,
        "write_type": "SIMPLE",
    },
    # Never answers: the request hangs until the client-side timeout; the host stays UP.
    "no_result": {},
    # Closes the connection the request came on (the driver marks the host DOWN).
    "close_connection": {"close_type": "disconnect", "scope": "connection"},
}

_KEYSPACES_QUERY = "SELECT * FROM system_schema.keyspaces"
_KEYSPACES_COLUMNS = {
    "keyspace_name": "ascii",
    "durable_writes": "boolean",
    "replication": "map<ascii,ascii>",
}
_NTS = "org.apache.cassandra.locator.NetworkTopologyStrategy"
_SIMPLE = "org.apache.cassandra.locator.SimpleStrategy"

_LAUNCHER_CLASS = "SimulacronFineTimer"
# Same wiring as com.datastax.oss.simulacron.standalone.App.main (read with javap from the
# 0.12.0 jar), plus Server.builder().withTimer(<1 ms HashedWheelTimer>).
_LAUNCHER_SOURCE = r"""
import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import com.datastax.oss.simulacron.http.server.ActivityLogManager;
import com.datastax.oss.simulacron.http.server.ClusterManager;
import com.datastax.oss.simulacron.http.server.EndpointManager;
import com.datastax.oss.simulacron.http.server.HttpContainer;
import com.datastax.oss.simulacron.http.server.QueryManager;
import com.datastax.oss.simulacron.server.Inet4Resolver;
import com.datastax.oss.simulacron.server.Server;
import io.netty.util.HashedWheelTimer;
import java.net.InetAddress;
import java.util.concurrent.TimeUnit;
import org.slf4j.LoggerFactory;

/** Simulacron's standalone App with a fine HashedWheelTimer (the stock one ticks every 100 ms). */
public final class SimulacronFineTimer {
  public static void main(String[] args) throws Exception {
    System.setProperty("vertx.disableDnsResolver", "true");
    String httpIntf = "localhost";
    int httpPort = 8187;
    String ip = "127.0.0.1";
    String level = "ERROR";
    boolean activityLog = true;
    long tickMicros = 1000;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--httpintf": httpIntf = args[++i]; break;
        case "--httpport": httpPort = Integer.parseInt(args[++i]); break;
        case "--ip": ip = args[++i]; break;
        case "--loglevel": level = args[++i]; break;
        case "--tick-micros": tickMicros = Long.parseLong(args[++i]); break;
        case "--disable-activity-log": activityLog = false; break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    Level lvl = Level.toLevel(level, Level.ERROR);
    ((Logger) LoggerFactory.getLogger("ROOT")).setLevel(lvl);
    ((Logger) LoggerFactory.getLogger("com.datastax")).setLevel(lvl);
    HttpContainer http = new HttpContainer(httpIntf, httpPort, false);
    byte[] start = InetAddress.getByName(ip).getAddress();
    HashedWheelTimer timer = new HashedWheelTimer(tickMicros, TimeUnit.MICROSECONDS, 512);
    Server server =
        Server.builder()
            .withActivityLoggingEnabled(activityLog)
            .withAddressResolver(new Inet4Resolver(start))
            .withTimer(timer)
            .build();
    new ClusterManager(server).registerWithRouter(http.getRouter());
    new QueryManager(server).registerWithRouter(http.getRouter());
    new EndpointManager(server).registerWithRouter(http.getRouter());
    new ActivityLogManager(server).registerWithRouter(http.getRouter());
    http.start().get(10, TimeUnit.SECONDS);
    System.err.println("SIMULACRON-FINE-TIMER READY tick_us=" + tickMicros);
    synchronized (SimulacronFineTimer.class) {
      SimulacronFineTimer.class.wait();
    }
  }
}
"""


class SimulacronError(RuntimeError):
    """Simulacron could not be fetched, started, or refused a REST request."""


# --------------------------------------------------------------------------------------------
# Fetching and building
# --------------------------------------------------------------------------------------------


def ensure_simulacron_jar(cache_dir: Path | None = None, *, timeout: float = 600.0) -> Path:
    """Return the path of ``simulacron-standalone-0.12.0.jar``, fetching it with Maven if needed.

    The jar is cached in ``cache_dir`` (default ``<repo>/.cache/simulacron/``, git-ignored) and
    reused on later calls. ``$SIMULACRON_JAR`` (a path to an existing jar) overrides all this.
    Maven copies into a temporary directory first, so concurrent callers never see half a jar.

    Raises:
        SimulacronError: ``mvn`` is not installed, fails, or does not produce the jar.
    """
    override = os.environ.get("SIMULACRON_JAR")
    if override:
        path = Path(override)
        if not path.is_file():
            raise SimulacronError(f"$SIMULACRON_JAR={override} is not a file")
        return path
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    jar = cache / f"simulacron-standalone-{SIMULACRON_VERSION}.jar"
    if jar.is_file() and jar.stat().st_size > 0:
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SimulacronError(
            f"{jar} is missing and `mvn` is not on PATH: install Maven, or download "
            f"{SIMULACRON_ARTIFACT} yourself and set $SIMULACRON_JAR"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".mvn-") as tmp:
        cmd = [
            mvn,
            "-q",
            "-B",
            "dependency:copy",
            f"-Dartifact={SIMULACRON_ARTIFACT}:jar",
            f"-DoutputDirectory={tmp}",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise SimulacronError(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from exc
        fetched = Path(tmp) / jar.name
        if proc.returncode != 0 or not fetched.is_file():
            tail = _tail(proc.stdout + proc.stderr)
            raise SimulacronError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}); is Maven Central "
                f"reachable?\n{tail}"
            )
        os.replace(fetched, jar)
    return jar


def build_fine_timer_launcher(jar: Path, cache_dir: Path | None = None) -> Path | None:
    """Compile the 1 ms-timer launcher class against ``jar``; return its class directory.

    The class is rebuilt only when its source changed. Returns ``None`` (after a warning) when
    ``javac`` is missing or compilation fails, so callers can fall back to the stock jar.
    """
    javac = shutil.which("javac")
    if javac is None:
        warnings.warn("javac not found: Simulacron runs with its stock 100 ms timer", stacklevel=2)
        return None
    out = (Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR) / "launcher"
    src = out / f"{_LAUNCHER_CLASS}.java"
    cls = out / f"{_LAUNCHER_CLASS}.class"
    if cls.is_file() and src.is_file() and src.read_text() == _LAUNCHER_SOURCE:
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".javac-") as tmp:
        tmp_src = Path(tmp) / src.name
        tmp_src.write_text(_LAUNCHER_SOURCE)
        proc = subprocess.run(
            [javac, "-nowarn", "-cp", str(jar), "-d", tmp, str(tmp_src)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            warnings.warn(
                f"could not compile the Simulacron fine-timer launcher (stock 100 ms timer "
                f"used instead):\n{_tail(proc.stdout + proc.stderr)}",
                stacklevel=2,
            )
            return None
        os.replace(Path(tmp) / cls.name, cls)
        os.replace(tmp_src, src)
    return out


# --------------------------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------------------------


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _can_bind(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like the JVM's server sockets: ignore TIME_WAIT leftovers of a previous run.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
        return True


def pick_node_ip(count: int = 16, prefixes: Iterable[str] | None = None) -> str:
    """Return the first address of a loopback /24 where ``count`` nodes can bind port 9042.

    Tries ``127.0.2.x``, then ``127.0.3.x`` ... ``127.0.9.x`` (``$SIMULACRON_NODE_IP`` forces a
    first address), so the simulated nodes never collide with a real Cassandra on
    ``127.0.0.1:9042`` or with another Simulacron started by someone else on this machine.
    """
    forced = os.environ.get("SIMULACRON_NODE_IP")
    if forced:
        return forced
    for prefix in prefixes or (f"127.0.{n}" for n in range(2, 10)):
        if all(_can_bind(f"{prefix}.{i}", CQL_PORT) for i in range(1, count + 1)):
            return f"{prefix}.1"
    raise SimulacronError(f"no loopback /24 has {count} free addresses for port {CQL_PORT}")


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class Simulacron:
    """One Simulacron process and a thin REST client for it.

    Start it with :meth:`start` (or use it as a context manager); :meth:`stop` kills it by PID and
    an ``atexit`` hook does the same if the interpreter exits first. Methods that take a
    ``cluster`` argument default to the cluster most recently created through this object.

    Args:
        jar: the standalone jar (see :func:`ensure_simulacron_jar`).
        node_ip: address of the first simulated node; later nodes take the next addresses.
            Default: :func:`pick_node_ip`.
        http_host: where the REST API listens.
        http_port: REST port; default: a free port.
        fine_timer: start with a 1 ms timer (delays are honoured to ~1-3 ms instead of being
            rounded up to 100 ms). Falls back to the stock jar if the launcher cannot be built or
            started; :attr:`fine_timer` tells which one is running.
        log_level: Simulacron's log level (its output goes to ``log_path``).
        activity_logging: record every received request (``/log`` endpoints); disable it for
            load tests.
        startup_timeout: seconds to wait for the REST API to answer.
        jvm_args: extra JVM options (default caps the heap at 512 MB).
        cache_dir: where the launcher class and the process log are written.
        keep_log: keep the process log (``log_path``) after :meth:`stop` (default: delete it).
    """

    def __init__(
        self,
        jar: Path,
        *,
        node_ip: str | None = None,
        http_host: str = "127.0.0.1",
        http_port: int | None = None,
        fine_timer: bool = False,
        log_level: str = "ERROR",
        activity_logging: bool = True,
        startup_timeout: float = 30.0,
        jvm_args: Sequence[str] = ("-Xmx512m",),
        cache_dir: Path | None = None,
        keep_log: bool = False,
    ) -> None:
        self.jar = Path(jar)
        self.node_ip = node_ip
        self.http_host = http_host
        self.http_port = http_port
        self.want_fine_timer = fine_timer
        #: True once started when the 1 ms-timer launcher is the process actually running.
        self.fine_timer = False
        self.log_level = log_level
        self.activity_logging = activity_logging
        self.startup_timeout = startup_timeout
        self.jvm_args = tuple(jvm_args)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
        #: Seconds from process start until the REST API answered (set by :meth:`start`).
        self.startup_seconds: float | None = None
        #: The last response of ``POST /cluster`` per cluster name.
        self.clusters: dict[str, dict[str, Any]] = {}
        self.default_cluster: str | None = None
        self.log_path: Path | None = None
        self.keep_log = keep_log
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        # Keyspace rows per cluster (see prime_keyspace).
        self._keyspaces: dict[str, dict[str, dict[str, Any]]] = {}
        # Every prime posted, per cluster, in order: (scope key, body). Simulacron cannot clear
        # one node's primes (0.12.0 routes DELETE /prime/{c}/{dc}/{node} to the prime handler:
        # HTTP 400), so clear_primes(node) clears the DC and replays the DC's other primes.
        self._primes: dict[str, list[tuple[tuple[str, ...], dict[str, Any]]]] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the REST API."""
        return f"http://{self.http_host}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        """PID of the Java process, or ``None`` when not running."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Simulacron:
        """Start the process and wait (bounded) until the REST API answers; return ``self``.

        Raises:
            SimulacronError: the process exited or did not answer within ``startup_timeout``
                (the message ends with the tail of its log).
        """
        if self._proc is not None:
            return self
        if shutil.which("java") is None:
            raise SimulacronError("`java` is not on PATH")
        if self.node_ip is None:
            self.node_ip = pick_node_ip()
        launcher = None
        if self.want_fine_timer:
            launcher = build_fine_timer_launcher(self.jar, self.cache_dir)
        if launcher is not None:
            try:
                self._spawn(launcher)
                return self
            except SimulacronError as exc:
                warnings.warn(
                    f"fine-timer launcher failed, using the stock jar: {exc}", stacklevel=2
                )
        self._spawn(None)
        return self

    def _spawn(self, launcher: Path | None) -> None:
        if self.http_port is None:
            self.http_port = free_tcp_port(self.http_host)
        java = shutil.which("java") or "java"
        if launcher is not None:
            cp = os.pathsep.join([str(self.jar), str(launcher)])
            cmd = [java, *self.jvm_args, "-cp", cp, _LAUNCHER_CLASS]
            cmd += ["--httpintf", self.http_host, "--httpport", str(self.http_port)]
            cmd += ["--ip", str(self.node_ip), "--loglevel", self.log_level]
            if not self.activity_logging:
                cmd.append("--disable-activity-log")
        else:
            cmd = [java, *self.jvm_args, "-jar", str(self.jar)]
            cmd += ["--httpintf", self.http_host, "--httpport", str(self.http_port)]
            cmd += ["--ip", str(self.node_ip), "--loglevel", self.log_level]
            if not self.activity_logging:
                cmd.append("--disable-activity-log")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.cache_dir / f"simulacron-{os.getpid()}-{self.http_port}.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal does not reach it; stop() does
        )
        atexit.register(self.stop)
        deadline = t0 + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                tail = self._log_tail()
                self.stop()
                raise SimulacronError(f"Simulacron exited with code {code} at startup:\n{tail}")
            try:
                self._request("GET", "/cluster", timeout=1.0)
                break
            except (OSError, SimulacronError):
                pass
            if time.monotonic() > deadline:
                tail = self._log_tail()
                self.stop()
                raise SimulacronError(
                    f"Simulacron REST API at {self.base_url} did not answer within "
                    f"{self.startup_timeout:.0f} s:\n{tail}"
                )
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - t0
        self.fine_timer = launcher is not None

    def stop(self) -> None:
        """Kill the process by PID (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=5)
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            if not self.keep_log and self.log_path is not None:
                self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Simulacron:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self, chars: int = 3000) -> str:
        if self._log_file is not None:
            self._log_file.flush()
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return _tail(self.log_path.read_text(errors="replace"), chars)

    # -- REST plumbing ------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Any:
        """Send one REST request; return the decoded JSON answer (or ``None`` if empty)."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise SimulacronError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _cluster(self, cluster: str | None) -> str:
        name = cluster or self.default_cluster
        if name is None:
            raise SimulacronError("no cluster: call create_cluster() first or pass cluster=")
        return name

    def _scope_key(self, scope: Scope, cluster: str | None) -> tuple[str, ...]:
        """``()``, ``(dc,)`` or ``(dc, node)`` with ids translated to names when known."""
        if scope is None:
            return ()
        dc, node = scope if isinstance(scope, tuple) else (scope, None)
        info = self.clusters.get(self._cluster(cluster), {})
        dc_name, node_name = str(dc), None if node is None else str(node)
        for d in info.get("data_centers", []):
            if dc in (d["id"], d["name"]):
                dc_name = d["name"]
                for n in d["nodes"]:
                    if node in (n["id"], n["name"]):
                        node_name = n["name"]
        return (dc_name,) if node_name is None else (dc_name, node_name)

    def _scope_path(self, scope: Scope, cluster: str | None) -> str:
        """``/{cluster}[/{dc}[/{node}]]`` with names quoted for the URL."""
        parts = [self._cluster(cluster), *self._scope_key(scope, cluster)]
        return "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)

    # -- clusters -----------------------------------------------------------------------------

    def create_cluster(
        self,
        name: str,
        datacenters: Sequence[Sequence[str]],
        *,
        dc_names: Sequence[str] | None = None,
        cassandra_version: str | None = None,
        peer_info: Mapping[str, Any] | None = None,
    ) -> dict[str, list[str]]:
        """Create a cluster and bind its nodes; return node addresses (IP strings) per DC name.

        Args:
            name: the cluster name (also the default ``cluster`` of later calls).
            datacenters: one list per DC with one rack name per node, e.g.
                ``[["r1", "r2", "r3"]] * 3`` for 3 DCs of 3 nodes on racks r1..r3.
            dc_names: DC names (default ``dc1``, ``dc2``, ...). Nodes are named ``node1``... in
                each DC, so a node scope is ``("dc1", "node2")``.
            cassandra_version: version the nodes claim (default: Simulacron's, 3.0.x; a 4.x
                version makes protocol negotiation hang - keep the default).
            peer_info: extra ``peer_info`` entries for every node.

        All nodes listen on port 9042 of consecutive addresses starting at ``node_ip``.
        """
        names = list(dc_names) if dc_names is not None else []
        names += [f"dc{i + 1}" for i in range(len(names), len(datacenters))]
        spec: dict[str, Any] = {"id": 0, "name": name, "data_centers": []}
        if cassandra_version:
            spec["cassandra_version"] = cassandra_version
        for d, racks in enumerate(datacenters):
            nodes = []
            for n, rack in enumerate(racks):
                info = {**(peer_info or {}), "rack": rack}
                nodes.append({"id": n, "name": f"node{n + 1}", "peer_info": info})
            spec["data_centers"].append({"id": d, "name": names[d], "nodes": nodes})
        info = self._request("POST", "/cluster", spec)
        self.clusters[name] = info
        self.default_cluster = name
        return self.nodes(name)

    def nodes(self, cluster: str | None = None) -> dict[str, list[str]]:
        """Node IP addresses per DC name, in node order, from the cluster's creation answer."""
        info = self.clusters[self._cluster(cluster)]
        return {
            dc["name"]: [n["address"].rsplit(":", 1)[0] for n in dc["nodes"]]
            for dc in info["data_centers"]
        }

    def scope_of(self, address: str, cluster: str | None = None) -> tuple[str, str]:
        """The ``(dc, node)`` scope of a node given its IP (``"127.0.2.4"`` or with a port)."""
        ip = str(address).rsplit(":", 1)[0] if ":" in str(address) else str(address)
        info = self.clusters[self._cluster(cluster)]
        for dc in info["data_centers"]:
            for node in dc["nodes"]:
                if node["address"].rsplit(":", 1)[0] == ip:
                    return dc["name"], node["name"]
        raise KeyError(f"{address} is not a node of cluster {self._cluster(cluster)}")

    def describe(self, cluster: str | None = None) -> dict[str, Any]:
        """``GET /cluster/{name}``: live cluster state (including ``active_connections``)."""
        return self._request("GET", "/cluster" + self._scope_path(None, cluster))

    def remove_cluster(self, cluster: str | None = None) -> None:
        """Unbind and delete a cluster (its addresses become free again)."""
        name = self._cluster(cluster)
        self._request("DELETE", f"/cluster/{urllib.parse.quote(name, safe='')}")
        self.clusters.pop(name, None)
        self._keyspaces.pop(name, None)
        self._primes.pop(name, None)
        if self.default_cluster == name:
            self.default_cluster = next(iter(self.clusters), None)

    # -- priming ------------------------------------------------------------------------------

    def prime(
        self,
        query: str,
        rows: Sequence[Mapping[str, Any]] | None = None,
        column_types: Mapping[str, str] | None = None,
        *,
        delay_ms: int = 0,
        result: str = "success",
        scope: Scope = None,
        param_types: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        consistency: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        cluster: str | None = None,
    ) -> None:
        """Prime ``query`` in ``scope``: matching requests get ``rows`` (or ``result``).

        Args:
            query: the CQL text exactly as the client sends it (prepared statements included:
                with ``param_types`` the driver learns bind markers and partition key).
            rows: result rows as dicts; ``column_types`` maps each column to a CQL type.
            delay_ms: answer after this delay (rounded up to 100 ms with the stock timer).
            result: ``"success"`` or an error result name (see :meth:`prime_error`).
            scope: ``None`` (cluster), ``"dc1"`` or ``("dc1", "node2")``; a node prime wins over
                a cluster prime. Priming the same query again in the same scope keeps the FIRST
                prime: :meth:`clear_primes` that scope first.
            param_types: bind-marker name -> CQL type (``{"k": "int"}``).
            params: only match these bound values (default: any values).
            consistency: only match these consistency levels (e.g. ``["LOCAL_ONE"]``).
            extra: additional ``then`` fields (``ignore_on_prepare``, error fields, ...).
        """
        when: dict[str, Any] = {"query": query}
        if param_types:
            when["param_types"] = dict(param_types)
        if params:
            when["params"] = dict(params)
        if consistency:
            when["consistency_level"] = list(consistency)
        then: dict[str, Any] = {"result": result}
        if result == "success":
            then["rows"] = [dict(r) for r in rows or []]
            then["column_types"] = dict(column_types or {})
        else:
            # Answer PREPARE normally, so statements can still be prepared on a failing node.
            then["ignore_on_prepare"] = True
        if delay_ms:
            then["delay_in_ms"] = int(delay_ms)
        if extra:
            then.update(extra)
        cname = self._cluster(cluster)
        self._post_prime(cname, self._scope_key(scope, cname), {"when": when, "then": then})

    def _post_prime(self, cluster: str, key: tuple[str, ...], body: dict[str, Any]) -> None:
        path = "/" + "/".join(urllib.parse.quote(p, safe="") for p in (cluster, *key))
        self._request("POST", "/prime" + path, body)
        self._primes.setdefault(cluster, []).append((key, body))

    def primes(self, cluster: str | None = None) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
        """The primes posted through this object and not cleared: ``(scope key, body)``, in order.

        The scope key is ``()`` (cluster), ``(dc,)`` or ``(dc, node)``. Simulacron has no
        endpoint to list primes; this is the client-side record.
        """
        return list(self._primes.get(self._cluster(cluster), []))

    def prime_error(
        self,
        query: str,
        error: str,
        *,
        scope: Scope = None,
        delay_ms: int = 0,
        param_types: Mapping[str, str] | None = None,
        cluster: str | None = None,
        **fields: Any,
    ) -> None:
        """Prime ``query`` to fail with ``error`` (a key of :data:`ERROR_RESULTS`).

        ``overloaded``, ``server_error``, ``unavailable`` and ``close_connection`` make the
        driver's default retry policy try the next host of the plan; ``read_timeout`` /
        ``write_timeout`` usually reach the caller; ``no_result`` never answers (the request
        hangs until the client timeout while the host stays UP). ``fields`` override the
        defaults, e.g. ``message="busy"`` or ``consistency_level="LOCAL_ONE"``.
        """
        if error not in ERROR_RESULTS:
            raise ValueError(f"unknown error {error!r}; expected one of {sorted(ERROR_RESULTS)}")
        self.prime(
            query,
            result=error,
            scope=scope,
            delay_ms=delay_ms,
            param_types=param_types,
            extra={**ERROR_RESULTS[error], **fields},
            cluster=cluster,
        )

    def clear_primes(
        self, scope: Scope = None, *, keep_schema: bool = True, cluster: str | None = None
    ) -> None:
        """Remove the primes of ``scope`` (``None``: every prime of the cluster).

        * A DC: its primes and its nodes' primes go; cluster primes stay.
        * A node: Simulacron 0.12.0 cannot clear one node (its REST route is miswired), so the
          whole DC is cleared and the DC's other primes (recorded by :meth:`prime`) are posted
          again in their original order.
        * The cluster: everything goes, including the ``system_schema.keyspaces`` prime that
          keeps the driver's keyspace metadata; with ``keep_schema`` (default) the keyspaces of
          :meth:`prime_keyspace` are primed again right away.
        """
        cname = self._cluster(cluster)
        key = self._scope_key(scope, cname)
        recorded = self._primes.get(cname, [])
        if not key:
            self._request("DELETE", "/prime" + self._scope_path(None, cname))
            self._primes[cname] = []
            if keep_schema and self._keyspaces.get(cname):
                self._prime_keyspaces(cname)
            return
        dc = key[0]
        self._request("DELETE", "/prime" + self._scope_path(dc, cname))
        in_dc = [(k, b) for k, b in recorded if k[:1] == (dc,)]
        self._primes[cname] = [(k, b) for k, b in recorded if k[:1] != (dc,)]
        if len(key) == 2:
            for k, body in in_dc:
                if k != key:
                    self._post_prime(cname, k, body)

    def prime_keyspace(
        self,
        name: str,
        replication: Mapping[str, int | str],
        *,
        durable_writes: bool = True,
        strategy: str = "NetworkTopologyStrategy",
        cluster: str | None = None,
    ) -> None:
        """Make ``name`` appear in the driver's schema metadata (so ``get_replicas`` works).

        Primes ``SELECT * FROM system_schema.keyspaces`` with one row per keyspace registered so
        far (a query primed twice keeps its first answer, so adding a second keyspace clears
        all primes of the cluster and posts them again, with the new rows). Prime before the
        driver connects, or call
        ``cluster.refresh_schema_metadata()`` afterwards. Tables are not described: the driver
        knows partition keys only from prepared statements (``param_types``).

        Args:
            replication: ``{"dc1": 2, "dc2": 2}`` for NetworkTopologyStrategy, or
                ``{"replication_factor": 3}`` with ``strategy="SimpleStrategy"``.
            strategy: ``NetworkTopologyStrategy``, ``SimpleStrategy`` or a full class name.
        """
        cname = self._cluster(cluster)
        cls = {"NetworkTopologyStrategy": _NTS, "SimpleStrategy": _SIMPLE}.get(strategy, strategy)
        rep = {"class": cls, **{k: str(v) for k, v in replication.items()}}
        known = self._keyspaces.setdefault(cname, {})
        had_prime = bool(known)
        known[name] = {"keyspace_name": name, "durable_writes": durable_writes, "replication": rep}
        if had_prime:
            # Replace the keyspaces prime: clear everything, replay the rest, prime the new rows.
            others = [(k, b) for k, b in self._primes.get(cname, []) if not _is_keyspaces(b)]
            self._request("DELETE", "/prime" + self._scope_path(None, cname))
            self._primes[cname] = []
            for k, body in others:
                self._post_prime(cname, k, body)
        self._prime_keyspaces(cname)

    def _prime_keyspaces(self, cluster: str) -> None:
        rows = list(self._keyspaces.get(cluster, {}).values())
        self.prime(_KEYSPACES_QUERY, rows=rows, column_types=_KEYSPACES_COLUMNS, cluster=cluster)

    # -- faults -------------------------------------------------------------------------------

    def pause_reads(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Stop reading from the node's connections (a GC-pause-like stall; host stays UP)."""
        self._request("PUT", "/pause-reads" + self._scope_path((dc, node), cluster))

    def resume_reads(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Undo :meth:`pause_reads`: queued requests are then answered."""
        self._request("DELETE", "/pause-reads" + self._scope_path((dc, node), cluster))

    def unbind(
        self, dc: str | int, node: str | int, *, stop: bool = False, cluster: str | None = None
    ) -> None:
        """Refuse new connections to the node (``stop=True``: close the listener instead).

        Existing connections stay open: follow with :meth:`drop_connections` to make the driver
        mark the host DOWN (~1 s), or use :meth:`take_down` for both.
        """
        path = "/listener" + self._scope_path((dc, node), cluster)
        self._request("DELETE", path, query={"type": "stop" if stop else "unbind"})

    def drop_connections(
        self, dc: str | int, node: str | int, *, cluster: str | None = None
    ) -> None:
        """Close every client connection of the node."""
        self._request("DELETE", "/connections" + self._scope_path((dc, node), cluster))

    def take_down(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """:meth:`unbind` + :meth:`drop_connections`: the node looks dead to the driver."""
        self.unbind(dc, node, cluster=cluster)
        self.drop_connections(dc, node, cluster=cluster)

    def rebind(self, dc: str | int, node: str | int, *, cluster: str | None = None) -> None:
        """Accept connections again (the driver reconnects per its reconnection policy)."""
        self._request("PUT", "/listener" + self._scope_path((dc, node), cluster))

    # -- activity log -------------------------------------------------------------------------

    def activity_log(
        self, scope: Scope = None, *, cluster: str | None = None
    ) -> list[dict[str, Any]]:
        """Requests received in ``scope`` (needs ``activity_logging=True``), oldest first.

        Each entry is Simulacron's record (``query``, ``type`` such as ``QUERY`` / ``EXECUTE`` /
        ``PREPARE`` / ``OPTIONS``, ``consistency_level``, ``connection`` (the client's address),
        ``received_timestamp`` in ms, ``primed``, ``frame``) plus ``dc`` and ``node`` names.
        """
        cname = self._cluster(cluster)
        data = self._request("GET", "/log" + self._scope_path(scope, cname))
        names = {
            dc["id"]: (dc["name"], {n["id"]: n["name"] for n in dc["nodes"]})
            for dc in self.clusters[cname]["data_centers"]
        }
        out: list[dict[str, Any]] = []
        for dc in (data or {}).get("data_centers", []):
            dc_name, node_names = names.get(dc.get("id"), (str(dc.get("id")), {}))
            for node in dc.get("nodes", []):
                node_name = node_names.get(node.get("id"), str(node.get("id")))
                for entry in node.get("queries", []):
                    out.append({**entry, "dc": dc_name, "node": node_name})
        out.sort(key=lambda e: e.get("received_timestamp", 0))
        return out

    def clear_activity_log(self, scope: Scope = None, *, cluster: str | None = None) -> None:
        """Forget the recorded requests of ``scope``."""
        self._request("DELETE", "/log" + self._scope_path(scope, cluster))


def _is_keyspaces(body: Mapping[str, Any]) -> bool:
    return bool(body.get("when", {}).get("query") == _KEYSPACES_QUERY)


def _tail(text: str, chars: int = 3000) -> str:
    text = text.strip()
    return text if len(text) <= chars else "..." + text[-chars:]


# --------------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------------


def connect_driver(
    contact_points: Sequence[str],
    policy: LoadBalancingPolicy,
    *,
    port: int = CQL_PORT,
    request_timeout: float = 5.0,
    connect_timeout: float = 2.0,
    reconnect_delay: float = 0.5,
    keyspace: str | None = None,
    **cluster_kwargs: Any,
) -> tuple[Cluster, Session]:
    """Connect a real driver ``Cluster`` to Simulacron with ``policy``; return it and a session.

    ``protocol_version=4`` (v5 fails against Simulacron), short connect timeouts, a
    ``ConstantReconnectionPolicy(reconnect_delay)`` and a default ``ExecutionProfile`` holding
    ``policy``; ``compression=False`` unless given (scylla-driver negotiates lz4, which
    Simulacron accepts at STARTUP but cannot decode: every later request is lost).
    ``cluster_kwargs`` go to ``Cluster(...)`` unchanged. On Python 3.12+ (no
    asyncore) the libev reactor is used when no ``connection_class`` is given. The caller must
    ``cluster.shutdown()``; if connecting fails, the cluster is shut down here.
    """
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import ConstantReconnectionPolicy

    if sys.version_info >= (3, 12) and "connection_class" not in cluster_kwargs:
        from cassandra.io.libevreactor import LibevConnection

        cluster_kwargs["connection_class"] = LibevConnection
    cluster_kwargs.setdefault("compression", False)
    profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=request_timeout)
    cluster = Cluster(
        contact_points=list(contact_points),
        port=port,
        protocol_version=4,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        reconnection_policy=ConstantReconnectionPolicy(reconnect_delay),
        connect_timeout=connect_timeout,
        control_connection_timeout=connect_timeout,
        **cluster_kwargs,
    )
    try:
        session = cluster.connect(keyspace)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, session


def wait_for_pools(session: Any, datacenter: str, timeout: float = 20.0) -> bool:
    """Wait until every host of ``datacenter`` is up with an open connection in ``session``'s
    pools; True if they all are within ``timeout`` seconds.

    Until then the driver skips a host (scylla-driver opens its per-shard pools in the
    background after connect, and a pool that failed to connect under load is retried after
    the reconnection delay), so the first host of a plan may not be the one that serves.
    """
    hosts = [h for h in session.cluster.metadata.all_hosts() if h.datacenter == datacenter]
    deadline = time.monotonic() + timeout
    while True:
        state = session.get_pool_state()
        if all(h.is_up and h in state and state[h]["open_count"] > 0 for h in hosts):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
