"""What every engine's machine shares: coverage counters, memoized checks, the run loop
and its deadline (shrinking included), how a failure is told apart (engine assertion /
refused capture / finding) and the shrunk schedule replayed into a step log, whose replay
is held to the in-memory check's step and idea (pagedkv_sql/invariants.py). The
machine's base (its rules) is fuzz/machine.py's."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .. import invariants
from ..errors import InputError, PagedKVError, UsageError


class EngineAssertion(AssertionError):
    """The engine's own code raised (its assert, its bug): not ours, not an invariant."""


class RefusedCapture(AssertionError):
    """``capture`` could not map a state the engine reached: a bug of pagedkv-sql."""


class FindingFailure(AssertionError):
    """The fast check found an invariant broken: ``checks``, the engine model's checks
    (``diag_engine_*``) of its findings."""

    def __init__(self, message: str, checks: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.checks = checks


class OutOfTime(KeyboardInterrupt):
    """The run's deadline passed (``--time``): raised inside a schedule, it stops
    hypothesis where it is, shrinking included, as Ctrl-C does (an exception hypothesis
    treats as a failure would make the interrupted schedule one)."""


KINDS: dict[type[AssertionError], str] = {
    EngineAssertion: "engine assertion",
    RefusedCapture: "refused capture",
    FindingFailure: "finding",
}

# the counters the CLI always prints, zero or not (a quiet run told from a shallow one)
COVERAGE = ("prefix hits", "preemptions", "evictions")


@dataclass
class Stats:
    """Coverage counters of a run (prefix hits, preemptions, evictions, ...) and the
    memo of checked states: a quiet run can be told from a shallow one."""

    counts: Counter[str] = field(default_factory=Counter)
    seen: set[str] = field(default_factory=set)
    checks: int = 0
    check_seconds: float = 0.0
    engine_seconds: float = 0.0
    examples: int = 0
    keep: int = 0  # keep the first ``keep`` distinct snapshots (a benchmark's sample)
    kept: list[Any] = field(default_factory=list)
    deadline: float | None = None  # perf_counter() past which a schedule stops (OutOfTime)
    calls: list[Call] = field(default_factory=list)  # the schedule running now
    best: Outcome | None = None  # the shortest failure so far (what a deadline reports)

    def failed(self, kind: str, message: str, checks: tuple[str, ...] = ()) -> None:
        """Note the failure of the schedule running now: the shortest of the first
        failure's kind is what the run reports if its deadline stops the shrinking."""
        best = self.best
        if best is None or (kind == best.kind and len(self.calls) <= len(best.calls)):
            self.best = Outcome(self, 0.0, kind, message, list(self.calls), checks=checks)

    def on_time(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfTime

    def line(self) -> str:
        counts = Counter({k: 0 for k in COVERAGE}) + self.counts
        parts = [f"{k} {counts[k]}" for k in sorted(set(counts) | set(COVERAGE))]
        states = self.checks
        unique = len(self.seen)
        repeat = 100.0 * (states - unique) / states if states else 0.0
        return (
            f"{self.examples} examples, {states} states ({unique} distinct, {repeat:.0f}% "
            f"repeat, memoized); " + ", ".join(parts)
        )


def check(capture: Callable[[], Any], stats: Stats) -> None:
    """Capture the state, skip it when its digest was checked already (same digest = same
    result), else run the fast check; raise the failure kind that applies."""
    from ..engines import check_snapshot, digest
    from ..engines.fastcheck import describe

    t0 = time.perf_counter()
    try:
        snapshot = capture()
    except InputError as e:
        stats.failed("refused capture", str(e))
        raise RefusedCapture(f"capture refused a state the engine reached: {e}") from e
    key = digest(snapshot)
    stats.checks += 1
    if key in stats.seen:
        stats.check_seconds += time.perf_counter() - t0
        return
    try:
        findings = check_snapshot(snapshot)
    except PagedKVError as e:
        stats.failed("refused capture", str(e))
        raise RefusedCapture(f"the import refused a captured state: {e}") from e
    stats.check_seconds += time.perf_counter() - t0
    if findings:
        message = describe("the KV cache", findings)
        checks = tuple(dict.fromkeys(f.check for f in findings))
        stats.failed("finding", message, checks)
        raise FindingFailure(message, checks)
    stats.seen.add(key)
    if len(stats.kept) < stats.keep:
        stats.kept.append(snapshot)


def engine_call(stats: Stats, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the engine; any exception out of it is the engine's (an EngineAssertion)."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    except (FindingFailure, RefusedCapture):
        raise  # a check run inside the engine's call (a hook of the machine's): ours
    except Exception as e:
        message = f"{type(e).__name__} in the engine: {e}"
        stats.failed("engine assertion", message)
        raise EngineAssertion(message) from e
    finally:
        stats.engine_seconds += time.perf_counter() - t0


@dataclass(frozen=True)
class Call:
    """One step of a schedule: what it did in words, and the rule with its arguments (so
    that the schedule can be run again, recorded)."""

    text: str
    rule: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Replayed:
    """What ``replay`` finds first in a shrunk schedule's step log: its step, replay's
    check, that check's idea in the catalogue, the request and block it names."""

    step: int
    check: str
    idea: str
    request: str | None
    block_id: int | None


@dataclass
class Outcome:
    """A run's result: None failure when clean; else its kind, message, the in-memory
    checks that failed (``checks``), the shrunk schedule (``cut_short``: the deadline
    stopped the shrinking, this is the shortest failing schedule by then), and once
    ``write_log`` ran, the step log's step that the failing call wrote and what ``replay``
    finds first in the log."""

    stats: Stats
    seconds: float
    kind: str | None = None
    message: str = ""
    calls: list[Call] = field(default_factory=list)
    log_step: int | None = None
    replayed: Replayed | None = None
    unreplayable: str | None = None  # why replay refuses the step log (its KV-cache groups)
    checks: tuple[str, ...] = ()
    cut_short: bool = False
    stopped: str = "time"  # a clean run's bound that ended it: "time" or "examples"
    stored: bool = False  # found by a stored schedule (the engine's STORED), not a draw

    @property
    def schedule(self) -> list[str]:
        return [c.text for c in self.calls]

    @property
    def ideas(self) -> tuple[str, ...]:
        """The ideas (pagedkv_sql/invariants.py) of the in-memory checks that failed."""
        return tuple(
            dict.fromkeys(invariants.idea_of(invariants.ENGINE, c).name for c in self.checks)
        )

    @property
    def same_step(self) -> bool:
        """Whether replay finds its first finding at the step the in-memory check failed."""
        return self.replayed is not None and self.replayed.step == self.log_step

    @property
    def same_idea(self) -> bool:
        """Whether replay's first finding is the in-memory check's idea, or an idea the
        catalogue lists as a cause of it (a double free behind a ref-count mismatch)."""
        if self.replayed is None:
            return False
        ideas = [invariants.BY_NAME[i] for i in self.ideas]
        return any(self.replayed.idea == i.name or self.replayed.idea in i.causes for i in ideas)


def hypothesis_module() -> Any:
    """hypothesis, or the one-line error naming the extra."""
    require("hypothesis", "pip install 'pagedkv-sql[fuzz]'")
    import hypothesis

    return hypothesis


def require(module: str, fix: str) -> None:
    """Import ``module`` (a dependency of the fuzzer: hypothesis, the engine) or raise the
    error naming what to install, never an ImportError's traceback: a UsageError (exit 2),
    as a missing extra is for every other command. When the package is there but a module
    it imports is not (SGLang without torchvision), that module is what the fix names."""
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():  # the engine's own import-time warnings (no CUDA)
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as e:  # ImportError, or an install that breaks at import (torch: OSError)
        top = module.split(".")[0]
        missing = (getattr(e, "name", None) or "").split(".")[0]
        if isinstance(e, ImportError) and missing and missing != top:
            fix = f"{top} is installed but imports {missing}, which is not: pip install {missing}"
        raise UsageError(
            f"pagedkv-sql fuzz needs {module}, which cannot be imported: {e}", hint=fix
        ) from e


# a fuzzed pool: each block is an object of the engine's (vLLM's KVCacheBlock, ~0.9 KB with
# its queues at 10^6 blocks); schedules touch a few dozen blocks
MAX_FUZZ_BLOCKS = 1 << 20


def check_knobs(num_blocks: int, block_size: int) -> None:
    """Refuse, before anything is imported or run, a pool no real engine holds (more than
    2^29 token slots, as import and replay bound pools) or that this machine would spend
    its memory on (more than MAX_FUZZ_BLOCKS blocks), and a block size outside
    1..MAX_BLOCK_SIZE."""
    from ..dbutil import check_block_size
    from ..limits import MAX_POOL_TOKENS

    check_block_size(block_size)
    if num_blocks < 2:
        raise UsageError(f"--pool-blocks must be 2 or more, not {num_blocks}")
    if num_blocks * block_size > MAX_POOL_TOKENS or num_blocks > MAX_FUZZ_BLOCKS:
        raise UsageError(
            f"--pool-blocks {num_blocks:,} of {block_size} token(s) is beyond what is fuzzed: "
            f"at most {MAX_FUZZ_BLOCKS:,} blocks and {MAX_POOL_TOKENS:,} token slots; "
            "nothing was run",
            hint="a schedule touches a few dozen blocks: a small pool finds what a big one "
            "does, faster (the default is 16)",
        )


def run(
    machine: Any,
    examples: int | None,
    steps: int,
    seconds: float,
    seed: int,
    stats: Stats,
    start: float | None = None,
) -> Outcome:
    """Run ``machine`` (a ``machine.base_machine`` subclass) in batches of examples until
    ``examples`` run out (None: never) or ``seconds`` since ``start`` (default: now) pass;
    on a failure hypothesis shrinks it and replays the shortest schedule last, which
    ``machine.last`` then holds. The deadline bounds the shrinking too: past it, the
    shortest failing schedule so far is the outcome, ``cut_short``. A clean outcome's
    ``stopped`` says which bound ended the run."""
    hyp = hypothesis_module()
    from hypothesis.errors import HypothesisException
    from hypothesis.stateful import run_state_machine_as_test

    start = time.perf_counter() if start is None else start
    stats.deadline = start + seconds
    done = 0
    batch = 0
    while (examples is None or done < examples) and time.perf_counter() - start < seconds:
        n = 25 if examples is None else min(25, examples - done)
        the_settings = hyp.settings(
            max_examples=n,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(hyp.HealthCheck),
            print_blob=False,
            report_multiple_bugs=False,
            verbosity=hyp.Verbosity.quiet,  # the outcome says it all, nothing on stdout
        )
        try:
            with _seeded(seed * 1_000_003 + batch):
                run_state_machine_as_test(machine, settings=the_settings)
        except OutOfTime:
            best = stats.best
            if best is None:  # no failure by the deadline: a clean run
                break
            best.seconds, best.cut_short = time.perf_counter() - start, True
            return best
        except AssertionError as e:
            kind = next((k for t, k in KINDS.items() if isinstance(e, t)), "finding")
            checks = e.checks if isinstance(e, FindingFailure) else ()
            return Outcome(
                stats,
                time.perf_counter() - start,
                kind,
                str(e),
                list(machine.last),
                checks=checks,
            )
        except HypothesisException as e:  # Flaky, Unsatisfiable: about the run, not the engine
            raise PagedKVError(
                f"hypothesis could not finish the run: {type(e).__name__}: {e}",
                hint="run again with another --seed; a failure that does not repeat is the "
                "engine's own nondeterminism (threads, time)",
            ) from e
        done += n
        batch += 1
    elapsed = time.perf_counter() - start
    stopped = "time" if examples is None or done < examples else "examples"
    return Outcome(stats, elapsed, stopped=stopped)


def run_stored(make: Callable[[Stats], Any], calls: list[Call], stats: Stats) -> Outcome | None:
    """Run a stored schedule (``(rule, args)`` calls, as hypothesis would) on a fresh
    machine, the invariant after each call; its failure shrunk by dropping one call at a
    time while the schedule still fails the same way, or None when it does not fail."""

    def fails(schedule: list[Call], into: Stats) -> Outcome | None:
        m = make(into)()  # the machine class for these counters, then a fresh machine
        m.start()
        try:
            for call in schedule:
                getattr(m, call.rule)(**call.args)
                m.consistent()
        except AssertionError as e:
            kind = next((k for t, k in KINDS.items() if isinstance(e, t)), "finding")
            checks = e.checks if isinstance(e, FindingFailure) else ()
            return Outcome(into, 0.0, kind, str(e), list(type(m).last), checks=checks)
        return None

    found = fails(calls, stats)
    i = 0
    while found is not None and i < len(found.calls):
        shorter = fails(found.calls[:i] + found.calls[i + 1 :], Stats())
        if shorter is not None and (shorter.kind, shorter.checks) == (found.kind, found.checks):
            found = Outcome(stats, 0.0, shorter.kind, shorter.message, shorter.calls,
                            checks=shorter.checks)  # fmt: skip
        else:
            i += 1
    return found


def fuzz(
    engine: ModuleType,
    examples: int | None,
    steps: int,
    seconds: float,
    seed: int,
    plant: str | None = None,
    num_blocks: int = 16,
    block_size: int = 4,
    chunk: int = 0,
    lookahead: int = 0,
    log: str | os.PathLike[str] | None = None,
    kind: str | None = None,
) -> Outcome:
    """Fuzz an engine (``fuzz.vllm``, ``fuzz.sglang``: its ``machine``, ``planted`` and
    ``REQUIRES``) with these knobs and ``plant`` (one of its PLANTS) patched in, for at
    most ``seconds`` (imports and shrinking included; the step log and its replay after);
    on a failure with ``log``, record the shrunk schedule there as a step log, on a fresh
    machine (its counters apart), and replay it, unless replay refuses such a log (its
    KV-cache groups: ``outcome.unreplayable`` says why). ``kind``: the KV-cache kind of an
    engine that has several (``fuzz.vllm.KINDS``)."""
    check_knobs(num_blocks, block_size)
    start = time.perf_counter()
    hypothesis_module()
    for module, fix in engine.REQUIRES:
        require(module, fix)
    stats = Stats()

    extra = {} if kind is None else {"kind": kind}

    def make(stats: Stats) -> Any:
        return engine.machine(num_blocks, block_size, chunk, lookahead, stats, **extra)

    with engine.planted(plant):
        outcome = None
        knobs = (plant, kind or "full", num_blocks, block_size, chunk, lookahead)
        for schedule in getattr(engine, "STORED", {}).get(knobs, ()):
            calls = [Call(rule, rule, dict(args)) for rule, args in schedule]
            outcome = run_stored(make, calls, stats)
            if outcome is not None:
                outcome.seconds, outcome.stored = time.perf_counter() - start, True
                break
        if outcome is None:
            outcome = run(make(stats), examples, steps, seconds, seed, stats, start)
        if outcome.kind is not None and log is not None:
            write_log(make(Stats()), outcome, log)
            if outcome.unreplayable is None:
                outcome.replayed = replayed(log)
    return outcome


def write_log(machine: Any, outcome: Outcome, path: str | os.PathLike[str]) -> None:
    """Run the shrunk schedule once more on a fresh engine (same knobs, same planted bug)
    with the engine's step-log recorder attached, a step of the log per call, until the
    call that failed; ``outcome.log_step`` is then the log's step that call wrote (None if
    it wrote none, or the failure did not come back). A log replay refuses (the engine's
    KV-cache groups) is not written: ``outcome.unreplayable`` says why."""
    import io

    from .. import paths

    m = machine()
    m.start()
    log = io.StringIO()  # a shrunk schedule's log is small: written whole, or not at all
    why = m.unreplayable()
    if why is not None:
        outcome.unreplayable = why
        return
    with m.recorder(log) as rec:
        for call in outcome.calls:
            try:
                getattr(m, call.rule)(**call.args)
                m.end_step(rec)
                m.consistent()
            except AssertionError:
                m.end_step(rec)
                wrote = rec.step_no > 0
                outcome.log_step = rec.step_no - 1 if wrote else None
                break
    with paths.atomic_output(path) as f:
        f.write(log.getvalue().encode())


def replayed(path: str | os.PathLike[str]) -> Replayed | None:
    """What ``replay`` says first of a step log (its first finding, as the CLI prints it,
    with its idea), or None when it finds nothing (the log does not carry what the failed
    check read)."""
    from ..database import connect
    from ..replay import run

    with connect(":memory:") as db:
        first = run(db, str(path)).first
    if first is None:
        return None
    return Replayed(first.step, first.check, first.invariant, first.request, first.block_id)


class _seeded:
    """Fix the seed hypothesis draws a run's randomness from (its thread-local global
    Random, used when a test has no @seed), so ``--seed`` repeats a run."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __enter__(self) -> None:
        import random

        self._old = getattr(self._home(), "_hypothesis_global_random", None)
        self._home()._hypothesis_global_random = random.Random(self.value)

    def __exit__(self, *exc: object) -> None:
        self._home()._hypothesis_global_random = self._old

    @staticmethod
    def _home() -> Any:
        """Where hypothesis keeps it: a thread-local since 2025, the module itself before
        (the `fuzz` extra's floor, hypothesis 6.100, has the module's)."""
        import hypothesis.core as hc

        return getattr(hc, "threadlocal", hc)
