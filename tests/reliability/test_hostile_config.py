"""Hostile config files: every input of at most 1 MiB is refused or accepted within 1 s.

Each input is loaded with ``load_config``, through ``policy.reload(path)`` and by a
``ConfigWatcher``. A refused input gives a ConfigError that names the reason, the policy and
the watcher keep the last good config, and no secret written in the input (the sentinel
:data:`SECRET`) shows in any message, repr or log record (tracebacks included).

Every input runs in a worker process with a hard timeout (:data:`HARD_TIMEOUT`), so that a
regression (a hang, or memory blowing up) fails its test instead of hanging the suite. The
1 s bound is asserted: it is the denial-of-service guarantee, not a performance target.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from adaptive_lb.config import MAX_CONFIG_BYTES

ROOT = Path(__file__).resolve().parents[2]
MIB = MAX_CONFIG_BYTES
BOUND = 1.0
"""CPU seconds any input may take to be refused or accepted (each of load, reload, watch)."""
HARD_TIMEOUT = 10.0
"""Seconds after which the worker is killed and the input counts as a hang."""

SECRET = "Bearer Zq9xK2mW7pLr"
SECRET_CORE = "Zq9xK2mW"
"""Part of :data:`SECRET` that must never show (a truncated repr would still show it)."""
HEADERS = f'tracing:\n  otlp:\n    headers:\n      Authorization: "{SECRET}"\n'
"""A valid headers section carrying the secret."""
GOOD = "policy:\n  sample_size: 3\n"


class Case(NamedTuple):
    name: str
    make: Callable[[], bytes | str]
    expect: str | None
    """Regex the ConfigError must match; None: the input is a valid config."""


def fill(head: str, unit: str, tail: str = "\n") -> str:
    """``head`` + ``unit`` repeated + ``tail``, as long as it fits in 1 MiB of UTF-8."""
    room = MIB - len((head + tail).encode()) - 16
    return head + unit * (room // len(unit.encode())) + tail


def lines(make_line: Callable[[int], str], head: str = "") -> str:
    """``head`` and numbered lines, as many as fit in 1 MiB."""
    parts, size, index = [head], len(head), 0
    while True:
        line = make_line(index)
        if size + len(line) > MIB - 64:
            return "".join(parts)
        parts.append(line)
        size += len(line)
        index += 1


def alias_bomb() -> str:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    rows.append("policy: {sample_size: *a9, local_rack: *a9}")
    rows.append(f'tracing: {{otlp: {{headers: {{k: *a9, Authorization: "{SECRET}"}}}}}}')
    return "\n".join(rows) + "\n"


def merge_bomb(levels: int, width: int = 2) -> str:
    """Each level merges the previous one ``width`` times: 2 ** levels keys (511 bytes for
    20 levels), though only ~3 x levels nodes."""
    rows = ["a0: &a0 {x1: 1, x2: 2}"]
    for i in range(1, levels + 1):
        rows.append(f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * width)}], y: 1}}")
    rows.append(f'tracing: {{otlp: {{headers: {{<<: *a{levels}, A: "{SECRET}"}}}}}}')
    return "\n".join(rows) + "\n"


def merge_chain(keys: int, levels: int) -> str:
    """A mapping of ``keys`` keys, then ``levels`` mappings each merging the previous one
    (``<<: *prev``) and adding a key: keys x levels merged keys."""
    rows = ["m0: &m0 {" + ", ".join(f"k{j}: {j}" for j in range(keys)) + "}"]
    rows += [f"m{i}: &m{i} {{<<: *m{i - 1}, z{i}: 1}}" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def merge_wide(keys: int, width: int) -> str:
    """One mapping merging the same ``keys``-key mapping ``width`` times."""
    base = "b: &b {" + ", ".join(f"k{j}: 1" for j in range(keys)) + "}\n"
    return base + "policy: {<<: [" + ", ".join(["*b"] * width) + "], sample_size: 3}\n"


def merge_from_the_end(levels: int) -> str:
    """A chain of mappings, each merging the previous one, whose last one is merged before
    any other is built: flattening it recurses ``levels`` deep."""
    chain = ["&a0 {x: 1}"] + [f"&a{i} {{<<: *a{i - 1}}}" for i in range(1, levels)]
    return f"defs: [{', '.join(chain)}]\npolicy: {{<<: *a{levels - 1}}}\n"


def block_nesting(levels: int) -> str:
    return "".join(" " * i + f"k{i}:\n" for i in range(levels))


ints = "policy:\n  sample_size: "
rack = "policy:\n  local_rack: "
CASES = [
    # Aliases and merge keys.
    Case("alias bomb", alias_bomb, r"policy\.sample_size: must be an integer, got a list"),
    Case("merge bomb, 20 levels (511 bytes)", lambda: merge_bomb(20), r"merge"),
    Case("merge bomb, 40 levels", lambda: merge_bomb(40), r"merge"),
    Case("merge bomb, 9 wide", lambda: merge_bomb(12, width=9), r"merge"),
    Case("merge chain of big mappings", lambda: merge_chain(2000, 400), r"merge"),
    Case("long merge chain", lambda: merge_chain(1, 1600), r"merge"),
    Case("one wide merge", lambda: merge_wide(1000, 7000), r"merge"),
    Case("merge chain flattened from its end", lambda: merge_from_the_end(1500), r"merge"),
    Case("self merge", lambda: "policy: &p {sample_size: 3, <<: *p}\n", None),
    Case("recursive alias", lambda: "policy: &p {local_rack: *p}\n", r"got a mapping"),
    Case("merge of a scalar", lambda: "a: &a 1\npolicy: {<<: *a}\n", r"merg"),
    Case("anchors on every node (valid)", lambda: "policy: &p {sample_size: &s 3}\n", None),
    Case(
        "anchors on every node (100k)",
        lambda: lines(lambda i: f"- &a{i} [&b{i} x]\n"),
        r"more than 10000 values",
    ),
    Case("1 MiB anchor name", lambda: fill("policy: {local_rack: &", "a", " x}\n"), None),
    Case("1 MiB undefined alias", lambda: fill("policy: {local_rack: *", "a", "}\n"), r"alias"),
    # Nesting.
    Case("deep flow sequences", lambda: "[" * (MIB - 1), r"nested deeper than 16 levels"),
    Case("deep flow mappings", lambda: fill("", "{a: ", ""), r"nested deeper than 16 levels"),
    Case("deep block mappings", lambda: block_nesting(1400), r"nested deeper than 16 levels"),
    Case("deep block sequences", lambda: fill("", "- ", "x\n"), r"nested deeper than 16 levels"),
    # Size: long scalars, long lines, many keys, many documents.
    Case("1 MiB plain scalar", lambda: fill(rack, "x"), None),
    Case("1 MiB of escapes", lambda: fill(rack + '"', "\\x41", '"\n'), None),
    Case("1 MiB single-quoted", lambda: fill(rack + "'", "a''", "'\n"), None),
    Case("1 MiB multi-line plain", lambda: fill(rack + "x\n", "    y\n", ""), None),
    Case("1 MiB block literal", lambda: fill(rack + "|\n", "    x\n", ""), None),
    Case("1 MiB of emoji", lambda: fill(rack, "\U0001f600"), None),
    Case("1 MiB comment", lambda: fill("", "#", ""), None),
    Case("1 MiB of newlines", lambda: fill("", "\n", ""), None),
    Case(
        "1 MiB single line",
        lambda: "{" + lines(lambda i: f"a{i}: {i}, ")[:-2] + "}",
        r"more than 10000 values",
    ),
    Case("100k tiny keys", lambda: lines(lambda i: f"k{i}: {i}\n"), r"more than 10000 values"),
    Case("1 MiB key", lambda: fill("? ", "k", "\n: 1\n"), r"unknown key"),
    Case(
        "4000 long unknown keys",
        lambda: "policy:\n" + "".join(f"  {'k' * 200}{i}: 1\n" for i in range(4000)),
        r"unknown key.*\.\.\. and 3900 more",
    ),
    Case("many documents", lambda: fill("", "---\n", ""), r"single document"),
    Case(
        "many %TAG directives",
        lambda: lines(lambda i: f"%TAG !t{i}! tag:x,2000:\n") + "--- {}\n",
        r"directive",
    ),
    # Numbers and other scalars.
    Case("1 MiB decimal integer", lambda: fill(ints, "9"), r"too long"),
    Case("5000-digit integer", lambda: ints + "9" * 5000 + "\n", r"too long"),
    Case("1000-digit integer", lambda: ints + "9" * 1000 + "\n", r"must be <= 64"),
    Case("1 MiB hex integer", lambda: fill(ints + "0x", "f"), r"too long"),
    Case("1 MiB octal integer", lambda: fill(ints + "0", "7"), r"too long"),
    Case("1 MiB binary integer", lambda: fill(ints + "0b", "1"), r"too long"),
    Case("1 MiB sexagesimal integer", lambda: fill(ints + "1", ":59"), r"too long"),
    Case("1e999999", lambda: "health:\n  percentile: 1.0e+999999\n", r"finite number"),
    Case("1 MiB exponent", lambda: fill("health:\n  percentile: 1.0e+", "9"), r"finite"),
    Case("1 MiB mantissa", lambda: fill("tracing:\n  ratio: 0.", "1"), None),
    Case("sexagesimal float", lambda: fill("health:\n  percentile: 1", ":30", ".5\n"), "!!float"),
    Case("timestamp", lambda: rack + "2001-12-14t21:59:43.10-05:00\n", r"got a datetime"),
    Case("long fraction", lambda: fill(rack + "2001-12-14 21:59:43.", "1"), r"got a datetime"),
    Case("1 MiB !!binary", lambda: fill(rack + "!!binary ", "QUFB"), r"got binary data"),
    Case("bad !!binary", lambda: rack + "!!binary 'a\xe9'\n", r"base64"),
    Case("!!set", lambda: rack + "!!set {a, b}\n", r"got a set"),
    Case("!!omap", lambda: rack + "!!omap [a: 1, b: 2]\n", r"got a list"),
    Case("!!bool on junk", lambda: "policy:\n  token_aware: !!bool maybe\n", r"not a valid"),
    Case("!!timestamp on junk", lambda: rack + "!!timestamp nope\n", r"not a valid"),
    Case("!!int on a secret", lambda: HEADERS.replace('"B', '!!int "B'), r"not a valid"),
    Case("!!float on a secret", lambda: HEADERS.replace('"B', '!!float "B'), r"not a valid"),
    # Tags, encodings, characters.
    Case(
        "python/object/apply",
        lambda: "policy: !!python/object/apply:os.system ['echo pwned']\n",
        r"only plain YAML values are accepted",
    ),
    Case("python/name", lambda: "x: !!python/name:os.system\n", r"only plain YAML values"),
    Case("python/module", lambda: "x: !!python/module:os\n", r"only plain YAML values"),
    Case(
        "python/object/new",
        lambda: "!!python/object/new:adaptive_lb.config.Config {}\n",
        r"only plain YAML values",
    ),
    Case("1 MiB tag", lambda: fill("policy: !<tag:", "x", "> 1\n"), r"only plain YAML values"),
    Case("secret as a tag", lambda: HEADERS.replace('"B', f"!{SECRET_CORE} B"), r"plain YAML"),
    Case("secret as an alias", lambda: HEADERS.split('"')[0] + f"*{SECRET_CORE}\n", r"alias"),
    Case("non-UTF-8 bytes", lambda: (HEADERS + "      X: \xff\n").encode("latin-1"), r"UTF-8"),
    Case("UTF-16", lambda: (GOOD + HEADERS).encode("utf-16"), r"UTF-8"),
    Case("NUL byte", lambda: HEADERS.replace("Lr", "Lr\x00"), r"unacceptable character #x0000"),
    Case("BEL byte", lambda: rack + "a\x07b\n", r"unacceptable character #x0007"),
    Case("a BOM", lambda: "\ufeff" + GOOD + HEADERS, None),
    Case("tab indentation", lambda: HEADERS.replace("      A", "\tA"), r"not valid YAML"),
    Case("unclosed quote", lambda: HEADERS.rstrip('"\n') + "\n", r"not valid YAML: line"),
    Case("bad escape", lambda: HEADERS.replace("Lr", "Lr\\q"), r"not valid YAML: line"),
    # Secrets in rejected values.
    Case("secret beside a bad header", lambda: HEADERS + "      X-Retries: 3\n", r"X-Retries"),
    Case(
        "headers as a list",
        lambda: f'tracing:\n  otlp:\n    headers: ["Authorization: {SECRET}"]\n',
        r"must be a mapping",
    ),
]


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    running = Worker()
    yield running
    running.stop()


WORKER = r"""
import json, logging, shutil, sys, time
from cassandra.policies import DCAwareRoundRobinPolicy
from adaptive_lb import AdaptiveLoadBalancingPolicy
from adaptive_lb.config import ConfigError, ConfigWatcher, load_config

logged = []


class Keep(logging.Handler):
    def emit(self, record):
        logged.append(logging.Formatter().format(record))  # message and traceback


logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.DEBUG)


def attempt(call):
    # CPU time of this worker: the work an input costs, whatever else the machine runs (a
    # loaded CI machine stretches wall time; a blow-up shows in CPU time all the same).
    start = time.process_time()
    try:
        call()
        result = {"outcome": "accepted", "text": ""}
    except ConfigError as exc:
        result = {"outcome": "ConfigError", "text": "\n".join([str(exc), repr(exc), *exc.errors])}
    except BaseException as exc:
        result = {"outcome": "crash: " + type(exc).__name__, "text": repr(exc)[:2000]}
    result["seconds"] = time.process_time() - start
    return result


print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    hostile, good, watched = request["hostile"], request["good"], request["watched"]
    del logged[:]
    report = {"load": attempt(lambda: load_config(hostile))}
    policy = AdaptiveLoadBalancingPolicy(DCAwareRoundRobinPolicy("dc1"))
    policy.reload(good)
    before = policy.config_hash
    report["reload"] = attempt(lambda: policy.reload(hostile))
    report["reload_kept"] = policy.config_hash == before
    shutil.copyfile(good, watched)
    errors = []
    watcher = ConfigWatcher(watched, lambda config: None, errors.append)
    watcher.check()
    last_good = watcher.config
    shutil.copyfile(hostile, watched)
    report["watch"] = attempt(watcher.check)
    report["watch_kept"] = watcher.config == last_good
    report["watch_errors"] = [str(error) for error in errors]
    report["logs"] = list(logged)
    print(json.dumps(report), flush=True)
"""


class Worker:
    """A process loading the files it is sent, one at a time, killed when one takes longer
    than :data:`HARD_TIMEOUT` (and started again for the next)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def _answer(self, timeout: float) -> str | None:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return None
        return self.process.stdout.readline()

    def run(self, **paths: str) -> dict:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", WORKER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            assert self._answer(60) == "ready\n"
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(paths) + "\n")
        self.process.stdin.flush()
        answer = self._answer(HARD_TIMEOUT)
        if answer is None:
            pytest.fail(f"no answer after {HARD_TIMEOUT} s: the loader hangs")
        if not answer:
            self.stop()
            pytest.fail("the worker died (out of memory?)")
        return json.loads(answer)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_hostile_file_is_settled_within_a_second(case, worker, tmp_path):
    content = case.make()
    data = content.encode() if isinstance(content, str) else content
    assert len(data) <= MIB
    hostile = tmp_path / "hostile.yaml"
    hostile.write_bytes(data)
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    report = worker.run(hostile=str(hostile), good=str(good), watched=str(tmp_path / "w.yaml"))
    for step in ("load", "reload", "watch"):
        assert not report[step]["outcome"].startswith("crash"), (step, report[step])
        assert report[step]["seconds"] < BOUND, (step, report[step]["seconds"])
    load = report["load"]
    if case.expect is None:
        assert load["outcome"] == "accepted", load["text"][:2000]
        assert report["reload"]["outcome"] == "accepted"
        assert not report["watch_errors"]
    else:
        assert load["outcome"] == "ConfigError"
        assert re.search(case.expect, load["text"], re.S), load["text"][:2000]
        assert len(load["text"]) < 100_000
        assert report["reload"]["outcome"] == "ConfigError"
        assert report["reload_kept"], "a failed reload must keep the last good config"
        assert report["watch_kept"], "the watcher must keep the last good config"
        assert len(report["watch_errors"]) == 1
        assert report["logs"], "a rejected file is logged"
    assert SECRET_CORE not in json.dumps(report)


def test_python_object_tags_run_nothing(tmp_path, worker):
    marker = tmp_path / "pwned"
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(f"policy: !!python/object/apply:os.system ['touch {marker}']\n")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    report = worker.run(hostile=str(hostile), good=str(good), watched=str(tmp_path / "w.yaml"))
    assert report["load"]["outcome"] == "ConfigError"
    assert not marker.exists()
