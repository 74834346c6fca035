"""Which tests can see a mutant: the coverage map, one run of the pool of tests under
coverage with one context a test (subprocesses included), split across the test servers,
read into `TestMap`, which orders the tests that run a line the most focused first."""

from __future__ import annotations

import ast
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .config import CONTEXT_ENV, Config
from .server import Server, TestRun

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
