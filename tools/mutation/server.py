"""Running the tests: the scratch copies of the tree, and the test server, a process that
imports the heavy libraries once and forks a child for each run of pytest (the map's, under
coverage, or a mutant's, watched for a failure, a hang or the CPU cap). `Server` launches it
as the entry script tools/mutate.py with `--serve`; `serve` is what it then runs."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import CONTEXT_ENV, SCRIPT

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
            [python, str(SCRIPT), "--serve", *preload],
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
