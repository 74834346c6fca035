"""How the package's parts connect ("one way to plug in"): the capabilities
(engines, replay, report, spark) reach the database through ``Database.cursor()``, never
through its ``con``; the core imports a capability only inside ``Database``'s one-line
delegations; no import circle, not even through an import inside a function. Read from the
sources (AST), so a new module is covered as soon as it exists."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from .helpers import PACKAGE_PATH, WING

PACKAGE = Path(__file__).resolve().parent.parent / "pagedkv_sql"
CAPABILITIES = ("engines", "replay", "report", "spark", "live", "fuzz", "fleet", "plugins")
# the shell (cli/, a folder the core scan skips) is not the core: it imports every
# capability, inside its commands; nor are the package's lazy names and `python -m`
SHELL = {"__init__.py", "__main__.py"}


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _con_uses(tree: ast.Module) -> list[int]:
    """Lines reading ``X.con`` for any X but a class's own ``self`` (replay/apply_state.py's
    ``State`` keeps the cursor it was given as ``self.con``)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "con"
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]


def test_nothing_outside_database_py_reaches_the_connection() -> None:
    found = {
        name: lines
        for name, tree in _sources()
        if name != "database.py" and (lines := _con_uses(tree))
    }
    assert found == {}, "use Database.cursor() (or a function taking the Database)"


def test_the_scan_sees_a_connection_reached_through_a_database() -> None:
    tree = ast.parse("def f(db):\n    return db.con.sql('x')\n\ndef g(self):\n    self.con\n")
    assert _con_uses(tree) == [2]


def _capability_imports(name: str, tree: ast.Module) -> list[tuple[int, str | None]]:
    """(line, enclosing function) of each import of a capability package by a core module;
    the function is None for a module-level import (a TYPE_CHECKING one is not counted)."""
    found: list[tuple[int, str | None]] = []

    def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name.removeprefix("pagedkv_sql.") for a in node.names]
        if node.level == 0:
            return [(node.module or "").removeprefix("pagedkv_sql.")]
        if node.module:
            return [node.module]
        return [a.name for a in node.names]  # from . import replay

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
            elif isinstance(child, ast.Import | ast.ImportFrom):
                if any(m.split(".")[0] in CAPABILITIES for m in imported(child)):
                    found.append((child.lineno, function))
            else:
                visit(child, function)

    visit(tree, None)
    return found


def test_the_core_imports_a_capability_only_inside_database_delegations() -> None:
    from pagedkv_sql.database import Database
    from pagedkv_sql.delegations import Delegations

    delegations = {
        "load_engine",
        "export_engine",
        "kv_addresses",
        "replay",
        "replay_at",
        "diff",
        "apply",
    }
    assert delegations <= set(vars(Delegations)) and issubclass(Database, Delegations)
    found = {
        (name, line, function)
        for name, tree in _sources()
        if "/" not in name and name not in SHELL
        for line, function in _capability_imports(name, tree)
    }
    assert found
    assert {(n, f) for n, _, f in found if n != "delegations.py" or f not in delegations} == set()


def test_the_import_scan_sees_a_module_level_import() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .replay import X\n"
        "from . import engines\ndef f():\n    from .report import api\n"
    )
    assert _capability_imports("x.py", tree) == [(4, None), (6, "f")]


def _module_imports(name: str, tree: ast.Module, modules: set[str]) -> set[str]:
    """The package's modules a module imports (dotted names), at module level or inside a
    function (an import moved into a function to dodge a circle is still one); a
    TYPE_CHECKING import is not run. ``from . import x`` is the module x when there is
    one, else the package itself (a name of its __init__)."""
    parts = name.removesuffix(".py").split("/")
    package = ["pagedkv_sql", *parts[:-1]]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                subs = {f"{module}.{a.name}" for a in child.names} & modules
                found.update(subs)
                if len(subs) < len(child.names):
                    found.add(module)
            else:
                visit(child)

    visit(tree)
    return found & modules


def _dotted(name: str) -> str:
    return ".".join(["pagedkv_sql", *name.removesuffix(".py").split("/")]).removesuffix(".__init__")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of the graph as a strongly connected component of two modules or
    more (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = {_dotted(name) for name, _ in sources}
    return {_dotted(name): _module_imports(name, tree, modules) for name, tree in sources}


def test_no_import_circle_in_the_package() -> None:
    graph = _graph()
    assert len(graph) > 90 and graph["pagedkv_sql.database"]
    assert _circles(graph) == [], "an import runs back up: move the shared part below both"


def test_the_circle_scan_sees_a_circle_through_a_function_and_a_package() -> None:
    modules = {"pagedkv_sql.engines", "pagedkv_sql.engines.fastcheck", "pagedkv_sql.x"}
    init = ast.parse("from .fastcheck import check_state\n")
    inner = ast.parse("def f():\n    from . import engine\n")
    graph = {
        "pagedkv_sql.engines": _module_imports("engines/__init__.py", init, modules),
        "pagedkv_sql.engines.fastcheck": _module_imports("engines/fastcheck.py", inner, modules),
        "pagedkv_sql.x": _module_imports("x.py", ast.parse("from . import x\n"), modules),
    }
    assert _circles(graph) == [
        ["pagedkv_sql.engines", "pagedkv_sql.engines.fastcheck"],
        ["pagedkv_sql.x"],
    ]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_uses(name: str, tree: ast.Module, modules: set[str]) -> list[str]:
    """``line: module.name`` for each private name (one leading underscore) of another
    module of the package that a module imports (``from .x import _y``) or reads off a
    module it imported (``x._y``). A name a module's neighbours use is its API: public."""
    parts = name.removesuffix(".py").split("/")
    package = ["pagedkv_sql", *parts[:-1]]
    aliases: dict[str, str] = {}  # a local name -> the package's module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module.split(".")[0] != "pagedkv_sql":
                continue
            for a in node.names:
                if f"{module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{module}.{a.name}"
                if _is_private(a.name):
                    found.append(f"{node.lineno}: {module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _is_private(node.attr)
        ):
            found.append(f"{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return sorted(found)


def test_no_private_name_crosses_a_module_of_the_package() -> None:
    sources = _sources()
    modules = {_dotted(name) for name, _ in sources}
    found = {name: uses for name, tree in sources if (uses := _private_uses(name, tree, modules))}
    assert found == {}, "drop the underscore of a name other modules use: it is an API"


def test_the_private_name_scan_sees_imports_and_attributes() -> None:
    modules = {"pagedkv_sql.replay", "pagedkv_sql.replay.header", "pagedkv_sql.paths"}
    tree = ast.parse(
        "from .header import _rid, as_int, __doc__\n"
        "from .. import paths\n"
        "import pagedkv_sql.replay.header as h\n"
        "def f():\n"
        "    return paths._GLOB, paths.MEMORY, h._object, self._own\n"
    )
    assert _private_uses("replay/builder.py", tree, modules) == [
        "1: pagedkv_sql.replay.header._rid",
        "5: pagedkv_sql.paths._GLOB",
        "5: pagedkv_sql.replay.header._object",
    ]


FLOOR = {"__init__", "common", "text", "help"}  # the wing's modules that are not a group


def _imports(path: Path) -> set[str]:
    """The pagedkv_sql modules a module imports, as dotted names (`from . import x` too)."""
    import ast

    package = ".".join(("pagedkv_sql", *path.parent.relative_to(PACKAGE_PATH).parts))
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("pagedkv_sql")}


def test_only_main_imports_the_cli_and_no_group_imports_another() -> None:
    outside = [
        p
        for p in PACKAGE_PATH.rglob("*.py")
        if WING not in p.parents and p.name != "__main__.py"
        if any(m == "pagedkv_sql.cli" or m.startswith("pagedkv_sql.cli.") for m in _imports(p))
    ]
    assert outside == []
    # inside: a group or the floor imports only the floor (`from . import app` would be
    # cli/__init__.py, `from . import core` another group)
    for path in WING.glob("*.py"):
        if path.stem != "__init__":
            names = {m.split(".")[2] for m in _imports(path) if m.startswith("pagedkv_sql.cli.")}
            assert names <= FLOOR - {"__init__"}, path.name


def test_the_core_and_the_cli_import_no_plotting() -> None:
    code = (
        "import sys, pagedkv_sql, pagedkv_sql.cli\n"
        "bad = [m for m in sys.modules if m.startswith(('matplotlib', 'plotly', "
        "'pagedkv_sql.report'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_core_never_imports_the_spark_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pagedkv_sql, pagedkv_sql.database, pagedkv_sql.check; "
        "print(sorted(m for m in sys.modules if m.startswith(('pagedkv_sql.spark', 'pyspark', "
        "'sqlglot'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
