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
import importlib
import json
import os
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tools" / "mutate.toml"
SQL_MUTANTS = ROOT / "tools" / "sql_mutants.toml"
PRAGMA = "pragma: no mutate"


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
    pytest_args: list[str]
    timeout_factor: float
    timeout_floor: float
    preload: list[str]
    equivalents: list[Equivalent]

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
            preload=list(data["pytest"]["preload"]),
            equivalents=[Equivalent(**e) for e in data.get("equivalent", [])],
        )

    def tests_for(self, file: str) -> list[str]:
        for pattern, tests in self.tests.items():
            if matches(file, pattern):
                return tests
        raise SystemExit(f"mutate: no tests mapped to {file}; add it to [tests] in {CONFIG}")

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
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def killed(self) -> bool:
        return self.outcome in ("killed", "timeout")

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
        positions = [p for node in nodes for p in operator.mutation_positions(node)]
        for occurrence, (start, _) in enumerate(positions):
            if any(a <= tuple(start) < b for a, b in spans) or PRAGMA in lines[start[0] - 1]:
                continue

            def apply(text: str, operator: Any = operator, occurrence: int = occurrence) -> str:
                mutated = mutate_code(text, operator, occurrence)
                if mutated is None:
                    raise ValueError("cosmic-ray made no mutation")
                return str(mutated)

            mutants.append(Mutant(file, name.removeprefix("core/"), apply, line=start[0]))
    return mutants


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


def _fork_and_test(tree: str, args: list[str], timeout: float, output: str) -> dict[str, Any]:
    """In the server: run pytest in a forked child, in its own process group."""
    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setsid()
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.chdir(tree)
            sys.path.insert(0, tree)
            sys.dont_write_bytecode = True
            os.environ.update(PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
            os.environ.pop("PAGEDKV_DB", None)
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


def serve(preload: list[str]) -> None:
    """The test server: import the heavy libraries once, then run one job a line."""
    for name in preload:
        importlib.import_module(name)
    for line in sys.stdin:
        job = json.loads(line)
        reply = _fork_and_test(job["tree"], job["args"], job["timeout"], job["output"])
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

    def run(self, tests: list[str], args: list[str], timeout: float) -> TestRun:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        output = self.tree.parent / f"{self.tree.name}.out"
        job = {"tree": str(self.tree), "args": [*args, *tests], "timeout": timeout}
        self.proc.stdin.write(json.dumps({**job, "output": str(output)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("mutate: the test server died")
        reply = json.loads(line)
        text = output.read_text(errors="replace")
        return TestRun(reply["code"], text, reply["seconds"], reply["cpu"], reply["timed_out"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def baseline(server: Server, tests: list[str], args: list[str], junit: Path) -> dict[str, float]:
    """Run every mapped test once on the unmutated tree: they must pass, or every mutant
    would look killed. Returns the seconds each test file took."""
    run = server.run(tests, [*args, f"--junitxml={junit}"], timeout=3600)
    if run.code != 0:
        sys.stderr.write(run.output[-4000:])
        raise SystemExit("mutate: the mapped tests fail without any mutant; fix them first")
    seconds: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        parts = case.get("classname", "").split(".")
        for i in range(len(parts), 0, -1):
            candidate = "/".join(parts[:i]) + ".py"
            if (server.tree / candidate).is_file():
                seconds[candidate] = seconds.get(candidate, 0.0) + float(case.get("time", 0))
                break
    return seconds


def timeout_for(tests: list[str], seconds: dict[str, float], config: Config) -> float:
    total = sum(t for f, t in seconds.items() if any(f.startswith(p) for p in tests))
    return max(config.timeout_floor, config.timeout_factor * total)


def run_mutants(
    mutants: list[Mutant],
    servers: list[Server],
    config: Config,
    seconds: dict[str, float],
    progress: Callable[[Mutant], None],
) -> None:
    free: queue.Queue[Server] = queue.Queue()
    for s in servers:
        free.put(s)

    def one(m: Mutant) -> Mutant:
        server = free.get()
        target = server.tree / m.file
        original = target.read_text()
        tests = config.tests_for(m.file)
        try:
            try:
                target.write_text(m.mutate(original, config))
            except Exception as e:  # cosmic-ray cannot make every mutant it lists
                m.outcome, m.killer = "invalid", f"{type(e).__name__}: {e}"
                return m
            run = server.run(tests, config.pytest_args, timeout_for(tests, seconds, config))
        finally:
            target.write_text(original)
            free.put(server)
        m.seconds, m.cpu = run.seconds, run.cpu
        if run.timed_out:
            m.outcome = "timeout"
        elif run.code == 0:
            m.outcome = "survived"
        elif run.code == 5:  # no test ran: the mapping is wrong, not the mutant killed
            raise SystemExit(f"mutate: no test ran for {m.file}:\n{run.output[-2000:]}")
        else:  # a test failed, or the mutant broke an import (pytest exits 2 to 4)
            m.outcome = "killed"
            found = _FAILED.search(run.output)
            m.killer = found.group(1) if found else f"pytest exit {run.code}"
        return m

    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        for done in as_completed([pool.submit(one, m) for m in mutants]):
            progress(done.result())


# -- report -------------------------------------------------------------------------------


def report(mutants: list[Mutant], wall: float, cpu: float, jobs: int, commit: str) -> str:
    invalid = [m for m in mutants if m.outcome == "invalid"]
    valid = [m for m in mutants if m.outcome != "invalid"]
    files: dict[str, list[Mutant]] = {}
    for m in valid:
        files.setdefault(m.file, []).append(m)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        f"Mutation report, {when}, commit {commit}: {len(valid)} mutants, "
        f"{wall:.0f} s wall, {cpu:.0f} s CPU, {jobs} job(s).",
        "",
        "| file | mutants | killed | survived | of which equivalent | killed % | test CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def row(name: str, ms: list[Mutant]) -> str:
        killed = sum(m.killed for m in ms)
        survived = [m for m in ms if not m.killed]
        equivalent = sum(m.why is not None for m in survived)
        ratio = 100.0 * killed / len(ms) if ms else 100.0
        return (
            f"| {name} | {len(ms)} | {killed} | {len(survived)} | {equivalent} | "
            f"{ratio:.1f} | {sum(m.cpu for m in ms):.0f} |"
        )

    out += [row(f"`{f}`", ms) for f, ms in sorted(files.items())]
    out.append(row("**total**", valid))
    survivors = sorted((m for m in valid if not m.killed), key=lambda m: (m.file, m.line))
    if survivors:
        out += ["", "Survivors:", ""]
        for m in survivors:
            verdict = f"equivalent: {m.why}" if m.why else "**not explained**"
            out.append(f"- `{m.file}:{m.line}` {m.kind}: `{m.before}` → `{m.after}` ({verdict})")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: the core)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--python", default=sys.executable, help="runs the tests")
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0

    config = Config.load()
    files = select_files(args.paths, config, ROOT)
    mutants = collect(files, ROOT, config)
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
    with tempfile.TemporaryDirectory(prefix="pagedkv-mutate-") as tmp:
        scratch = Path(tmp)
        tracked = tracked_files(ROOT)
        servers = [
            Server(args.python, make_tree(ROOT, scratch / f"tree{i}", tracked), config.preload)
            for i in range(args.jobs)
        ]
        try:
            all_tests = sorted({t for f in files for t in config.tests_for(f)})
            print(f"mutate: {len(mutants)} mutants in {len(files)} files; a baseline run first")
            seconds = baseline(servers[0], all_tests, config.pytest_args, scratch / "j.xml")
            done = 0

            def progress(m: Mutant) -> None:
                nonlocal done
                done += 1
                if m.outcome in ("survived", "invalid"):
                    print(
                        f"[{done}/{len(mutants)}] {m.outcome}: {m.file}:{m.line} {m.kind}: "
                        f"{m.before} -> {m.after}",
                        flush=True,
                    )
                elif done % 50 == 0:
                    print(f"[{done}/{len(mutants)}] {time.monotonic() - start:.0f} s", flush=True)

            run_mutants(mutants, servers, config, seconds, progress)
        finally:
            for server in servers:
                server.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    text = report(mutants, time.monotonic() - start, cpu, args.jobs, commit)
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
