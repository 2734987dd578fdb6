"""Run Simulacron (a simulated CQL cluster) as a Java process.

Simulacron (``com.datastax.oss.simulacron:simulacron-standalone``) is a Java process that
speaks the CQL native protocol on many loopback addresses (one per simulated node) and answers
whatever was *primed* through its REST API: rows, errors, delays, hangs. The real Python driver
connects to it as to a real cluster, so a load-balancing policy can be tested end to end.

This module fetches the jar (:func:`ensure_simulacron_jar`), builds the 1 ms-timer launcher
(:func:`build_fine_timer_launcher`) and runs the process (:class:`Simulacron`, which is also
the REST client of :mod:`~adaptive_lb.tools.peers.simulacron_primes`). Typical use (see
``tests/integration/conftest.py`` for the pytest fixtures)::

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
  ``HashedWheelTimer`` (``SimulacronFineTimer.java`` in this package, compiled on first use
  with ``javac``); it falls back to the stock jar when ``javac`` is missing or the launcher
  fails.
* The driver must use ``protocol_version=4`` (v5 fails against Simulacron).

The names that used to live here (REST client, driver helpers) are re-exported, so
``from adaptive_lb.tools.peers.simulacron import connect_driver`` and the like keep working.
Imports the standard library and the other ``peers`` modules; the driver lazily, by
:func:`connect_driver`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from adaptive_lb.tools.peers.connect import CQL_PORT, connect_driver, wait_for_pools
from adaptive_lb.tools.peers.jvm import JvmProcess, java_command, maven_jar, tail
from adaptive_lb.tools.peers.net import can_bind, free_tcp_port
from adaptive_lb.tools.peers.simulacron_primes import ERROR_RESULTS, SimulacronClient
from adaptive_lb.tools.peers.simulacron_rest import Scope, SimulacronError

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

_LAUNCHER_CLASS = "SimulacronFineTimer"


def ensure_simulacron_jar(cache_dir: Path | None = None, *, timeout: float = 600.0) -> Path:
    """Return the path of ``simulacron-standalone-0.12.0.jar``, fetching it with Maven if needed.

    The jar is cached in ``cache_dir`` (default :data:`DEFAULT_CACHE_DIR`) and reused on later
    calls. ``$SIMULACRON_JAR`` (a path to an existing jar) overrides all this.
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
    return maven_jar(SIMULACRON_ARTIFACT, cache, timeout=timeout, error=SimulacronError)


def build_fine_timer_launcher(jar: Path, cache_dir: Path | None = None) -> Path | None:
    """Compile the 1 ms-timer launcher class against ``jar``; return its class directory.

    The class is rebuilt only when its source changed. Returns ``None`` (after a warning) when
    ``javac`` is missing or compilation fails, so callers can fall back to the stock jar.
    """
    javac = shutil.which("javac")
    if javac is None:
        warnings.warn("javac not found: Simulacron runs with its stock 100 ms timer", stacklevel=2)
        return None
    source = (
        resources.files("adaptive_lb.tools.peers").joinpath(f"{_LAUNCHER_CLASS}.java").read_text()
    )
    out = (Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR) / "launcher"
    src = out / f"{_LAUNCHER_CLASS}.java"
    cls = out / f"{_LAUNCHER_CLASS}.class"
    if cls.is_file() and src.is_file() and src.read_text() == source:
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".javac-") as tmp:
        tmp_src = Path(tmp) / src.name
        tmp_src.write_text(source)
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
                f"used instead):\n{tail(proc.stdout + proc.stderr)}",
                stacklevel=2,
            )
            return None
        os.replace(Path(tmp) / cls.name, cls)
        os.replace(tmp_src, src)
    return out


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
        if all(can_bind(f"{prefix}.{i}", CQL_PORT) for i in range(1, count + 1)):
            return f"{prefix}.1"
    raise SimulacronError(f"no loopback /24 has {count} free addresses for port {CQL_PORT}")


class Simulacron(SimulacronClient):
    """One Simulacron process, and the REST client for it (:class:`SimulacronClient`).

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
        die_with_parent: have the kernel kill the JVM when this process dies, even by SIGKILL
            (a benchmark on a shared machine must not leave it behind).
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
        die_with_parent: bool = False,
    ) -> None:
        super().__init__(http_host, http_port)
        self.jar = Path(jar)
        self.node_ip = node_ip
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
        self.log_path: Path | None = None
        self.keep_log = keep_log
        self.die_with_parent = die_with_parent
        self._process: JvmProcess | None = None

    @property
    def pid(self) -> int | None:
        """PID of the Java process, or ``None`` when not running."""
        return self._process.pid if self._process is not None else None

    def start(self) -> Simulacron:
        """Start the process and wait (bounded) until the REST API answers; return ``self``.

        Raises:
            SimulacronError: the process exited or did not answer within ``startup_timeout``
                (the message ends with the tail of its log).
        """
        if self._process is not None:
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
        args = ["--httpintf", self.http_host, "--httpport", str(self.http_port)]
        args += ["--ip", str(self.node_ip), "--loglevel", self.log_level]
        if not self.activity_logging:
            args.append("--disable-activity-log")
        if launcher is not None:
            cmd = java_command(
                main=_LAUNCHER_CLASS,
                classpath=[self.jar, launcher],
                jvm_args=self.jvm_args,
                args=args,
                die_with_parent=self.die_with_parent,
            )
        else:
            cmd = java_command(
                jar=self.jar,
                jvm_args=self.jvm_args,
                args=args,
                die_with_parent=self.die_with_parent,
            )
        self.log_path = self.cache_dir / f"simulacron-{os.getpid()}-{self.http_port}.log"
        self._process = JvmProcess(
            cmd,
            self.log_path,
            cwd=self.cache_dir,  # Vert.x writes .vertx/ into its working directory
            name="Simulacron",
            stop_grace=5.0,
            kill_wait=5.0,
            keep_log=self.keep_log,
            error=SimulacronError,
        )
        t0 = time.monotonic()
        self._process.start()
        try:
            self._process.wait_ready(
                t0 + self.startup_timeout,
                probe=self.answers,
                what=f"REST API at {self.base_url}",
                interval=0.1,
            )
        except SimulacronError:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        self.fine_timer = launcher is not None

    def stop(self) -> None:
        """Kill the process by PID (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        process, self._process = self._process, None
        if process is not None:
            process.stop()

    def __enter__(self) -> Simulacron:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
