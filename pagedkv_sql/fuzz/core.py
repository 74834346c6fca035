"""What every engine's machine shares: coverage counters, memoized checks, the run loop
and how a failure is told apart (engine assertion / refused capture / finding)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, PagedKVError


class EngineAssertion(AssertionError):
    """The engine's own code raised (its assert, its bug): not ours, not an invariant."""


class RefusedCapture(AssertionError):
    """``capture`` could not map a state the engine reached: a bug of pagedkv-sql."""


class FindingFailure(AssertionError):
    """The fast check found an invariant broken."""


KINDS: dict[type[AssertionError], str] = {
    EngineAssertion: "engine assertion",
    RefusedCapture: "refused capture",
    FindingFailure: "finding",
}


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

    def line(self) -> str:
        parts = [f"{k} {v}" for k, v in sorted(self.counts.items())]
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

    t0 = time.perf_counter()
    try:
        snapshot = capture()
    except InputError as e:
        raise RefusedCapture(f"capture refused a state the engine reached: {e}") from e
    key = digest(snapshot)
    stats.checks += 1
    if key in stats.seen:
        stats.check_seconds += time.perf_counter() - t0
        return
    try:
        findings = check_snapshot(snapshot)
    except PagedKVError as e:
        raise RefusedCapture(f"the import refused a captured state: {e}") from e
    stats.check_seconds += time.perf_counter() - t0
    if findings:
        raise FindingFailure("\n".join(str(f) for f in findings))
    stats.seen.add(key)


def engine_call(stats: Stats, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the engine; any exception out of it is the engine's (an EngineAssertion)."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    except AssertionError as e:
        raise EngineAssertion(f"{type(e).__name__} in the engine: {e}") from e
    except Exception as e:
        raise EngineAssertion(f"{type(e).__name__} in the engine: {e}") from e
    finally:
        stats.engine_seconds += time.perf_counter() - t0


@dataclass
class Outcome:
    """A run's result: None failure when clean; else its kind, message, shrunk schedule."""

    stats: Stats
    seconds: float
    kind: str | None = None
    message: str = ""
    schedule: list[str] = field(default_factory=list)


def hypothesis_module() -> Any:
    """hypothesis, or the one-line error naming the extra."""
    try:
        import hypothesis
    except ImportError as e:
        from ..errors import UsageError

        raise UsageError("pagedkv-sql fuzz needs hypothesis. Fix: install pagedkv-sql[fuzz]") from e
    return hypothesis


def run(
    machine: Any, examples: int, steps: int, seconds: float, seed: int, stats: Stats
) -> Outcome:
    """Run ``machine`` (a RuleBasedStateMachine class with ``schedule``: the steps of the
    current example) in batches of examples until ``examples`` or ``seconds`` run out;
    on a failure hypothesis shrinks it and replays the shortest schedule last."""
    hyp = hypothesis_module()
    from hypothesis.stateful import run_state_machine_as_test

    start = time.perf_counter()
    done = 0
    batch = 0
    while done < examples and time.perf_counter() - start < seconds:
        n = min(25, examples - done)
        the_settings = hyp.settings(
            max_examples=n,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(hyp.HealthCheck),
            print_blob=False,
            report_multiple_bugs=False,
        )
        try:
            with _seeded(seed * 1_000_003 + batch):
                run_state_machine_as_test(machine, settings=the_settings)
        except AssertionError as e:
            kind = next((k for t, k in KINDS.items() if isinstance(e, t)), "finding")
            return Outcome(stats, time.perf_counter() - start, kind, str(e), list(machine.last))
        done += n
        batch += 1
    return Outcome(stats, time.perf_counter() - start)


class _seeded:
    """Fix the seed hypothesis draws a run's randomness from (its thread-local global
    Random, used when a test has no @seed), so ``--seed`` repeats a run."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __enter__(self) -> None:
        import random

        import hypothesis.core as hc

        self._old = hc.threadlocal._hypothesis_global_random
        hc.threadlocal._hypothesis_global_random = random.Random(self.value)

    def __exit__(self, *exc: object) -> None:
        import hypothesis.core as hc

        hc.threadlocal._hypothesis_global_random = self._old
