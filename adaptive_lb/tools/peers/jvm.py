"""The JVM harness: fetch jars from Maven Central, run one Java process, stop it by PID.

Simulacron (:mod:`adaptive_lb.tools.peers.simulacron`) and the real Apache Cassandra nodes of the
integration tests (``tests/integration/cassandra.py``) are both Java programs fetched from
Maven Central and run as child processes. This module is everything they share:

* :func:`maven_jar` - one artifact's jar, and :func:`maven_classpath` - an artifact with all
  its runtime dependencies, fetched once with ``mvn`` into a cache directory. Maven writes
  into a temporary directory that is renamed into place, so a half-finished download is never
  reused.
* :func:`java_command` - the ``java`` command line for a main class or an executable jar.
* :class:`JvmProcess` - one JVM: stdout and stderr to a log file, readiness by a log line, an
  open TCP port and/or a probe, the log's tail in error messages, signals (SIGSTOP/SIGCONT),
  stop by PID (SIGTERM, SIGKILL after a grace period) and an ``atexit`` hook that does the same.

Imports the standard library and :mod:`~adaptive_lb.tools.peers.net` only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from adaptive_lb.tools.peers.net import port_open

__all__ = [
    "JvmError",
    "JvmProcess",
    "java_command",
    "maven_classpath",
    "maven_classpath_ready",
    "maven_jar",
    "tail",
]

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0
                             http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>adaptive-lb.tests</groupId>
  <artifactId>{artifact}-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""

#: The exception class callers may substitute (``error=``) for their own, e.g. SimulacronError.
ErrorType = type[Exception]


class JvmError(RuntimeError):
    """A jar could not be fetched, or a JVM exited or did not become ready."""


def tail(text: str, lines: int = 30, chars: int = 3000) -> str:
    """The last ``lines`` lines of ``text`` (at most ``chars`` characters), for error messages."""
    text = "\n".join(text.strip().splitlines()[-lines:])
    return text if len(text) <= chars else "..." + text[-chars:]


# --------------------------------------------------------------------------------------------
# Maven
# --------------------------------------------------------------------------------------------


def _coordinates(artifact: str) -> tuple[str, str, str]:
    group, name, version = artifact.split(":")
    return group, name, version


def _run_maven(
    args: Sequence[str],
    *,
    target: Path,
    artifact: str,
    produced: Callable[[], bool],
    timeout: float,
    error: ErrorType,
) -> None:
    """Run ``mvn -q -B <args>``; raise ``error`` unless it exits 0 and ``produced()``."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(
            f"{target} is missing and `mvn` is not on PATH: install Maven, or fetch {artifact} "
            f"yourself"
        )
    cmd = [mvn, "-q", "-B", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise error(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from exc
    if proc.returncode != 0 or not produced():
        raise error(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}); is Maven Central "
            f"reachable?\n{tail(proc.stdout + proc.stderr)}"
        )


def maven_jar(
    artifact: str, cache: Path, *, timeout: float = 600.0, error: ErrorType = JvmError
) -> Path:
    """Return ``cache/<artifactId>-<version>.jar``, fetching it first if it is not there.

    ``artifact`` is ``group:artifactId:version``; ``mvn dependency:copy`` fetches the jar alone
    (no dependencies: for a standalone, shaded jar).

    Raises:
        error: ``mvn`` is not installed, fails, times out or does not produce the jar.
    """
    _, name, version = _coordinates(artifact)
    jar = Path(cache) / f"{name}-{version}.jar"
    if jar.is_file() and jar.stat().st_size > 0:
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent, prefix=".mvn-") as tmp:
        fetched = Path(tmp) / jar.name
        _run_maven(
            ["dependency:copy", f"-Dartifact={artifact}:jar", f"-DoutputDirectory={tmp}"],
            target=jar,
            artifact=artifact,
            produced=fetched.is_file,
            timeout=timeout,
            error=error,
        )
        os.replace(fetched, jar)
    return jar


def maven_classpath_ready(artifact: str, lib: Path) -> bool:
    """True when ``lib`` holds a complete :func:`maven_classpath` download of ``artifact``."""
    _, name, _ = _coordinates(artifact)
    return (Path(lib) / ".complete").is_file() and any(Path(lib).glob(f"{name}-*.jar"))


def maven_classpath(
    artifact: str, lib: Path, *, timeout: float = 900.0, error: ErrorType = JvmError
) -> Path:
    """Return the directory ``lib`` holding ``artifact``'s jar and all its runtime jars.

    Fetched if not complete yet: a generated one-dependency pom and
    ``mvn dependency:copy-dependencies`` fill a temporary directory, which gets a
    ``.complete`` marker and then replaces ``lib``. Run the JVM with classpath ``lib/*``.

    Raises:
        error: ``mvn`` is not installed, fails, times out or does not produce the jar.
    """
    lib = Path(lib)
    if maven_classpath_ready(artifact, lib):
        return lib
    group, name, version = _coordinates(artifact)
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent, prefix=".mvn-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_POM.format(group=group, artifact=name, version=version))
        out = Path(tmp) / lib.name
        _run_maven(
            ["-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={out}"],
            target=lib,
            artifact=artifact,
            produced=lambda: any(out.glob(f"{name}-*.jar")),
            timeout=timeout,
            error=error,
        )
        (out / ".complete").write_text(artifact + "\n")
        if lib.exists():
            shutil.rmtree(lib)
        os.replace(out, lib)
    return lib


# --------------------------------------------------------------------------------------------
# The process
# --------------------------------------------------------------------------------------------


def java_command(
    *,
    main: str | None = None,
    jar: Path | None = None,
    classpath: Sequence[str | Path] = (),
    jvm_args: Sequence[str] = (),
    args: Sequence[str] = (),
    die_with_parent: bool = False,
) -> list[str]:
    """The command line running ``main`` (a class on ``classpath``) or the executable ``jar``.

    ``jvm_args`` go before the class or jar, ``args`` after it. ``die_with_parent`` starts
    the JVM through ``setpriv --pdeathsig KILL`` (when installed): it then gets SIGKILL when
    the thread that started it dies, even if that process is SIGKILLed and ``atexit`` never
    runs.
    """
    if (main is None) == (jar is None):
        raise ValueError("give exactly one of main= and jar=")
    setpriv = shutil.which("setpriv") if die_with_parent else None
    cmd = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    cmd += [shutil.which("java") or "java", *jvm_args]
    if jar is not None:
        cmd += ["-jar", str(jar)]
    else:
        cmd += ["-cp", os.pathsep.join(str(p) for p in classpath), str(main)]
    return [*cmd, *args]


class JvmProcess:
    """One JVM child process, started once with :meth:`start` and killed by PID with :meth:`stop`.

    Args:
        command: the command line, usually from :func:`java_command`.
        log_path: the file that receives the process's stdout and stderr.
        name: how error messages call it (``"Simulacron"``, ``"node2 (127.0.3.2)"``).
        cwd: its working directory.
        append: append to ``log_path`` (default: truncate it).
        logs: other log files the JVM writes itself (e.g. a logback file): their tails join
            error messages, and :meth:`wait_ready` can wait for a line in one of them.
        stop_grace: seconds :meth:`stop` waits after SIGTERM before SIGKILL (``0``: SIGKILL
            right away, for throwaway data).
        kill_wait: seconds :meth:`stop` waits for the process to go after SIGKILL.
        keep_log: keep ``log_path`` after :meth:`stop` (default) or delete it.
        error: the exception class raised (default :class:`JvmError`).
    """

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        *,
        name: str = "JVM",
        cwd: Path | None = None,
        append: bool = False,
        logs: Sequence[Path] = (),
        stop_grace: float = 5.0,
        kill_wait: float = 10.0,
        keep_log: bool = True,
        error: ErrorType = JvmError,
    ) -> None:
        self.command = list(command)
        self.log_path = Path(log_path)
        self.name = name
        self.cwd = cwd
        self.append = append
        self.logs = [Path(p) for p in logs]
        self.stop_grace = stop_grace
        self.kill_wait = kill_wait
        self.keep_log = keep_log
        self.error = error
        self._proc: subprocess.Popen[bytes] | None = None
        self._offsets: dict[Path, int] = {}

    @property
    def pid(self) -> int | None:
        """The process id from :meth:`start` until :meth:`stop` (even if it exited meanwhile)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the process is started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> JvmProcess:
        """Start the process in a new session (a terminal's Ctrl-C does not reach it)."""
        if self._proc is not None:
            raise self.error(f"{self.name} was started already")
        self._offsets = {p: p.stat().st_size if p.exists() else 0 for p in self.logs}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab" if self.append else "wb") as out:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )
        atexit.register(self.stop)
        return self

    def check_alive(self) -> None:
        """Raise ``error`` (with the log's tail) unless the process is running."""
        if not self.running:
            code = None if self._proc is None else self._proc.returncode
            raise self.error(f"{self.name} exited with code {code}:\n{self.log_tail()}")

    def wait_ready(
        self,
        deadline: float,
        *,
        log_line: str | None = None,
        log_file: Path | None = None,
        port: tuple[str, int] | None = None,
        probe: Callable[[], bool] | None = None,
        what: str = "",
        interval: float = 0.25,
    ) -> None:
        """Poll until every given condition holds; raise ``error`` if the process exits first
        or ``deadline`` (a ``time.monotonic()`` value) passes.

        Conditions: ``log_line`` written to ``log_file`` (default ``log_path``) since
        :meth:`start`; a TCP connect to ``port`` (``(address, port)``) succeeds; ``probe()``
        returns True. ``what`` describes them in the timeout message.
        """
        source = Path(log_file) if log_file is not None else self.log_path
        while True:
            self.check_alive()
            if (
                (log_line is None or self._logged(source, log_line))
                and (port is None or port_open(*port))
                and (probe is None or probe())
            ):
                return
            if time.monotonic() > deadline:
                wanted = (
                    log_line and f"{log_line!r} in {source}",
                    port and f"TCP {port[0]}:{port[1]}",
                )
                waited = what or " and ".join(w for w in wanted if w)
                raise self.error(f"{self.name} not ready in time ({waited}):\n{self.log_tail()}")
            time.sleep(interval)

    def _logged(self, path: Path, line: str) -> bool:
        if not path.exists():
            return False
        with open(path, "rb") as fh:
            fh.seek(self._offsets.get(path, 0))
            return line.encode() in fh.read()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every log file of the process, for error messages."""
        parts = [
            f"{path.name}:\n{tail(path.read_text(errors='replace'), lines)}"
            for path in (self.log_path, *self.logs)
            if path.exists() and path.stat().st_size
        ]
        return "\n".join(parts) or "(no log)"

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` (e.g. SIGSTOP / SIGCONT) to the running process."""
        if not self.running:
            raise self.error(f"{self.name} is not running")
        assert self._proc is not None
        self._proc.send_signal(sig)

    def stop(self) -> None:
        """Kill the process by PID: SIGTERM, then SIGKILL after ``stop_grace`` s (SIGCONT too,
        so a stopped process gets them). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self.stop_grace > 0:
            _send(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.stop_grace)
        if proc.poll() is None:
            _send(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(self.kill_wait)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if not self.keep_log:
            self.log_path.unlink(missing_ok=True)


def _send(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """``sig`` and then SIGCONT (a SIGSTOPped process acts on signals only once continued)."""
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
