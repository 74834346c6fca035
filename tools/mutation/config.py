"""The ground every part of the mutation tool stands on: where the repository is (ROOT,
computed here once from this file's place, tools/mutation/), the configuration read from
tools/mutate.toml (`Config`: the core, the test maps, the operators, the caps and the
declared equivalents), one mutant and its outcome (`Mutant`), and STOP, the one event a
Ctrl-C or SIGTERM sets for every module to see. The entry script is tools/mutate.py."""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "tools" / "mutate.py"  # the entry script: the test server runs it (--serve)
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
