"""Build script: everything is in pyproject.toml but the optional compiled hot path.

The modules listed in ``adaptive_lb/_extensions.py`` are compiled with Cython (their ``.pxd``
files give the C types) when Cython and a C compiler are present. A compile that fails is
reported and skipped: the package then runs its ``.py`` files, with the same behaviour.
``ADAPTIVE_LB_NO_EXTENSIONS=1`` skips the compile.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _warn(message: str) -> None:
    print(f"adaptive-lb: {message}; the pure-Python modules will be used", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: the compiled modules are an optimisation."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers...
            _warn(f"the optional extension could not be built ({exc})")

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"{ext.name} could not be compiled ({exc})")


def extensions() -> list:
    if os.environ.get("ADAPTIVE_LB_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    names = runpy.run_path(str(ROOT / "adaptive_lb" / "_extensions.py"))["COMPILED_MODULES"]
    directives = {
        "language_level": 3,
        # The .py annotations are for type checkers; the C types are in the .pxd files.
        "annotation_typing": False,
        "freethreading_compatible": True,
    }
    built = []
    for name in names:
        source = str(Path(*name.split(".")).with_suffix(".py"))
        try:
            built += cythonize([source], compiler_directives=directives, quiet=True)
        except Exception as exc:
            _warn(f"Cython could not translate {source} ({exc})")
    return built


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
