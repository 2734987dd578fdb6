"""The optional compiled hot path: which modules have one, which are in use, and the switch
back to pure Python.

``pip install`` compiles the modules of :data:`COMPILED_MODULES` with Cython when a C
compiler is present (``setup.py``; the ``.pxd`` file beside each ``.py`` declares its
classes as C types with C-typed counters, so the ``.py`` stays the one source of the
logic). Python then imports the compiled module in place of the ``.py``; without a
compiler, or with ``ADAPTIVE_LB_NO_EXTENSIONS=1`` at install time, the ``.py`` files run
as they are, with the same behaviour. Setting ``ADAPTIVE_LB_PURE_PYTHON=1`` in the
environment before ``adaptive_lb`` is first imported makes a process import the ``.py``
files even when the compiled ones are there (to compare, to debug, or to profile with a
Python-level profiler). The tests run both ways.

In a source checkout (an editable install: ``setup.py`` beside the package), a compiled
module older than its ``.py`` or ``.pxd`` (edited since the last install) is never imported: the process then imports every ``.py`` (the compiled modules depend on each
other's C types, so it is all or none) and warns once; ``pip install -e .`` again rebuilds.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = [
    "COMPILED_MODULES",
    "PURE_PYTHON_ENV",
    "compiled_modules",
    "honour_environment",
    "stale_compiled_modules",
]

COMPILED_MODULES = (
    "adaptive_lb._hdr",
    "adaptive_lb.window",
    "adaptive_lb.stats",
    "adaptive_lb.tracking",
    "adaptive_lb._driver",
)
"""The modules compiled at install when a compiler is present (the request path: the
tracked future's hook, the attempts, the per-host statistics and their window)."""

PURE_PYTHON_ENV = "ADAPTIVE_LB_PURE_PYTHON"
"""Environment variable: ``1`` makes the process import the ``.py`` source of every module,
compiled or not."""


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` file of a module of :data:`COMPILED_MODULES`, ahead of the
    compiled module beside it (the default import order prefers extension modules)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES or not path:
            return None
        name = fullname.rpartition(".")[2]
        for entry in path:
            source = os.path.join(entry, name + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def stale_compiled_modules() -> list[str]:
    """In a source checkout, the compiled modules older than their ``.py`` or ``.pxd``
    file (none in an installed package, whose files all date from the install)."""
    package = os.path.dirname(os.path.abspath(__file__))
    stale: list[str] = []
    if not os.path.exists(os.path.join(os.path.dirname(package), "setup.py")):
        return stale
    for name in COMPILED_MODULES:
        base = os.path.join(package, name.rpartition(".")[2])
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if os.path.exists(base + suffix):
                built = os.path.getmtime(base + suffix)
                sources = [base + ".py", base + ".pxd"]
                if any(os.path.exists(s) and os.path.getmtime(s) > built for s in sources):
                    stale.append(name)
                break
    return stale


def honour_environment() -> None:
    """Install the source finder (once) if :data:`PURE_PYTHON_ENV` asks for it or a
    compiled module is stale. The package's ``__init__`` calls this before importing any of
    its modules."""
    if any(isinstance(finder, _SourceFinder) for finder in sys.meta_path):
        return
    if os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
        stale = stale_compiled_modules()
        if not stale:
            return
        warnings.warn(
            f"adaptive_lb: {', '.join(stale)} compiled before its source was last changed; "
            "running the pure-Python modules (reinstall to rebuild them)",
            RuntimeWarning,
            stacklevel=2,
        )
    sys.meta_path.insert(0, _SourceFinder())


def compiled_modules() -> dict[str, bool]:
    """For each module of :data:`COMPILED_MODULES`: whether this process runs (or would
    import) its compiled form."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = {}
    for name in COMPILED_MODULES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        out[name] = bool(origin and origin.endswith(suffixes))
    return out
