"""The shape of the package's imports, read from the source (no module is imported).

* No import cycle among the modules of ``adaptive_lb`` -- counting every import: at module
  level, inside functions and under ``TYPE_CHECKING``, since a cycle of any kind means two
  modules that cannot be understood apart. Importing the package itself
  (``from adaptive_lb import ...``: its public names) is not an edge.
* A module that says it is pure logic ("no driver import", "pure logic" in its docstring)
  reaches no driver module, directly or through the modules it imports.
* A module that says it is pure logic reaches no driver module, and so does every module of
  a package whose ``__init__`` says so.
* The layers drawn in docs/design.md ("Where it lives") are the imports' own: every
  package of the library is in the list, no module imports from a package listed above its
  own, and no module of the library imports a tool (``adaptive_lb.tools``: the simulator,
  the peers, the CLI and its commands).
* Every module's docstring closes with what it may import: its last paragraph has a
  sentence starting "May import" or "Imports" (``Imports attrs and the config only.``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

# The package being tested: the checkout's, or the one installed from a wheel (CI).
_SPEC = importlib.util.find_spec("adaptive_lb")
assert _SPEC is not None and _SPEC.submodule_search_locations
PACKAGE = Path(next(iter(_SPEC.submodule_search_locations))).resolve()
DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"
CONTRIBUTING = DESIGN.parents[1] / "CONTRIBUTING.md"
DRIVER_MODULES = ("cassandra",)
TOOLS = frozenset(("tools",))
"""The tools around the library (second component of their module names: the
``adaptive_lb.tools`` package: the simulator, the peers, the CLI and its commands). Besides
them only ``adaptive_lb.__main__``, which runs the CLI, may import a tool."""
IMPORT_SENTENCE = re.compile(r"\b(?:May import|Imports)\b")
"""What the closing paragraph of a module's docstring says: what the module may import."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name an import statement of ``path`` names, absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> the package's modules it imports, module -> every name it imports)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for name, path in known.items():
        names[name] = imported_names(name, path)
        edges[name] = {n for n in names[name] if n in known and n not in (name, "adaptive_lb")}
    return edges, names


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    edges, _ = import_graph()
    assert len(edges) > 50  # the walk found the package
    assert cycles(edges) == []


def says_pure(path: Path) -> bool:
    """Whether the docstring of ``path`` says it imports no driver module."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return any(phrase in docstring for phrase in ("no driver import", "pure logic"))


def test_pure_modules_reach_no_driver_module():
    edges, names = import_graph()
    known = modules()
    pure_packages = {
        name for name, path in known.items() if path.name == "__init__.py" and says_pure(path)
    }
    pure = [
        name
        for name, path in known.items()
        if says_pure(path) or name.rpartition(".")[0] in pure_packages
    ]
    assert {"adaptive_lb.stats", "adaptive_lb.health"} <= pure_packages
    assert "adaptive_lb.plan.scoring" in pure and "adaptive_lb.health.model" in pure
    for name in pure:
        reached, todo = set(), [name]
        while todo:
            module = todo.pop()
            if module in reached:
                continue
            reached.add(module)
            todo.extend(edges[module])
        driver = sorted(
            f"{module} imports {imported}"
            for module in reached
            for imported in names[module]
            if imported.split(".")[0] in DRIVER_MODULES
        )
        assert driver == [], name


def design_layers() -> list[str]:
    """The packages of the layer drawing of docs/design.md, top first: the first word of
    each line that does not start with a space."""
    block = DESIGN.read_text(encoding="utf-8").split("## Where it lives", 1)[1]
    drawing = block.split("```", 2)[1]
    return [
        line.split()[0].rstrip("/")
        for line in drawing.splitlines()
        if line.strip() and not line.startswith(" ")
    ]


def test_contributing_names_the_packages_of_the_drawing_in_its_order():
    """CONTRIBUTING.md's layout names the library's packages as the drawing does, top first:
    one map, the drawing, which the test below checks against the imports."""
    text = CONTRIBUTING.read_text(encoding="utf-8")
    layout = text.split("## Repository layout", 1)[1].split("```", 2)[1]
    library = layout.split("\n  tools/", 1)[0]  # the lines before the tools
    named = [name for name in re.findall(r"\b([a-z_]+)/(?=\s)", library) if name != "adaptive_lb"]
    assert named == design_layers()


def test_the_layers_of_the_design_are_the_imports():
    edges, _ = import_graph()
    rows = design_layers()
    assert rows[0] == "runtime" and rows[-1] == "core"
    rank = {name: i for i, name in enumerate(rows)}

    def part(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    library = {m for m in edges if part(m) and part(m) not in TOOLS and part(m) != "__main__"}
    # Every module is in a drawn package (a flat module is its own "package": not drawn).
    assert sorted({part(m) for m in library} - set(rank)) == []
    upward = sorted(
        f"{module} imports {imported}"
        for module in library
        for imported in edges[module]
        if part(imported) in rank and rank[part(imported)] < rank[part(module)]
    )
    assert upward == []
    into_tools = sorted(
        f"{module} imports {imported}"
        for module in library
        for imported in edges[module]
        if part(imported) in TOOLS
    )
    assert into_tools == []


def says_what_it_may_import(docstring: str) -> bool:
    """Whether the last paragraph of ``docstring`` has a "May import" / "Imports" sentence."""
    return bool(IMPORT_SENTENCE.search(docstring.strip().split("\n\n")[-1]))


def test_the_import_sentence_is_read_from_the_closing_paragraph():
    assert says_what_it_may_import("What it is.\n\nImports attrs and the config only.")
    assert says_what_it_may_import("What it is.\n\nMay import: the driver; nothing else.")
    assert not says_what_it_may_import("What it is.")
    assert not says_what_it_may_import("Imports attrs only.\n\nWhat it is.")
    assert not says_what_it_may_import("What it is.\n\nNothing imports it before setup.")


def test_every_module_says_what_it_may_import():
    missing = sorted(
        name
        for name, path in modules().items()
        if not says_what_it_may_import(
            ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        )
    )
    assert missing == []
