"""The optional compiled hot path (adaptive_lb._extensions, setup.py): the ``.pxd`` files
match the ``.py`` classes they type, the pure-Python switch works, and -- where CI says the
compiled path must be in use -- it is."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_lb import _extensions

PACKAGE = Path(_extensions.__file__).parent
PXD_ATTRIBUTE = re.compile(r"^\s+cdef (?:public |readonly )?[\w.]+(?: \w+)* (\w+)\s*$")


def _pxd_classes(path: Path) -> dict[str, set[str]]:
    """``cdef class`` name -> its declared attributes."""
    classes: dict[str, set[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        header = re.match(r"cdef class (\w+)", line)
        if header:
            current = classes.setdefault(header.group(1), set())
        elif current is not None and (match := PXD_ATTRIBUTE.match(line)):
            current.add(match.group(1))
    return classes


def _py_slots(path: Path) -> dict[str, set[str]]:
    """Class name -> the names in its ``__slots__`` literal."""
    slots = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and [getattr(t, "id", None) for t in statement.targets] == ["__slots__"]
                    and isinstance(statement.value, ast.Tuple)
                ):
                    slots[node.name] = {ast.literal_eval(e) for e in statement.value.elts}
    return slots


PXD_FILES = sorted(PACKAGE.glob("*.pxd"))


def test_every_pxd_types_a_module_that_is_compiled():
    assert PXD_FILES
    for pxd in PXD_FILES:
        assert f"adaptive_lb.{pxd.stem}" in _extensions.COMPILED_MODULES, pxd.name


@pytest.mark.parametrize("pxd", PXD_FILES, ids=lambda p: p.name)
def test_a_pxd_declares_exactly_the_slots_of_its_classes(pxd):
    # A slot missing from the .pxd is an AttributeError on the compiled path only; one
    # the .py dropped is dead weight there.
    declared = _pxd_classes(pxd)
    slots = _py_slots(pxd.with_suffix(".py"))
    assert declared
    for name, attributes in declared.items():
        assert name in slots, f"{pxd.name}: {name} has no __slots__ in the .py"
        assert attributes == slots[name], f"{pxd.name}: {name}"


def _compiled_in_subprocess(env: dict[str, str], cwd: Path | None = None) -> dict[str, bool]:
    code = "import json, adaptive_lb._extensions as e; print(json.dumps(e.compiled_modules()))"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=cwd,
    )
    return json.loads(out.stdout)


def test_the_pure_python_switch_imports_every_source():
    env = dict(os.environ, **{_extensions.PURE_PYTHON_ENV: "1"})
    assert _compiled_in_subprocess(env) == dict.fromkeys(_extensions.COMPILED_MODULES, False)


def test_this_process_runs_the_path_ci_expects():
    # CI sets ADAPTIVE_LB_EXPECT_COMPILED: 1 where the install must have compiled the hot
    # path (a silent fall-back to pure Python would otherwise test one path twice).
    pure = os.environ.get(_extensions.PURE_PYTHON_ENV, "") not in ("", "0")
    expected = os.environ.get("ADAPTIVE_LB_EXPECT_COMPILED")
    if pure:
        expected = "0"
    if expected is None:
        pytest.skip("ADAPTIVE_LB_EXPECT_COMPILED is not set")
    compiled = _extensions.compiled_modules()
    assert compiled == dict.fromkeys(_extensions.COMPILED_MODULES, expected == "1")


def test_a_stale_compiled_module_is_never_imported(tmp_path):
    # An edited .py in a checkout must run as edited, not as its old compiled form.
    if not any(_compiled_in_subprocess(dict(os.environ)).values()):
        pytest.skip("the hot path is not compiled in this checkout")
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "adaptive_lb", ignore=shutil.ignore_patterns("*.c"))
    (checkout / "setup.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop(_extensions.PURE_PYTHON_ENV, None)
    fresh = _compiled_in_subprocess(env, checkout)
    assert all(fresh.values())
    source = checkout / "adaptive_lb" / "window.py"
    os.utime(source)  # edited now, after the copied compiled modules were built
    assert _compiled_in_subprocess(env, checkout) == dict.fromkeys(
        _extensions.COMPILED_MODULES, False
    )
