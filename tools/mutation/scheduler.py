"""Running the mutants: the tests chosen for each mutant and their order (its past killer,
the tests written for its module, the most focused, SQL statements by name), the two stages
a mutant's tests run in, and the scheduler that runs each mutant in a free server's tree
and notes its outcome."""

from __future__ import annotations

import ast
import queue
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .config import STOP, Config, Mutant
from .outcomes import last_killer
from .server import HANG, Server
from .testmap import TestMap

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
