"""Which mutants a run makes: cosmic-ray's mutants of the Python modules, for the operators
tools/mutate.toml names (with the duplicates and annotations left out, and each mutant
spliced into the one parse of its file), and the hand-written SQL mutants of
tools/sql_mutants.toml; then the files a command line names and every mutant of them."""

from __future__ import annotations

import ast
import fnmatch
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomllib

from .config import PRAGMA, SQL_MUTANTS, Config, Mutant, matches
from .server import tracked_files

# -- Python mutants (cosmic-ray) ----------------------------------------------------------


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the annotations are. Under `from __future__ import annotations` they are never
    evaluated, so a mutant inside one (`int | None` -> `int & None`) is equivalent."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.arg):
            notes.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        for n in notes:
            if n is not None and n.end_lineno is not None and n.end_col_offset is not None:
                spans.append(((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)))
    return spans


# The comparisons whose negation another configured operator already makes.
_NEGATED = {"==", "!=", "<", "<=", ">", ">=", "is", "is not"}


def duplicate(operator: str, node: Any, index: int) -> bool:
    """A mutant that another one already makes, so counting it twice only inflates the
    figures (docs/mutation.md, "What is not mutated"):

    - AddNot on a condition that is `not x` (ReplaceUnaryOperator_Delete_Not makes `x`)
      or a single comparison `a < b` (the negating comparison operator makes `a >= b`);
    - NumberReplacer's `n - 1` where `n` is not compared: `n + 1` already asks whether
      the value matters. At a comparison both sides of the bound are kept;
    - `show_default=False` made True on an option or argument whose default is None or
      required (`...`): click shows no default for either, so the help is the same
      (checked on typer 0.16 and 0.29 with every such option of cli.py at once).
    """
    if operator == "core/AddNot":
        statement = node.type in ("if_stmt", "while_stmt", "assert_stmt")
        expr = node.children[1] if statement else node.children[2]  # else a ternary
        if expr.type == "not_test":
            return True
        if expr.type == "comparison" and len(expr.children) == 3:
            op = " ".join(expr.children[1].get_code().split())
            return op in _NEGATED
        return False
    if operator == "core/ReplaceFalseWithTrue":
        return _shows_no_default(node)
    if operator == "core/NumberReplacer" and index > 0:
        parent = node.parent
        if parent is not None and parent.type == "factor":  # -1
            parent = parent.parent
        return parent is None or parent.type != "comparison"
    return False


def _shows_no_default(node: Any) -> bool:
    """`typer.Option(None, ..., show_default=False)` or `typer.Argument(..., ...)`."""
    argument = node.parent
    if argument is None or argument.type != "argument":
        return False
    if argument.children[0].get_code().strip() != "show_default":
        return False
    arguments = argument.parent
    if arguments is None or arguments.type != "arglist":
        return False
    return arguments.children[0].get_code().strip() in ("None", "...")


def python_mutants(file: str, tree: Path, config: Config) -> list[Mutant]:
    """cosmic-ray's mutants of one module, for the configured operators only; numbered
    as cosmic-ray's own `init` numbers them (occurrences in a walk of the parse tree)."""
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator, operator_names

    path = tree / file
    source = path.read_text()
    spans = _annotation_spans(source)
    lines = source.splitlines()
    nodes = list(ast_nodes(get_ast_from_path(path)))
    mutants = []
    for name in operator_names():
        if not any(fnmatch.fnmatch(name, p) for p in config.operators):
            continue
        operator = get_operator(name)()
        positions = [
            (node, k, p) for node in nodes for k, p in enumerate(operator.mutation_positions(node))
        ]
        for occurrence, (node, k, (start, _)) in enumerate(positions):
            if any(a <= tuple(start) < b for a, b in spans) or PRAGMA in lines[start[0] - 1]:
                continue
            if duplicate(name, node, k):
                continue

            def apply(
                text: str,
                operator: Any = operator,
                occurrence: int = occurrence,
                node: Any = node,
                k: int = k,
            ) -> str:
                if text == source:  # the parsed text: mutate that tree's node in place
                    return _splice(source, node, operator, k)
                mutated = mutate_code(text, operator, occurrence)
                if mutated is None:
                    raise ValueError("cosmic-ray made no mutation")
                return str(mutated)

            mutants.append(Mutant(file, name.removeprefix("core/"), apply, line=start[0]))
    return mutants


_SPLICE = threading.Lock()  # the parse trees are shared by the scheduler's threads


def _splice(source: str, node: Any, operator: Any, index: int) -> str:
    """The source with one cosmic-ray mutation of `node`, the same text as cosmic-ray's
    `mutate_code` (which parses the whole module again for every mutant: 65 ms each,
    two CPU minutes for the core): the operator changes the node of the one parse in
    place, the node's new text replaces its old span, and the node is restored."""

    def starts(text: str) -> list[int]:
        return [0, *(i + 1 for i, c in enumerate(text) if c == "\n")]

    with _SPLICE:
        saved: list[tuple[Any, Any, Any, Any]] = []
        for n in _subtree(node):
            if hasattr(n, "children"):  # a parso BaseNode, else a Leaf
                saved.append((n, list(n.children), None, None))
            else:
                saved.append((n, None, n.value, n.prefix))
        line_starts = starts(source)
        (a_line, a_col), (b_line, b_col) = node.get_start_pos_of_prefix(), node.end_pos
        try:
            code = str(operator.mutate(node, index).get_code())
        finally:
            for n, children, value, prefix in saved:
                if children is not None:
                    n.children = children
                else:
                    n.value, n.prefix = value, prefix
    a = line_starts[a_line - 1] + a_col
    b = line_starts[b_line - 1] + b_col
    return source[:a] + code + source[b:]


def _subtree(node: Any) -> Iterable[Any]:
    yield node
    for child in getattr(node, "children", ()):
        yield from _subtree(child)


# -- SQL mutants (tools/sql_mutants.toml) -------------------------------------------------


def sql_mutants(files: set[str], tree: Path, path: Path = SQL_MUTANTS) -> list[Mutant]:
    """The listed mutants of `files`. Each `find` must occur exactly once in its file, so
    that a list gone stale (the SQL changed under it) says so instead of testing nothing."""
    mutants, stale = [], []
    for entry in tomllib.loads(path.read_text())["mutant"]:
        file, find, replace = entry["file"], entry["find"], entry["replace"]
        if file not in files:
            continue
        text = (tree / file).read_text()
        if text.count(find) != 1:
            stale.append(f"{file}: {find!r} occurs {text.count(find)} times")
            continue

        def apply(text: str, find: str = find, replace: str = replace) -> str:
            return text.replace(find, replace, 1)

        line = text[: text.index(find)].count("\n") + 1
        mutants.append(Mutant(file, "sql", apply, line=line, why=entry.get("equivalent")))
    if stale:
        raise SystemExit(
            f"mutate: {len(stale)} stale mutant(s) in {path}:\n  " + "\n  ".join(stale)
        )
    return mutants


# -- the files and their mutants ----------------------------------------------------------


def select_files(paths: list[str], config: Config, tree: Path) -> list[str]:
    files = tracked_files(tree)
    patterns = paths or config.core
    chosen = []
    for f in files:
        if not f.endswith((".py", ".sql")):
            continue
        if any(matches(f, p) for p in patterns):
            chosen.append(f)
    if not chosen:
        raise SystemExit(f"mutate: no .py or .sql file matches {' '.join(patterns)}")
    return sorted(chosen)


def collect(files: list[str], tree: Path, config: Config) -> list[Mutant]:
    mutants: list[Mutant] = []
    for f in files:
        if f.endswith(".py"):
            mutants += python_mutants(f, tree, config)
    mutants += sql_mutants({f for f in files if f.endswith((".sql", ".py"))}, tree)
    return mutants
