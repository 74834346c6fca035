"""Mutation testing for pagedkv-sql: `make mutate` (docs/mutation.md says how to read it).

Python modules are mutated with cosmic-ray's operators (the subset named in
tools/mutate.toml); SQL with the versioned, hand-written list in tools/sql_mutants.toml.
Each mutant is applied alone to a scratch copy of the tree, and only the tests mapped to
its file run, in the order given, stopping at the first failure. A mutant is killed when
they fail (or time out) and survives when they pass. The report counts both per file.

    python tools/mutate.py                      # the core (`core` in tools/mutate.toml)
    python tools/mutate.py pagedkv_sql/engines  # any files or folders instead
    python tools/mutate.py --list               # show the mutants, run nothing
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import hashlib
import importlib
import json
import os
import queue
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tools" / "mutate.toml"
SQL_MUTANTS = ROOT / "tools" / "sql_mutants.toml"
PRAGMA = "pragma: no mutate"
CONTEXT_ENV = "PAGEDKV_MUTATE_CONTEXT"  # the running test, for coverage in subprocesses
STOP = threading.Event()  # set by SIGINT/SIGTERM: finish the running mutants, then report


def matches(path: str, pattern: str) -> bool:
    """Glob matching part by part: `pagedkv_sql/*.py` is the top-level modules only, and a
    pattern naming a folder matches everything under it."""
    parts, want = path.split("/"), pattern.rstrip("/").split("/")
    if len(parts) > len(want) and "*" not in want[-1] and "." not in want[-1]:
        parts = parts[: len(want)]
    return len(parts) == len(want) and all(map(fnmatch.fnmatch, parts, want))


@dataclass(frozen=True)
class Equivalent:
    """A surviving mutant that cannot be killed: the changed line, before and after."""

    file: str
    before: str
    after: str
    why: str


@dataclass(frozen=True)
class Config:
    core: list[str]
    tests: dict[str, list[str]]  # file pattern -> test paths, most focused first
    operators: list[str]  # cosmic-ray operator names (fnmatch patterns) to apply
    pytest_args: list[str]  # for every run; a mutant's run adds -x
    timeout_factor: float  # a test running over factor x its mapped time (at least the
    timeout_floor: float  # floor, in seconds) hangs: the mutant is killed by timeout
    cap: float  # CPU seconds a mutant's tests may take before its run is cut short
    equivalent_cap: float  # the same for a mutant declared equivalent (a check, not a hunt)
    preload: list[str]
    pool: list[str]  # the tests the coverage map runs (and mutants choose from)
    pool_args: list[str]
    pool_ignore: list[str]  # tiers of their own (their dependencies are not installed)
    equivalents: list[Equivalent]
    # file pattern -> test paths run first for a mutant of what runs at import (a
    # constant, a decorator, an option's default): what `--help` shows, say
    import_tests: dict[str, list[str]] = field(default_factory=dict)
    # file pattern -> test files written for it, run before the other covering tests
    focus: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path = CONFIG) -> Config:
        data = tomllib.loads(path.read_text())
        return cls(
            core=list(data["core"]),
            tests={k: list(v) for k, v in data["tests"].items()},
            operators=list(data["python"]["operators"]),
            pytest_args=list(data["pytest"]["args"]),
            timeout_factor=float(data["pytest"]["timeout_factor"]),
            timeout_floor=float(data["pytest"]["timeout_floor"]),
            cap=float(data["pytest"]["cap"]),
            equivalent_cap=float(data["pytest"]["equivalent_cap"]),
            preload=list(data["pytest"]["preload"]),
            pool=list(data["coverage"]["tests"]),
            pool_args=list(data["coverage"]["args"]),
            pool_ignore=list(data["coverage"].get("ignore", [])),
            equivalents=[Equivalent(**e) for e in data.get("equivalent", [])],
            import_tests={k: list(v) for k, v in data.get("import_tests", {}).items()},
            focus={k: list(v) for k, v in data.get("focus", {}).items()},
        )

    def tests_for(self, file: str) -> list[str]:
        """The test files that can see a bug in an SQL file (coverage cannot look into SQL)."""
        for pattern, tests in self.tests.items():
            if matches(file, pattern):
                return tests
        raise SystemExit(f"mutate: no tests mapped to {file}; add it to [tests] in {CONFIG}")

    def tests_at_import(self, file: str) -> list[str]:
        for pattern, tests in self.import_tests.items():
            if matches(file, pattern):
                return tests
        return []

    def focused(self, file: str, test_file: str) -> bool:
        """Whether `test_file` was written for `file`: listed under [focus] for it, or named
        after the module (`tests/test_spill.py`, `tests/test_spill_*.py` for spill.py)."""
        stem = Path(file).stem
        if fnmatch.fnmatch(Path(test_file).name, f"test_{stem}.py") or fnmatch.fnmatch(
            Path(test_file).name, f"test_{stem}_*.py"
        ):
            return True
        return any(
            fnmatch.fnmatch(test_file, t)
            for pattern, tests in self.focus.items()
            if matches(file, pattern)
            for t in tests
        )

    def equivalent(self, file: str, before: str, after: str) -> str | None:
        for e in self.equivalents:
            if e.file == file and e.before == before and e.after == after:
                return e.why
        return None


@dataclass
class Mutant:
    """One change to one file: `apply` turns the file's text into the mutant's."""

    file: str
    kind: str  # the cosmic-ray operator, or "sql"
    apply: Callable[[str], str] = field(repr=False)
    line: int = 0  # the changed line, its number and text (stripped) before and after
    before: str = ""
    after: str = ""
    why: str | None = None  # why it is equivalent, when it is known to be
    outcome: str = "pending"  # killed | timeout | survived | invalid (not applicable)
    killer: str = ""  # the first failing test
    tests: int = 0  # how many tests it ran
    covering: int = 0  # of how many chosen for it (those that run its line)
    capped: bool = False  # its run was cut short at the CPU cap
    hinted: bool = False  # its past killer (--history) ran first
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def killed(self) -> bool:
        return self.outcome in ("killed", "timeout")

    @property
    def key(self) -> tuple[str, ...]:
        """What names a mutant across runs and small edits elsewhere in its file."""
        return (self.file, self.kind, self.before, self.after)

    def mutate(self, text: str, config: Config) -> str:
        """The mutated text; notes the changed line and whether it is a known equivalent."""
        mutated = self.apply(text)
        self.line, self.before, self.after = changed_line(text, mutated)
        self.why = self.why or config.equivalent(self.file, self.before, self.after)
        return mutated


def changed_line(original: str, mutated: str) -> tuple[int, str, str]:
    """The first line that differs: its number and both versions, stripped."""
    old, new = original.splitlines(), mutated.splitlines()
    for number, (a, b) in enumerate(zip(old, new, strict=False), start=1):
        if a != b:
            return number, a.strip(), b.strip()
    number = min(len(old), len(new)) + 1
    a = old[number - 1].strip() if number <= len(old) else ""
    b = new[number - 1].strip() if number <= len(new) else ""
    return number, a, b


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


# -- which tests: the coverage map ---------------------------------------------------------


def _spans(source: str) -> list[tuple[int, int, str]]:
    """Every statement (and `except` clause) as (first line, last line, kind), innermost
    first for any line: sorted by length."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt | ast.ExceptHandler) and node.end_lineno is not None:
            decorators = getattr(node, "decorator_list", [])  # above `def` or `class`
            first = min([node.lineno, *(d.lineno for d in decorators)])
            spans.append((first, node.end_lineno, type(node).__name__))
    return sorted(spans, key=lambda s: s[1] - s[0])


@dataclass
class TestMap:
    """Which tests run each line of the mutated files (coverage with one context a test,
    subprocesses included) and how long each test took, from one run of the pool."""

    lines: dict[str, dict[int, set[str]]]  # file -> line -> node ids ("" = at import)
    seconds: dict[str, float]  # node id -> seconds (setup + call + teardown)
    spans: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)

    def _tests_on(self, file: str, first: int, last: int) -> set[str]:
        lines = self.lines.get(file, {})
        return set().union(*(tests for n, tests in lines.items() if first <= n <= last))

    def for_line(self, file: str, line: int, tree: Path) -> list[str]:
        """The tests that run the statement holding `line`, the most focused first. A
        statement outside any function runs at import (a constant, a class attribute):
        it takes the tests running the lines that name what it defines, or those of its
        class, or of the whole file. A statement in a function that no test runs gets no
        test: its mutant survives without running anything."""
        if file not in self.spans:
            self.spans[file] = _spans((tree / file).read_text())
        enclosing = [(a, b, kind) for a, b, kind in self.spans[file] if a <= line <= b]
        if not enclosing:
            return []
        first, last, _ = enclosing[0]
        function = next(((a, b) for a, b, k in enclosing if "Function" in k), None)
        if function is None:  # runs at import: who uses what it defines?
            users = self._users(file, first, last, tree)
            if not users:
                users = next(
                    (set(range(a, b + 1)) for a, b, k in enclosing if k == "ClassDef"), set()
                )
            tests = self._tests_on_lines(file, users)
            if tests:
                return self.most_focused_first(tests, file, users)
            return self.quickest_first(set().union(*self.lines.get(file, {}).values()) - {""})
        tests = self._tests_on(file, first, last) - {""}
        return self.most_focused_first(tests, file, set(range(function[0], function[1] + 1)))

    def _users(self, file: str, first: int, last: int, tree: Path) -> set[int]:
        """The lines of `file` outside [first, last] that name what the module-level
        assignment there defines (`INT64_MIN = -(2**63)`: every line using INT64_MIN)."""
        source = (tree / file).read_text()
        names: set[str] = set()
        for node in ast.parse(source).body:
            if node.lineno == first and isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if not names:
            return set()
        used = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
        return {
            number
            for number, text in enumerate(source.splitlines(), start=1)
            if not first <= number <= last and used.search(text)
        }

    def _tests_on_lines(self, file: str, lines: set[int]) -> set[str]:
        by_line = self.lines.get(file, {})
        return set().union(*(by_line.get(n, set()) for n in lines)) - {""}

    def most_focused_first(self, tests: set[str], file: str, lines: set[int]) -> list[str]:
        """The tests that take the rare paths of the function holding the mutant first:
        each test scores, for every line of the function it runs, one over the number of
        tests that run that line, and the score per second of the test orders them. A
        test reaching the one `raise` no other test reaches comes before forty that
        pass through the common path: it is the one that looks at that branch."""
        score = dict.fromkeys(tests, 0.0)
        for number, runs in self.lines.get(file, {}).items():
            if number in lines:
                runs = runs - {""}
                for t in runs & tests:
                    score[t] += 1.0 / len(runs)
        known = [t for t in tests if t in self.seconds]
        return sorted(known, key=lambda t: (-score[t] / (self.seconds[t] + 0.25), t))

    def for_files(self, paths: list[str]) -> list[str]:
        """Every test of the pool under the given test paths (a folder, a file or one test's
        node id, `file::name`, with its parameters), quickest first."""
        tests = {t for t in self.seconds if any(_under(t, p) for p in paths)}
        return self.quickest_first(tests)

    def quickest_first(self, tests: set[str]) -> list[str]:
        """Round robin over the test files, each file's quickest test first: the quickest
        test of every file comes before the second quickest of any, so that a budget
        reaches the focused files (test_boundaries) and not only one file's quick tests."""
        known = sorted((t for t in tests if t in self.seconds), key=lambda t: (self.seconds[t], t))
        rank: dict[str, int] = {}
        order = {}
        for t in known:
            file = t.split("::")[0]
            rank[file] = rank.get(file, -1) + 1
            order[t] = rank[file]
        return sorted(known, key=lambda t: (order[t], self.seconds[t], t))


def _under(test: str, path: str) -> bool:
    """Whether the test `test` (a node id) is `path`'s: under its folder, in its file, or
    the test it names (`file::name` takes `file::name[params]` too)."""
    if "::" in path:
        return test == path or test.startswith(path + "[")
    test_file = test.split("::")[0]
    return test_file == path or test_file.startswith(path.rstrip("/") + "/")


def _pool_shards(tree: Path, pool: list[str], ignore: list[str], n: int) -> list[list[str]]:
    """The pool's test files in n shards of about equal size (by bytes, a fair proxy)."""
    found = {str(f.relative_to(tree)) for p in pool for f in (tree / p).rglob("test_*.py")}
    found |= {p for p in pool if p.endswith(".py")}
    files = sorted(
        (f for f in found if not any(_under(f, i) for i in ignore)),
        key=lambda f: -(tree / f).stat().st_size,
    )
    shards: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for f in files:
        i = sizes.index(min(sizes))
        shards[i].append(f)
        sizes[i] += (tree / f).stat().st_size
    return [s for s in shards if s]


def build_map(servers: list[Server], files: list[str], config: Config, scratch: Path) -> TestMap:
    """Run the pool once under coverage, split across the servers, and read which test ran
    which line of the files to mutate. The tests must pass: a test failing without any
    mutant would kill every mutant it is chosen for; such tests are left out, and named."""
    covdir = scratch / "coverage"
    covdir.mkdir()
    python_files = [f for f in files if f.endswith(".py")]
    shards = _pool_shards(servers[0].tree, config.pool, config.pool_ignore, len(servers))
    args = [*config.pytest_args, *config.pool_args]

    def one(i: int) -> tuple[int, TestRun]:
        server = servers[i]
        rc = scratch / f"coverage{i}.rc"
        include = ", ".join(str(server.tree / f) for f in python_files)
        rc.write_text(
            "[run]\n"
            f"data_file = {covdir}/map.cov\n"
            "parallel = true\n"
            f"include = {include}\n"
            f"context = ${{{CONTEXT_ENV}}}\n"
        )
        job = {"rcfile": str(rc), "durations": str(scratch / f"durations{i}.json")}
        return i, server.run(shards[i], args, timeout=7200, map_job=job)

    seconds: dict[str, float] = {}
    failed: set[str] = set()
    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        for i, run in pool.map(one, range(len(shards))):
            if not (scratch / f"durations{i}.json").exists():
                sys.stderr.write(run.output[-4000:])
                raise SystemExit(f"mutate: the coverage run failed (pytest exit {run.code})")
            info = json.loads((scratch / f"durations{i}.json").read_text())
            seconds.update(info["seconds"])
            failed |= set(info["failed"])
            if run.code not in (0, 1):
                sys.stderr.write(run.output[-4000:])
                raise SystemExit(f"mutate: the coverage run stopped (pytest exit {run.code})")
    if failed:
        print(f"mutate: {len(failed)} test(s) fail without any mutant; left out:", flush=True)
        for name in sorted(failed):
            print(f"  {name}", flush=True)
    for name in failed:
        seconds.pop(name, None)

    import coverage

    combined = coverage.Coverage(data_file=str(covdir / "map.cov"))
    combined.combine([str(covdir)])
    data = combined.get_data()
    lines: dict[str, dict[int, set[str]]] = {}
    trees = [str(s.tree) + "/" for s in servers]
    for measured in data.measured_files():
        rel = next((measured[len(t) :] for t in trees if measured.startswith(t)), None)
        if rel is None:
            continue
        by_line = lines.setdefault(rel, {})
        for number, contexts in data.contexts_by_lineno(measured).items():
            by_line.setdefault(number, set()).update(contexts)
    return TestMap(lines, seconds)


# -- running ------------------------------------------------------------------------------


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [f for f in out.splitlines() if (root / f).is_file()]


def make_tree(root: Path, target: Path, files: Iterable[str]) -> Path:
    """A scratch copy of the tree's files; `../shared` is linked when the source has one,
    so that the tests comparing with Soufflé's answers run there too."""
    for f in files:
        (target / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target / f)
    shared = root.parent / "shared"
    link = target.parent / "shared"
    if shared.is_dir() and not link.exists():
        link.symlink_to(shared)
    return target


@dataclass
class TestRun:
    code: int
    output: str
    seconds: float
    cpu: float
    timed_out: bool
    status: dict[str, Any] = field(default_factory=dict)  # from _Watch: ran, capped, failed


def _fork_and_test(
    tree: str,
    args: list[str],
    timeout: float,
    output: str,
    map_job: dict[str, str] | None,
    watch: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """In the server: run pytest in a forked child, in its own process group."""
    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setsid()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.chdir(tree)
            sys.path.insert(0, tree)
            sys.dont_write_bytecode = True
            os.environ.update(PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
            os.environ.pop("PAGEDKV_DB", None)
            # a temp directory of the tree's own: a mutant of spill.sweep (which removes
            # the spill directories of dead processes found in the temp directory) sees
            # only what its own tests left there, never other processes' directories
            private = f"{tree}.tmp"
            os.makedirs(private, exist_ok=True)
            os.environ["TMPDIR"] = tempfile.tempdir = private
            if map_job is not None:
                code = _map_child(args, map_job["rcfile"], map_job["durations"])
            elif watch is not None:
                code = _watched_child(args, watch)
            else:
                import pytest

                code = int(pytest.main(args))
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    timed_out = False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > timeout:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # whatever the tests left running
    return {
        "code": os.waitstatus_to_exitcode(status),
        "seconds": time.monotonic() - start,
        "cpu": usage.ru_utime + usage.ru_stime,
        "timed_out": timed_out,
    }


class _Contexts:
    """A pytest plugin for the coverage map: each test's lines are recorded under its node
    id (subprocesses started by the test inherit it through the environment), and its
    duration and outcome are noted."""

    def __init__(self, cov: Any) -> None:
        self.cov = cov
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()

    def _switch(self, name: str) -> None:
        os.environ[CONTEXT_ENV] = name
        self.cov.switch_context(name)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self._switch(nodeid)  # before the test's setup

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self._switch("")  # after its teardown

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.add(report.nodeid)


def _map_child(args: list[str], rcfile: str, durations: str) -> int:
    """In the forked child of a map job: pytest under coverage, one context a test."""
    import coverage
    import pytest

    os.environ.update(COVERAGE_PROCESS_START=rcfile, **{CONTEXT_ENV: ""})
    cov = coverage.Coverage(config_file=rcfile)
    cov.start()
    plugin = _Contexts(cov)
    try:
        code = int(pytest.main(args, plugins=[plugin]))
    finally:
        cov.stop()
        cov.save()
    Path(durations).write_text(
        json.dumps({"seconds": plugin.seconds, "failed": sorted(plugin.failed)})
    )
    return code


HANG = 124  # the exit code of a child whose test hung (as timeout(1) says it)


class _Watch:
    """A pytest plugin for a mutant's run: it notes the first failing test, stops the run
    once its CPU time (the child's and its subprocesses') passes the cap, and ends the
    child with HANG when one test runs over its time limit (a loop the mutant made
    endless). A test's limit is in CPU seconds of the child (a busy loop: the same on a
    loaded machine), and four times that in wall seconds (a wait that never ends, on a
    subprocess, say)."""

    def __init__(self, watch: dict[str, Any]) -> None:
        self.limits: dict[str, float] = watch["limits"]
        self.expected: dict[str, float] = watch.get("expected", {})  # CPU s, from the map
        self.next = ""
        self.floor = float(watch["floor"])
        self.cap = float(watch["cap"])
        self.status = Path(watch["status"])
        self.ran = 0
        self.capped = False
        self.failed = ""
        self.current = ""
        self.start = self._cpu()
        signal.signal(signal.SIGALRM, self._hang)
        signal.signal(signal.SIGPROF, self._hang)

    @staticmethod
    def _cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def write(self, **extra: Any) -> None:
        status = {"ran": self.ran, "capped": self.capped, "failed": self.failed, **extra}
        status["cpu"] = self._cpu() - self.start
        self.status.write_text(json.dumps(status))

    def _hang(self, signum: int, frame: Any) -> None:
        with contextlib.suppress(BaseException):
            self.write(hang=self.current)
        os._exit(HANG)

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        self.current = item.nodeid
        self.next = nextitem.nodeid if nextitem is not None else ""
        limit = self.limits.get(item.nodeid, self.floor)
        signal.setitimer(signal.ITIMER_PROF, limit)
        signal.setitimer(signal.ITIMER_REAL, 4 * limit)
        return None

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.ran += 1
        # the cap: stop once it is spent, or before a test expected to run past it
        ahead = self.expected.get(self.next, 0.0)
        if not self.failed and self.next and self._cpu() - self.start + ahead > self.cap:
            self.capped = True
            self.session.shouldstop = "the mutant's CPU cap"

    def pytest_sessionstart(self, session: Any) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and not self.failed:
            self.failed = report.nodeid

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed and not self.failed:
            self.failed = f"collecting {report.nodeid}"


def _watched_child(args: list[str], watch: dict[str, Any]) -> int:
    """In the forked child of a mutant's run: pytest under the _Watch plugin."""
    import pytest

    plugin = _Watch(watch)
    code = int(pytest.main(args, plugins=[plugin]))
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    plugin.write()
    return code


_COMPILED: dict[tuple[str, bytes], Any] = {}  # (path, digest of source) -> code object


_compile_source: Any = None  # the loader's own source_to_code


def _source_to_code(self: Any, data: bytes, path: str, *, _optimize: int = -1) -> Any:
    import hashlib

    key = (str(path), hashlib.blake2b(data, digest_size=16).digest())
    code = _COMPILED.get(key)
    if code is None:
        code = _compile_source(self, data, path, _optimize=_optimize)
        _COMPILED[key] = code
    return code


def _compile_once(tree: Path) -> None:
    """In the server, before it forks: compile every module of the tree once and let each
    child take the code object of any file whose source is unchanged. The child runs with
    no bytecode files (a mutant must never meet a stale .pyc), so without this each child
    recompiled the whole package and the test modules it imports: half its start-up. The
    cache is keyed by the source's digest, so the mutated file (other bytes) is compiled
    afresh. Then the heap so far is frozen: pytest's `gc.collect()` calls at the end of
    each child (its unraisable-exception hook) no longer walk DuckDB's, Arrow's and
    pytest's objects, which nothing frees."""
    import gc
    from importlib.machinery import SourceFileLoader

    if SourceFileLoader.source_to_code is not _source_to_code:
        global _compile_source
        _compile_source = SourceFileLoader.source_to_code
        SourceFileLoader.source_to_code = _source_to_code  # type: ignore[method-assign,assignment]
    loader = SourceFileLoader("warm", "")
    for path in sorted(tree.rglob("*.py")):
        with contextlib.suppress(SyntaxError, ValueError, OSError):
            _source_to_code(loader, path.read_bytes(), str(path))
    gc.collect()
    gc.freeze()


def serve(preload: list[str]) -> None:
    """The test server: import the heavy libraries once, then run one job a line. Ctrl-C
    is for the scheduler (it finishes the running mutants, then reports): the server
    ends when its input does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for name in preload:
        with contextlib.suppress(ImportError):  # an optional test dependency
            importlib.import_module(name)
    warm: set[str] = set()
    for line in sys.stdin:
        job = json.loads(line)
        if job["tree"] not in warm:  # once a tree: compile its modules, freeze the heap
            warm.add(job["tree"])
            _compile_once(Path(job["tree"]))
        reply = _fork_and_test(
            job["tree"],
            job["args"],
            job["timeout"],
            job["output"],
            job.get("map"),
            job.get("watch"),
        )
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Server:
    """Runs pytest for one scratch tree in a child forked from a process that has already
    imported DuckDB, Arrow and pytest: a mutant pays for its tests, not for the imports.
    The package under test is imported in the child only, from the scratch tree."""

    def __init__(self, python: str, tree: Path, preload: list[str]) -> None:
        self.tree = tree
        self.proc = subprocess.Popen(
            [python, __file__, "--serve", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(
        self,
        tests: list[str],
        args: list[str],
        timeout: float,
        map_job: dict[str, str] | None = None,
        watch: dict[str, Any] | None = None,
    ) -> TestRun:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        output = self.tree.parent / f"{self.tree.name}.out"
        status = self.tree.parent / f"{self.tree.name}.status"
        status.unlink(missing_ok=True)
        if watch is not None:
            watch = {**watch, "status": str(status)}
        job = {"tree": str(self.tree), "args": [*args, *tests], "timeout": timeout}
        job.update(output=str(output), map=map_job, watch=watch)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("mutate: the test server died")
        reply = json.loads(line)
        text = output.read_text(errors="replace")
        found = json.loads(status.read_text()) if status.exists() else {}
        return TestRun(
            reply["code"], text, reply["seconds"], reply["cpu"], reply["timed_out"], found
        )

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def statement_name(text: str, line: int) -> str | None:
    """The `-- name:` of the SQL statement holding `line`."""
    for raw in reversed(text.splitlines()[:line]):
        found = re.match(r"--\s*name:\s*(\w+)", raw)
        if found:
            return found.group(1)
    return None


def runs_at_import(source: str, line: int) -> bool:
    """Whether `line` runs when the module is imported: outside any function, or in the
    header of a top-level function or method (its decorators and default values: a
    command's options). Coverage records such lines under no test."""

    def inside(node: ast.AST, top: bool) -> bool | None:
        for child in ast.iter_child_nodes(node):
            first = min(
                [
                    getattr(child, "lineno", 0),
                    *(d.lineno for d in getattr(child, "decorator_list", [])),
                ]
            )
            last = getattr(child, "end_lineno", None)
            if last is None or not first <= line <= last:
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if line < child.body[0].lineno:
                    return top  # the header: run where the def is
                return False
            if isinstance(child, ast.ClassDef):
                return inside(child, top)
            found = inside(child, top)
            return True if found is None else found
        return None

    found = inside(ast.parse(source), True)
    return True if found is None else found


def select(
    m: Mutant, testmap: TestMap, config: Config, tree: Path, killers: dict[tuple[str, ...], str]
) -> list[str]:
    """The tests for one mutant, in the order they run (the run stops at the first failure
    or at the CPU cap). A Python mutant takes the tests that run its statement (coverage):
    the test that killed the same mutant in an earlier run (`--history`) first, then the
    tests written for its module ([focus] in tools/mutate.toml, `tests/test_<module>.py`),
    then the others, each group the most focused first.
    Coverage cannot look into SQL: a mutant of an SQL file runs the test files mapped to
    it in tools/mutate.toml in the order listed, in each the tests that run a Python line
    naming its statement (`statement("explain_resident")`) first, then the file's others,
    quickest first; then the tests naming it in other files (a view is read by name from
    SQL, where coverage cannot follow)."""
    if not m.file.endswith(".sql"):
        covering = testmap.for_line(m.file, m.line, tree)
        focused = [t for t in covering if config.focused(m.file, t.split("::")[0])]
        chosen = set(focused)
        covering = focused + [t for t in covering if t not in chosen]
        at_import = config.tests_at_import(m.file)
        only_at_import = not testmap._tests_on(m.file, m.line, m.line) - {""}
        if at_import and (only_at_import or runs_at_import((tree / m.file).read_text(), m.line)):
            ahead = testmap.for_files(at_import)
            covering = ahead + [t for t in covering if t not in ahead]
    else:
        name = statement_name((tree / m.file).read_text(), m.line)
        first: set[str] = set()
        if name is not None:
            quoted = re.compile(rf"[\"']{re.escape(name)}[\"']")
            for file, lines in testmap.lines.items():
                text = (tree / file).read_text().splitlines()
                for number, runs in lines.items():
                    if number <= len(text) and quoted.search(text[number - 1]):
                        first |= runs - {""}
        covering = []
        for path in config.tests_for(m.file):  # file by file, those naming it first
            mapped = [t for t in testmap.for_files([path]) if t not in covering]
            covering += [t for t in mapped if t in first] + [t for t in mapped if t not in first]
        covering += [t for t in testmap.quickest_first(first) if t not in set(covering)]
    killer = last_killer(killers, m)
    if killer in covering and testmap.seconds.get(str(killer), 0.0) <= _QUICK:
        covering = [killer, *(t for t in covering if t != killer)]
    return covering


# A past killer slower than this (seconds in the coverage run) keeps its place in the order:
# in the window run of 30 Nov two SQL mutants spent 173 and 79 CPU s on one such killer
# (test_plans' comparisons of every plan), where the focused files kill in about one.
_QUICK = 2.0


def stages(tests: list[str], files: int = 2, most: int = 10) -> list[list[str]]:
    """The tests in two runs: the first few (from at most `files` test files), then the
    rest. pytest collects every file it is given before it runs the first test, about
    0.12 CPU s a file: a mutant the first tests kill no longer pays for collecting the
    twenty files its survivor would have run."""
    seen: set[str] = set()
    cut = 0
    for t in tests[:most]:
        seen.add(t.split("::")[0])
        if len(seen) > files:
            break
        cut += 1
    cut = max(cut, 1)
    return [tests[:cut], tests[cut:]] if tests[cut:] else [tests]


def run_mutants(
    mutants: list[Mutant],
    servers: list[Server],
    config: Config,
    testmap: TestMap,
    progress: Callable[[Mutant], None],
    killers: dict[tuple[str, ...], str] | None = None,
    pristine: Path | None = None,
) -> None:
    """Run each mutant in a free server's tree. The original text and the selection are
    read from `pristine`, a copy no mutant is ever written to: with two jobs, the first
    server's tree may hold another thread's mutant of the same file (reading it there
    made double mutants, and restoring that text left a mutant behind in the other tree)."""
    free: queue.Queue[Server] = queue.Queue()
    for s in servers:
        free.put(s)
    killers = killers or {}

    slowest: dict[str, float] = {}  # test file -> its slowest test in the coverage run
    for t, seconds in testmap.seconds.items():
        f = t.split("::")[0]
        slowest[f] = max(slowest.get(f, 0.0), seconds)

    def limit(test: str) -> float:
        """A test's time limit, in CPU seconds: from the slowest test of its file, since a
        mutant's run takes a file's tests in another order than the coverage run, and the
        first to run pays for the file's module-scoped fixtures."""
        mapped = max(testmap.seconds.get(test, 0.0), slowest.get(test.split("::")[0], 0.0))
        return max(config.timeout_floor, config.timeout_factor * mapped)

    def one(m: Mutant) -> Mutant:
        if STOP.is_set():  # Ctrl-C or SIGTERM: the rest stay pending, out of the report
            return m
        # never a server's tree: another thread may have a mutant written into it now
        tree = pristine or servers[0].tree
        original = (tree / m.file).read_text()
        try:
            mutated = m.mutate(original, config)
        except Exception as e:  # cosmic-ray cannot make every mutant it lists
            m.outcome, m.killer = "invalid", f"{type(e).__name__}: {e}"
            return m
        tests = select(m, testmap, config, tree, killers)
        m.covering = len(tests)
        m.hinted = bool(tests) and tests[0] == last_killer(killers, m)
        if not tests:  # no test runs this line: nothing to run, nothing can notice it
            m.outcome = "survived"
            m.killer = "no test runs this line"
            return m
        cap = config.equivalent_cap if m.why else config.cap
        server = free.get()
        target = server.tree / m.file
        try:
            target.write_text(mutated)
            m.outcome = "survived"
            for stage in stages(tests):
                if m.cpu + 0.8 * testmap.seconds.get(stage[0], 0.0) > cap and m.tests:
                    m.capped = True  # the first run spent the cap
                    break
                mapped = [testmap.seconds.get(t, 0.0) for t in stage]
                limits = [limit(t) for t in stage]
                watch = {
                    "limits": dict(zip(stage, limits, strict=True)),
                    "floor": config.timeout_floor,
                    "cap": cap - m.cpu,
                    # a mutant's run takes about 0.8 of a test's time under coverage
                    "expected": {t: 0.8 * testmap.seconds.get(t, 0.0) for t in stage},
                }
                # the backstop, for a hang no signal reaches (inside a C call)
                backstop = 4 * (config.timeout_factor * min(sum(mapped), cap) + max(limits))
                run = server.run(stage, [*config.pytest_args, "-x"], backstop, watch=watch)
                m.seconds += run.seconds
                m.cpu += run.cpu
                m.tests += int(run.status.get("ran", 0))
                if run.timed_out or run.code == HANG:
                    m.outcome, m.killer = "timeout", str(run.status.get("hang", ""))
                    break
                if run.status.get("failed"):
                    m.outcome, m.killer = "killed", str(run.status["failed"])
                    break
                if run.status.get("capped"):
                    m.capped = True
                    break
                if run.code == 5:  # no test ran: the selection is wrong, not the mutant killed
                    m.killer = "no test ran (pytest exit 5): " + run.output[-300:].strip()
                    break
                if run.code != 0:  # the mutant broke pytest itself (an import-time crash)
                    found = _FAILED.search(run.output)
                    m.outcome = "killed"
                    m.killer = found.group(1) if found else f"pytest exit {run.code}"
                    break
        finally:
            target.write_text(original)
            free.put(server)
        return m

    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        for done in as_completed([pool.submit(one, m) for m in mutants]):
            progress(done.result())


# -- report -------------------------------------------------------------------------------


def outcome(m: Mutant) -> dict[str, Any]:
    fields = "file line kind before after outcome killer tests covering capped hinted cpu seconds"
    return {f: getattr(m, f) for f in fields.split()}


def report(
    mutants: list[Mutant], wall: float, cpu: float, jobs: int, commit: str, mapped: float = 0.0
) -> str:
    invalid = [m for m in mutants if m.outcome == "invalid"]
    valid = [m for m in mutants if m.outcome != "invalid"]
    files: dict[str, list[Mutant]] = {}
    for m in valid:
        files.setdefault(m.file, []).append(m)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        f"Mutation report, {when}, commit {commit}: {len(valid)} mutants, "
        f"{wall:.0f} s wall, {cpu:.0f} s CPU, {jobs} job(s).",
    ]
    if mapped and wall > mapped and valid:
        tested = sum(m.cpu for m in valid)
        out.append(
            f"The coverage map took {mapped:.0f} s wall; then {len(valid)} mutants in "
            f"{wall - mapped:.0f} s wall, {60 * len(valid) / (wall - mapped):.1f} mutants a "
            f"minute, {tested / len(valid):.2f} CPU s of tests a mutant."
        )
    out += [
        "",
        "| file | mutants | killed | timeout | survived | of which equivalent | killed % "
        "| of non-equivalent % | test CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def row(name: str, ms: list[Mutant]) -> str:
        killed = sum(m.killed for m in ms)
        hung = sum(m.outcome == "timeout" for m in ms)
        survived = [m for m in ms if not m.killed]
        equivalent = sum(m.why is not None for m in survived)
        ratio = 100.0 * killed / len(ms) if ms else 100.0
        real = len(ms) - equivalent
        of_real = f"{100.0 * killed / real:.1f}" if real else "-"
        return (
            f"| {name} | {len(ms)} | {killed} | {hung} | {len(survived)} | {equivalent} | "
            f"{ratio:.1f} | {of_real} | {sum(m.cpu for m in ms):.0f} |"
        )

    out += [row(f"`{f}`", ms) for f, ms in sorted(files.items())]
    out.append(row("**total**", valid))
    survivors = sorted((m for m in valid if not m.killed), key=lambda m: (m.file, m.line))
    if survivors:
        out += ["", "Survivors:", ""]
        for m in survivors:
            verdict = f"equivalent: {m.why}" if m.why else "**not explained**"
            if m.killer:  # "no test runs this line"
                verdict = f"{m.killer}; {verdict}"
            elif m.capped:
                verdict = (
                    f"cut at the CPU cap: ran {m.tests} of {m.covering} tests "
                    f"in {m.cpu:.0f} CPU s; {verdict}"
                )
            else:
                verdict = f"ran all {m.tests} tests; {verdict}"
            out.append(f"- `{m.file}:{m.line}` {m.kind}: `{m.before}` → `{m.after}` ({verdict})")
    hung = sorted((m for m in valid if m.outcome == "timeout"), key=lambda m: (m.file, m.line))
    if hung:
        out += ["", "Killed by timeout (the test that ran over its limit):", ""]
        out += [
            f"- `{m.file}:{m.line}` {m.kind}: `{m.before}` → `{m.after}` ({m.killer or 'backstop'})"
            for m in hung
        ]
    if invalid:
        out += ["", f"Not counted: {len(invalid)} mutant(s) cosmic-ray listed but could not make:"]
        out += [f"- `{m.file}:{m.line}` {m.kind}: {m.killer}" for m in invalid]
    return "\n".join(out) + "\n"


# -- command line -------------------------------------------------------------------------


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


def read_outcomes(path: Path) -> list[dict[str, Any]]:
    """Outcomes written by --results (one JSON list) or --resume / --history (JSON lines)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def past_killers(path: Path | None) -> dict[tuple[str, ...], str]:
    """The test that last killed each mutant, by its key (file, kind, before, after)."""
    if path is None or not path.exists():
        return {}
    return last_killers(read_outcomes(path))


def last_killers(outcomes: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], str]:
    """The test that killed each mutant last in these outcomes (in order), by its key."""
    killers: dict[tuple[str, ...], str] = {}
    for r in outcomes:
        key = (r["file"], r["kind"], r["before"], r["after"])
        if r["outcome"] in ("killed", "timeout") and "::" in r.get("killer", ""):
            killers[key] = r["killer"]
    return killers


def digest(key: tuple[str, ...]) -> str:
    """A mutant's key (file, kind, before, after) in 16 hex digits: how the versioned
    killers file names it."""
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]


def seed_killers(path: Path | None) -> dict[tuple[str, ...], str]:
    """The versioned last killers (`--killers`, tools/mutate-killers.jsonl): a line a test,
    with the digests of the mutants it killed last. Keyed by `(digest,)`, beside the full
    keys of `--history`, which win (see `last_killer`)."""
    killers: dict[tuple[str, ...], str] = {}
    if path is None or not path.exists():
        return killers
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            killers.update(((d,), r["killer"]) for d in r["mutants"])
    return killers


def last_killer(killers: dict[tuple[str, ...], str], m: Mutant) -> str | None:
    """The test that killed `m` last: from `--history` if it knows, else the killers file."""
    return killers.get(m.key) or killers.get((digest(m.key),))


def save_killers(path: Path, outcomes: list[dict[str, Any]]) -> int:
    """Write the killers file from outcomes: the last killer of each mutant ever killed
    (as `past_killers` reads --history), grouped by test, sorted (a small, stable diff)."""
    last = last_killers(outcomes)
    tests: dict[str, list[str]] = {}
    for known, test in last.items():
        tests.setdefault(test, []).append(digest(known))
    path.write_text(
        "".join(
            json.dumps({"killer": t, "mutants": sorted(ds)}) + "\n"
            for t, ds in sorted(tests.items())
        )
    )
    return len(last)


def report_only(files: list[Path], config: Config) -> str:
    """The report of earlier outcomes: the last outcome of each mutant across `files`,
    only for the mutants that today's code and rules make, with today's equivalents."""
    last: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    for path in files:
        for r in read_outcomes(path):
            last[(r["file"], r["kind"], r["line"], r["after"])] = r
    today = set()
    for m in collect(sorted({f for f, _, _, _ in last}), ROOT, config):
        with contextlib.suppress(Exception):
            m.mutate((ROOT / m.file).read_text(), config)
            today.add((m.file, m.kind, m.line, m.after))
    results = []
    for key, r in last.items():
        if key not in today:
            continue
        m = Mutant(r["file"], r["kind"], lambda text: text, r["line"], r["before"], r["after"])
        for f in ("outcome", "killer", "tests", "covering", "cpu", "seconds"):
            setattr(m, f, r[f])
        m.capped = r.get("capped", False)
        m.why = config.equivalent(m.file, m.before, m.after)
        results.append(m)
    dropped = len(last) - len(results)
    text = report(results, 0.0, sum(m.cpu for m in results), 0, "(from results)")
    return text + (f"\nLeft out: {dropped} outcome(s) of mutants today's code does not make.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: the core)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--python", default=sys.executable, help="runs the tests")
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--pool", nargs="+", help="the tests the map runs (default: the config's)")
    parser.add_argument("--save-map", type=Path, help="write the coverage map to this file")
    parser.add_argument(
        "--map",
        type=Path,
        nargs="+",
        help="reuse saved maps (same code), merged: e.g. the suite's and one of new tests",
    )
    parser.add_argument(
        "--also-map",
        nargs="+",
        default=[],
        help="files or folders whose lines the map records too (for a later --map of them)",
    )
    parser.add_argument(
        "--cap", type=float, help="CPU seconds a mutant's tests may take (default: the config's)"
    )
    parser.add_argument(
        "--history",
        type=Path,
        help="outcomes of earlier runs (JSON lines, appended to): a mutant runs the test "
        "that killed it last time first",
    )
    parser.add_argument(
        "--killers",
        type=Path,
        help="the versioned last killer of each mutant (tools/mutate-killers.jsonl): run "
        "first where --history has none (a fresh clone)",
    )
    parser.add_argument(
        "--save-killers",
        type=Path,
        help="write the killers file from this run's outcomes (or --report-only's files)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        nargs="+",
        help="report --resume files, run nothing: a later file's outcome of a mutant replaces "
        "an earlier one's (a --rerun of survivors after new tests); mutants today's code and "
        "rules no longer make are left out",
    )
    parser.add_argument("--seed", type=int, default=17, help="of the random order")
    parser.add_argument("--sample", type=float, help="run this random share of the mutants")
    parser.add_argument("--only", help="only mutants whose `file:line` matches this regex")
    parser.add_argument("--results", type=Path, help="write every mutant's outcome (JSON)")
    parser.add_argument(
        "--resume", type=Path, help="append each outcome here (JSON lines); skip those in it"
    )
    parser.add_argument(
        "--rerun", type=Path, help="only the mutants that survived in this --results file"
    )
    parser.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0

    config = Config.load()
    if args.report_only:  # the report of --resume files, with today's equivalents
        if args.save_killers:
            outcomes = [r for f in args.report_only for r in read_outcomes(f)]
            saved = save_killers(args.save_killers, outcomes)
            print(f"mutate: {saved} killers saved to {args.save_killers}")
            return 0
        print(report_only(args.report_only, config))
        return 0
    if args.pool:
        config = replace(config, pool=args.pool)
    if args.cap is not None:
        config = replace(config, cap=args.cap)
    files = select_files(args.paths, config, ROOT)
    mutants = collect(files, ROOT, config)
    if args.only:
        mutants = [m for m in mutants if re.search(args.only, f"{m.file}:{m.line}")]
    made = len(mutants)
    if args.sample:  # a seeded random share: an estimate of the whole figure, cheaper
        mutants = random.Random(args.seed).sample(mutants, round(args.sample * len(mutants)))
    if args.resume and args.resume.exists():  # the mutants a stopped run has done
        earlier = {
            (r["file"], r["kind"], r["line"], r["after"]): r for r in read_outcomes(args.resume)
        }
        where = {(f, k, n) for f, k, n, _ in earlier}
        left = []
        for m in mutants:
            if (m.file, m.kind, m.line) not in where:  # no need to make it to know
                left.append(m)
                continue
            with contextlib.suppress(Exception):
                m.mutate((ROOT / m.file).read_text(), config)
            r = earlier.get((m.file, m.kind, m.line, m.after))
            if r is None:
                left.append(m)
            else:
                for f in ("outcome", "killer", "tests", "covering", "cpu", "seconds"):
                    setattr(m, f, r[f])
                m.capped = r.get("capped", False)
        resumed = [m for m in mutants if m not in left]
        mutants = left
    else:
        resumed = []
    if args.rerun:
        survived = {
            (r["file"], r["kind"], r["before"], r["after"])
            for r in read_outcomes(args.rerun)
            if r["outcome"] == "survived"
        }
        keep = []
        texts = {f: (ROOT / f).read_text() for f in {m.file for m in mutants}}
        rows = {f: text.splitlines() for f, text in texts.items()}
        befores = {(f, k, b) for f, k, b, _ in survived}
        for m in mutants:
            line = rows[m.file][m.line - 1].strip() if 0 < m.line <= len(rows[m.file]) else ""
            if m.kind != "sql" and (m.file, m.kind, line) not in befores:
                continue  # not on a survivor's line: no need to make it
            with contextlib.suppress(Exception):
                m.mutate(texts[m.file], config)
            if m.key in survived:
                keep.append(m)
        mutants = keep
    if args.list:
        for m in mutants:
            try:
                m.mutate((ROOT / m.file).read_text(), config)
            except Exception as e:
                m.after = f"(cannot be made: {type(e).__name__})"
            print(f"{m.file}:{m.line} {m.kind}: {m.before} -> {m.after}")
        print(f"{len(mutants)} mutants")
        return 0
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    start, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    mapped = 0.0
    with tempfile.TemporaryDirectory(prefix="pagedkv-mutate-") as tmp:
        scratch = Path(tmp)
        tracked = tracked_files(ROOT)
        servers = [
            Server(args.python, make_tree(ROOT, scratch / f"tree{i}", tracked), config.preload)
            for i in range(args.jobs)
        ]
        try:
            print(
                f"mutate: {len(mutants)} mutants in {len(files)} files; "
                "first the coverage map (the pool of tests, once)",
                flush=True,
            )
            if args.map:
                lines: dict[str, dict[int, set[str]]] = {}
                seconds: dict[str, float] = {}
                for saved in (json.loads(p.read_text()) for p in args.map):
                    for f, by in saved["lines"].items():
                        for n, c in by.items():
                            lines.setdefault(f, {}).setdefault(int(n), set()).update(c)
                    seconds.update(saved["seconds"])
                testmap = TestMap(lines, seconds)
            else:
                also = select_files(args.also_map, config, ROOT) if args.also_map else []
                testmap = build_map(servers, sorted({*files, *also}), config, scratch)
            if args.save_map:
                lines_out = {
                    f: {n: sorted(c) for n, c in by.items()} for f, by in testmap.lines.items()
                }
                args.save_map.write_text(
                    json.dumps({"lines": lines_out, "seconds": testmap.seconds})
                )
            mapped = time.monotonic() - start
            print(f"mutate: map of {len(testmap.seconds)} tests in {mapped:.0f} s", flush=True)
            done = 0

            def progress(m: Mutant) -> None:
                nonlocal done
                if m.outcome == "pending":
                    return
                done += 1
                for keep in {args.resume, args.history} - {None}:
                    if keep is not None:
                        with keep.open("a") as f:
                            f.write(json.dumps(outcome(m)) + "\n")
                if m.outcome in ("survived", "invalid"):
                    cut = f" (cut at the cap after {m.tests} of {m.covering})" if m.capped else ""
                    print(
                        f"[{done}/{len(mutants)}] {m.outcome}{cut}: {m.file}:{m.line} "
                        f"{m.kind}: {m.before} -> {m.after}",
                        flush=True,
                    )
                elif done % 50 == 0:
                    print(f"[{done}/{len(mutants)}] {time.monotonic() - start:.0f} s", flush=True)

            # a seeded random order: the mutants done when a run is stopped are a random
            # sample of all of them, so its figures estimate the whole run's
            random.Random(args.seed).shuffle(mutants)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: STOP.set())
            killers = seed_killers(args.killers) | past_killers(args.history)
            pristine = make_tree(ROOT, scratch / "pristine", tracked)
            run_mutants(mutants, servers, config, testmap, progress, killers, pristine)
        finally:
            for server in servers:
                server.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    mutants = resumed + [m for m in mutants if m.outcome != "pending"]
    if STOP.is_set():
        print(f"mutate: stopped; {len(mutants)} mutants done", flush=True)
    text = report(mutants, time.monotonic() - start, cpu, args.jobs, commit, mapped)
    if args.sample:
        text = f"A random sample of {len(mutants)} of {made} mutants (seed {args.seed}). {text}"
    print(text)
    if args.report:
        args.report.write_text(text)
    if args.results:
        args.results.write_text(json.dumps([outcome(m) for m in mutants], indent=1))
    if args.save_killers:
        saved = save_killers(args.save_killers, [outcome(m) for m in mutants])
        print(f"mutate: {saved} killers saved to {args.save_killers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
