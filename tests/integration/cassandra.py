"""Run a small real Apache Cassandra 5.0 cluster on loopback addresses for integration tests.

``org.apache.cassandra:cassandra-all`` and its dependencies are fetched once with plain Maven
into ``~/.cache/adaptive-lb/cassandra/lib`` (``$ADAPTIVE_LB_CACHE/cassandra/lib`` if that is set);
each node is a ``CassandraDaemon`` JVM started straight from that classpath with its own
``cassandra.yaml``, ``cassandra-rackdc.properties`` and ``logback.xml`` under a throwaway
directory. Typical use::

    with CassandraCluster() as cluster:        # 3 nodes, dc1, racks r1/r2/r3
        cluster.addresses                      # ['127.0.3.1', '127.0.3.2', '127.0.3.3']
        cluster.pause(2)                       # SIGSTOP node 2's JVM (a long GC pause)
        cluster.resume(2)
        cluster.kill(1); cluster.restart(1)    # SIGKILL, then start again on the same data

Facts that shape this module (measured, see ``/work/shared/notes/real-cassandra.md``):

* Nodes listen on 127.0.3.N with the same ports everywhere (7000, 9042), never on 0.0.0.0:
  other services may hold 9042 on other loopback addresses.
* Start-up is CPU bound: the seed first, then the others one after another, each waiting
  for the previous node's CQL port. ``cassandra.skip_wait_for_gossip_to_settle=0`` and
  ``cassandra.ring_delay_ms=1000`` save 10-30 s per node.
* An open CQL port is not a ready cluster: readiness also waits until every node's
  ``system.peers_v2`` lists all the others.
* Tokens are fixed (``initial_token``, evenly spaced) so ownership is the same on every run.
* Nodes are stopped with SIGKILL (the data is thrown away); a graceful stop takes ~25 s.
  Each JVM is started through ``setpriv --pdeathsig KILL`` (when available), so it dies with
  the thread that started it even if the test process is SIGKILLed and ``atexit`` never runs.

Fetching the jars, running each JVM and killing it by PID is :mod:`adaptive_lb.tools.peers.jvm`;
this module holds what is Cassandra's own: configuration files, JVM options, the topology and
readiness through ``system.peers_v2``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_lb.tools.peers.connect import CQL_PORT, connect_driver
from adaptive_lb.tools.peers.jvm import (
    JvmProcess,
    java_command,
    maven_classpath,
    maven_classpath_ready,
)

__all__ = [
    "CASSANDRA_ARTIFACT",
    "CASSANDRA_VERSION",
    "DEFAULT_CACHE_DIR",
    "CassandraCluster",
    "CassandraError",
    "ensure_cassandra_lib",
    "evenly_spaced_tokens",
    "missing_tools",
]

CASSANDRA_VERSION = "5.0.6"
CASSANDRA_ARTIFACT = f"org.apache.cassandra:cassandra-all:{CASSANDRA_VERSION}"
DEFAULT_CACHE_DIR = (
    Path(os.environ["ADAPTIVE_LB_CACHE"]) / "cassandra"
    if os.environ.get("ADAPTIVE_LB_CACHE")
    else Path.home() / ".cache" / "adaptive-lb" / "cassandra"
)
"""Where ``lib/`` (the jars) is kept: beside Simulacron's, outside the repository."""

STORAGE_PORT = 7000
READY_LOG_LINE = "Starting listening for CQL clients"

# Cassandra's conf/jvm17-server.options (JPMS section), needed on Java 17.
JVM17_MODULE_FLAGS: tuple[str, ...] = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports=java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports=jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)

# Small and polite on a shared 2-core machine (C1 only, few GC threads).
JVM_TUNING_FLAGS: tuple[str, ...] = (
    "-Xss256k",
    "-XX:+UseG1GC",
    "-XX:G1HeapRegionSize=4m",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxTenuringThreshold=1",
    "-XX:MaxGCPauseMillis=300",
    "-XX:TieredStopAtLevel=1",
    "-XX:CICompilerCount=2",
    "-XX:ParallelGCThreads=2",
    "-XX:ConcGCThreads=1",
    "-XX:MaxDirectMemorySize=256m",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:+PerfDisableSharedMem",
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
)

_LOGBACK = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <append>true</append>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class CassandraError(RuntimeError):
    """Cassandra could not be fetched, started or made ready."""


def missing_tools() -> str | None:
    """Why a real Cassandra cannot run here (``java`` or ``mvn`` missing), or ``None``."""
    if shutil.which("java") is None:
        return "needs `java` (Java 11 or 17) on PATH to run Apache Cassandra 5.0"
    lib = DEFAULT_CACHE_DIR / "lib"
    if shutil.which("mvn") is None and not maven_classpath_ready(CASSANDRA_ARTIFACT, lib):
        return f"needs `mvn` on PATH to fetch {CASSANDRA_ARTIFACT} (not cached yet)"
    return None


def ensure_cassandra_lib(cache_dir: Path | None = None, *, timeout: float = 900.0) -> Path:
    """Return ``<cache>/lib`` holding cassandra-all and all its runtime jars; fetch if needed
    (see :func:`adaptive_lb.tools.peers.jvm.maven_classpath`).

    Raises:
        CassandraError: ``mvn`` is missing or fails.
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    return maven_classpath(CASSANDRA_ARTIFACT, cache / "lib", timeout=timeout, error=CassandraError)


def evenly_spaced_tokens(nodes: int, num_tokens: int = 1) -> list[list[int]]:
    """Murmur3 tokens for ``nodes`` nodes, ``num_tokens`` each, evenly spaced and interleaved
    (node ``i`` gets tokens ``i, i + nodes, ...`` of ``nodes * num_tokens`` equal steps), so
    every node owns the same share whatever the replication factor."""
    total = nodes * num_tokens
    step = 2**64 // total
    return [[-(2**63) + (j * nodes + i) * step for j in range(num_tokens)] for i in range(nodes)]


class _Node:
    """One node's files and process."""

    def __init__(self, index: int, address: str, root: Path) -> None:
        self.index = index
        self.address = address
        self.dir = root / f"node{index}"
        self.conf = self.dir / "conf"
        self.log = self.dir / "logs" / "system.log"
        self.out = self.dir / "logs" / "stdout.log"
        self.process: JvmProcess | None = None
        self.paused = False


class CassandraCluster:
    """A real N-node Cassandra cluster (one data center, one rack per node) on loopback.

    Nodes are numbered from 1: ``addresses[0]`` is node 1, the seed. ``start()`` returns
    when every node accepts CQL and knows every other node; ``stop()`` SIGKILLs every JVM
    and removes the data (an ``atexit`` hook does the same if the interpreter exits first).
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        address_prefix: str = "127.0.3.",
        datacenter: str = "dc1",
        racks: Sequence[str] | None = None,
        num_tokens: int = 1,
        heap_mb: int = 384,
        lib: Path | None = None,
        root: Path | None = None,
        keep_data: bool = False,
        cluster_name: str = "adaptive-lb",
    ) -> None:
        self.lib = Path(lib) if lib is not None else None
        self.datacenter = datacenter
        self.racks = list(racks) if racks is not None else [f"r{i + 1}" for i in range(nodes)]
        if len(self.racks) != nodes:
            raise ValueError(f"{nodes} nodes but {len(self.racks)} racks")
        self.num_tokens = num_tokens
        self.tokens = evenly_spaced_tokens(nodes, num_tokens)
        self.heap_mb = heap_mb
        self.cluster_name = cluster_name
        self.keep_data = keep_data
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="alb-cass-"))
        self._nodes = [_Node(i + 1, f"{address_prefix}{i + 1}", self.root) for i in range(nodes)]
        self.timings: dict[str, float] = {}
        """Seconds spent fetching jars (``fetch``), starting (``start``), per node (``nodeN``)
        and per restart (``restartN.cql``: CQL port open, ``restartN``: peers ready too)."""
        self._atexit = False

    # -- public API ------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """The nodes' addresses (node 1 first); every node uses CQL port 9042."""
        return [node.address for node in self._nodes]

    @property
    def port(self) -> int:
        """The CQL port, the same on every node."""
        return CQL_PORT

    def pid(self, node: int | str) -> int | None:
        """The JVM's process id of ``node`` (number from 1 or address), None if not running."""
        proc = self._node(node).process
        return proc.pid if proc is not None and proc.running else None

    def node_of(self, address: str) -> int:
        """The node number (from 1) of ``address``."""
        return self._node(address).index

    def log_path(self, node: int | str) -> Path:
        """The node's ``system.log``."""
        return self._node(node).log

    def start(self, timeout: float = 240.0) -> CassandraCluster:
        """Fetch the jars if needed, write every node's config and start the nodes one after
        another (the seed first); return once the cluster is ready (see :meth:`wait_ready`).

        Raises:
            CassandraError: a node exits, or readiness is not reached within ``timeout``.
        """
        began = time.monotonic()
        if self.lib is None:
            self.lib = ensure_cassandra_lib()
        self.timings["fetch"] = time.monotonic() - began
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        deadline = time.monotonic() + timeout
        try:
            for node in self._nodes:
                self._write_config(node)
            for node in self._nodes:
                node_began = time.monotonic()
                self._spawn(node)
                self._wait_node(node, deadline)
                self.timings[f"node{node.index}"] = time.monotonic() - node_began
            self.wait_ready(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began - self.timings["fetch"]
        return self

    def stop(self) -> None:
        """SIGKILL every node's JVM (resuming paused ones first) and remove the data."""
        for node in self._nodes:
            self._kill(node)
        if self._own_root and not self.keep_data:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._atexit:
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
            self._atexit = False

    def pause(self, node: int | str) -> None:
        """SIGSTOP the node's JVM: it keeps its sockets open but answers nothing (like a long
        stop-the-world GC pause); the driver keeps it UP while its requests hang."""
        n = self._node(node)
        self._process(n).signal(signal.SIGSTOP)
        n.paused = True

    def resume(self, node: int | str) -> None:
        """SIGCONT a node paused by :meth:`pause`."""
        n = self._node(node)
        self._process(n).signal(signal.SIGCONT)
        n.paused = False

    def kill(self, node: int | str) -> None:
        """SIGKILL the node's JVM (its data stays for :meth:`restart`)."""
        self._kill(self._node(node))

    def restart(self, node: int | str, timeout: float = 120.0) -> None:
        """Start a killed node again on its data; return once it accepts CQL and its peers
        list the other nodes."""
        n = self._node(node)
        if self.pid(n.index) is not None:
            raise CassandraError(f"node{n.index} is still running; kill() it first")
        began = time.monotonic()
        deadline = began + timeout
        self._spawn(n)
        self._wait_node(n, deadline)
        self.timings[f"restart{n.index}.cql"] = time.monotonic() - began
        self.wait_ready(deadline - time.monotonic())
        self.timings[f"restart{n.index}"] = time.monotonic() - began

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every running node's ``system.peers_v2`` lists every other node with
        its data center and a schema version.

        Raises:
            CassandraError: not ready in time.
        """
        from cassandra.policies import WhiteListRoundRobinPolicy

        deadline = time.monotonic() + max(timeout, 1.0)
        for node in self._nodes:
            others = {n.address for n in self._nodes if n is not node}
            last: Any = None
            while True:
                try:
                    cluster, session = connect_driver(
                        [node.address],
                        WhiteListRoundRobinPolicy([node.address]),
                        request_timeout=5.0,
                        connect_timeout=5.0,
                    )
                except Exception as exc:
                    last = exc
                else:
                    try:
                        rows = session.execute(
                            "SELECT peer, data_center, schema_version FROM system.peers_v2"
                        )
                        seen = {
                            str(row.peer)
                            for row in rows
                            if row.data_center == self.datacenter and row.schema_version
                        }
                        if others <= seen:
                            break
                        last = f"peers_v2 of {node.address} lists {sorted(seen)}"
                    except Exception as exc:
                        last = exc
                    finally:
                        cluster.shutdown()
                self._process(node).check_alive()
                if time.monotonic() > deadline:
                    raise CassandraError(f"cluster not ready: {last}")
                time.sleep(0.5)

    def __enter__(self) -> CassandraCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _node(self, node: int | str | _Node) -> _Node:
        if isinstance(node, _Node):
            return node
        if isinstance(node, int):
            if not 1 <= node <= len(self._nodes):
                raise KeyError(f"no node {node} (nodes are numbered 1..{len(self._nodes)})")
            return self._nodes[node - 1]
        for n in self._nodes:
            if n.address == node:
                return n
        raise KeyError(f"no node at {node}")

    def _process(self, node: _Node) -> JvmProcess:
        if node.process is None:
            raise CassandraError(f"node{node.index} ({node.address}) is not running")
        return node.process

    def _kill(self, node: _Node) -> None:
        if node.process is not None:
            node.process.stop()
        node.process = None
        node.paused = False

    def _write_config(self, node: _Node) -> None:
        for sub in ("conf", "data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        seed = self._nodes[0].address
        tokens = ",".join(str(t) for t in self.tokens[node.index - 1])
        yaml = f"""\
cluster_name: '{self.cluster_name}'
num_tokens: {self.num_tokens}
initial_token: '{tokens}'
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
auto_bootstrap: false
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seed}:{STORAGE_PORT}"
listen_address: {node.address}
rpc_address: {node.address}
storage_port: {STORAGE_PORT}
ssl_storage_port: 7001
native_transport_port: {CQL_PORT}
start_native_transport: true
endpoint_snitch: GossipingPropertyFileSnitch
data_file_directories:
  - {node.dir / "data"}
commitlog_directory: {node.dir / "commitlog"}
saved_caches_directory: {node.dir / "saved_caches"}
hints_directory: {node.dir / "hints"}
cdc_raw_directory: {node.dir / "cdc_raw"}
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_segment_size: 8MiB
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
key_cache_size: 8MiB
counter_cache_size: 0MiB
file_cache_size: 32MiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 8
concurrent_materialized_view_writes: 8
compaction_throughput: 64MiB/s
hinted_handoff_enabled: true
dynamic_snitch: true
"""
        (node.conf / "cassandra.yaml").write_text(yaml)
        (node.conf / "cassandra-rackdc.properties").write_text(
            f"dc={self.datacenter}\nrack={self.racks[node.index - 1]}\n"
        )
        (node.conf / "logback.xml").write_text(_LOGBACK.format(log=node.log))

    def _spawn(self, node: _Node) -> None:
        assert self.lib is not None
        jamm = sorted(self.lib.glob("jamm-*.jar"))
        agent = [f"-javaagent:{jamm[-1]}"] if jamm else []
        props = {
            "cassandra.config": f"file://{node.conf / 'cassandra.yaml'}",
            "cassandra-rackdc.properties": f"file://{node.conf / 'cassandra-rackdc.properties'}",
            "logback.configurationFile": str(node.conf / "logback.xml"),
            "cassandra.logdir": str(node.dir / "logs"),
            "cassandra.storagedir": str(node.dir),
            "cassandra-foreground": "yes",
            "cassandra.skip_wait_for_gossip_to_settle": "0",
            "cassandra.ring_delay_ms": "1000",
        }
        command = java_command(
            main="org.apache.cassandra.service.CassandraDaemon",
            classpath=[node.conf, f"{self.lib}/*"],
            jvm_args=[
                f"-Xms{self.heap_mb}m",
                f"-Xmx{self.heap_mb}m",
                *JVM_TUNING_FLAGS,
                *JVM17_MODULE_FLAGS,
                *agent,
                *(f"-D{key}={value}" for key, value in props.items()),
            ],
            die_with_parent=True,  # the JVM gets SIGKILL if the thread that started it dies
        )
        node.process = JvmProcess(
            command,
            node.out,
            name=f"node{node.index} ({node.address})",
            cwd=node.dir,
            append=True,
            logs=[node.log],
            stop_grace=0.0,  # throwaway data: SIGKILL right away
            error=CassandraError,
        ).start()

    def _wait_node(self, node: _Node, deadline: float) -> None:
        """Wait for the node's "listening for CQL clients" log line and its open CQL port."""
        self._process(node).wait_ready(
            deadline, log_line=READY_LOG_LINE, log_file=node.log, port=(node.address, CQL_PORT)
        )
