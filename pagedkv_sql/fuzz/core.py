"""What every engine's machine shares: coverage counters, memoized checks, the machine's
base (schedule, prompts, the checked invariant), the run loop, how a failure is told apart
(engine assertion / refused capture / finding) and the shrunk schedule replayed into a
step log."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TextIO

from ..errors import InputError, PagedKVError, UsageError


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
        raise FindingFailure(describe("the KV cache", findings))
    stats.seen.add(key)
    if len(stats.kept) < stats.keep:
        stats.kept.append(snapshot)


def engine_call(stats: Stats, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the engine; any exception out of it is the engine's (an EngineAssertion)."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise EngineAssertion(f"{type(e).__name__} in the engine: {e}") from e
    finally:
        stats.engine_seconds += time.perf_counter() - t0


@dataclass(frozen=True)
class Call:
    """One step of a schedule: what it did in words, and the rule with its arguments (so
    that the schedule can be run again, recorded)."""

    text: str
    rule: str
    args: dict[str, Any]


@dataclass
class Outcome:
    """A run's result: None failure when clean; else its kind, message, shrunk schedule,
    and once ``write_log`` ran, the step log's step that the failing call wrote and what
    ``replay`` finds in the log."""

    stats: Stats
    seconds: float
    kind: str | None = None
    message: str = ""
    calls: list[Call] = field(default_factory=list)
    log_step: int | None = None
    replayed: tuple[int, str] | None = None  # replay's first finding in the log: step, name

    @property
    def schedule(self) -> list[str]:
        return [c.text for c in self.calls]


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
    its memory on (more than MAX_FUZZ_BLOCKS blocks), and a block size outside 1..256."""
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


def base_machine(stats: Stats, block_size: int, chunk: int) -> Any:
    """The RuleBasedStateMachine every engine's machine subclasses: the rules (a new request
    sharing a random earlier prompt's prefix, a step of prefill chunk or decode, finish,
    preempt, resume, reset the prefix cache), the schedule of the example running now
    (``last``), and the invariant (``capture()`` checked after every step). A subclass
    defines ``start`` (its @initialize: the engine built, then ``begin()``) and what each
    rule does to the engine: ``add``, ``schedule``, ``tokens_left``, ``grow``,
    ``finish_request``, ``preempt_request``, ``reset``; and ``capture``, ``recorder(out)``,
    ``end_step(recorder)``."""
    hypothesis_module()
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    class Machine(RuleBasedStateMachine):
        last: list[Call] = []  # noqa: RUF012  # the example running now, per subclass
        started = False

        def begin(self) -> None:
            stats.examples += 1
            type(self).last = []
            self.running: list[str] = []
            self.waiting: list[str] = []
            self.prompts: list[list[int]] = []
            self.n = 0
            self.started = True

        def _log(self, text: str, rule: str, **args: Any) -> None:
            type(self).last.append(Call(text, rule, args))

        def todo(self, rid: str) -> int:
            """The tokens the request's next step computes: the rest of its prompt (at
            most a chunk), or the token sampled last."""
            left = int(self.tokens_left(rid))
            return min(chunk, left) if chunk else left

        # -- what a subclass does to its engine ----------------------------------------------
        def add(self, rid: str, prompt: list[int]) -> None:
            raise NotImplementedError

        def schedule(self, rid: str) -> bool:
            raise NotImplementedError

        def tokens_left(self, rid: str) -> int:
            raise NotImplementedError

        def grow(self, rid: str, todo: int) -> bool:
            raise NotImplementedError

        def finish_request(self, rid: str) -> None:
            raise NotImplementedError

        def preempt_request(self, rid: str) -> None:
            raise NotImplementedError

        def reset(self) -> bool:
            raise NotImplementedError

        def capture(self) -> Any:
            raise NotImplementedError

        def recorder(self, out: TextIO) -> Any:
            raise NotImplementedError

        def end_step(self, recorder: Any) -> None:
            recorder.step()

        # -- the rules -----------------------------------------------------------------------
        @rule(share=st.integers(0, 64), extra=st.integers(1, 3 * block_size))
        def new_request(self, share: int, extra: int) -> None:
            """A prompt of the first ``share`` tokens of an earlier one (picked by
            ``share`` too), then ``extra`` tokens no prompt had."""
            base = self.prompts[share % len(self.prompts)] if self.prompts and share else []
            prompt = base[:share] + [1000 + self.n * 50 + i for i in range(extra)]
            rid = f"r{self.n}"
            self.n += 1
            self.prompts.append(prompt)
            shared = min(share, len(base))
            self._log(
                f"new {rid} prompt {len(prompt)} tokens sharing {shared}",
                "new_request",
                share=share,
                extra=extra,
            )
            self.add(rid, prompt)
            (self.running if self.schedule(rid) else self.waiting).append(rid)

        @rule(pick=st.integers(0, 63))
        def step(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running[pick % len(self.running)]
            todo = self.todo(rid)
            self._log(f"step {rid} ({todo} tokens)", "step", pick=pick)
            if self.grow(rid, todo):
                stats.counts["decodes" if todo == 1 else "prefill chunks"] += 1

        @rule(pick=st.integers(0, 63))
        def finish(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"finish {rid}", "finish", pick=pick)
            self.finish_request(rid)
            stats.counts["finished"] += 1

        @rule(pick=st.integers(0, 63))
        def preempt(self, pick: int) -> None:
            if not self.running:
                return
            rid = self.running.pop(pick % len(self.running))
            self._log(f"preempt {rid}", "preempt", pick=pick)
            self.preempt_request(rid)
            self.waiting.append(rid)
            stats.counts["preemptions"] += 1

        @rule(pick=st.integers(0, 63))
        def resume(self, pick: int) -> None:
            if not self.waiting:
                return
            rid = self.waiting[pick % len(self.waiting)]
            self._log(f"resume {rid}", "resume", pick=pick)
            if self.schedule(rid):
                self.waiting.remove(rid)
                self.running.append(rid)
                stats.counts["resumed"] += 1

        @rule(when=st.integers(0, 7))
        def reset_prefix_cache(self, when: int) -> None:
            if when or self.running:
                return  # rarely, and while nothing runs (both engines refuse then)
            self._log("reset prefix cache", "reset_prefix_cache", when=when)
            if self.reset():
                stats.counts["prefix cache resets"] += 1

        @invariant()
        def consistent(self) -> None:
            if self.started:
                check(self.capture, stats)

    return Machine


def run(
    machine: Any, examples: int, steps: int, seconds: float, seed: int, stats: Stats
) -> Outcome:
    """Run ``machine`` (a ``base_machine`` subclass) in batches of examples until
    ``examples`` or ``seconds`` run out; on a failure hypothesis shrinks it and replays the
    shortest schedule last, which ``machine.last`` then holds."""
    hyp = hypothesis_module()
    from hypothesis.errors import HypothesisException
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
        except HypothesisException as e:  # Flaky, Unsatisfiable: about the run, not the engine
            raise PagedKVError(
                f"hypothesis could not finish the run: {type(e).__name__}: {e}",
                hint="run again with another --seed; a failure that does not repeat is the "
                "engine's own nondeterminism (threads, time)",
            ) from e
        done += n
        batch += 1
    return Outcome(stats, time.perf_counter() - start)


def fuzz(
    engine: ModuleType,
    examples: int,
    steps: int,
    seconds: float,
    seed: int,
    plant: str | None = None,
    num_blocks: int = 16,
    block_size: int = 4,
    chunk: int = 0,
    lookahead: int = 0,
    log: str | os.PathLike[str] | None = None,
) -> Outcome:
    """Fuzz an engine (``fuzz.vllm``, ``fuzz.sglang``: its ``machine``, ``planted`` and
    ``REQUIRES``) with these knobs and ``plant`` (one of its PLANTS) patched in; on a
    failure with ``log``, record the shrunk schedule there as a step log, on a fresh
    machine (its counters apart)."""
    check_knobs(num_blocks, block_size)
    hypothesis_module()
    for module, fix in engine.REQUIRES:
        require(module, fix)
    stats = Stats()

    def make(stats: Stats) -> Any:
        return engine.machine(num_blocks, block_size, chunk, lookahead, stats)

    with engine.planted(plant):
        outcome = run(make(stats), examples, steps, seconds, seed, stats)
        if outcome.kind is not None and log is not None:
            write_log(make(Stats()), outcome, log)
            outcome.replayed = replayed(log)
    return outcome


def write_log(machine: Any, outcome: Outcome, path: str | os.PathLike[str]) -> None:
    """Run the shrunk schedule once more on a fresh engine (same knobs, same planted bug)
    with the engine's step-log recorder attached, a step of the log per call, until the
    call that failed; ``outcome.log_step`` is then the log's step that call wrote (None if
    it wrote none, or the failure did not come back)."""
    import io

    from .. import paths

    m = machine()
    m.start()
    log = io.StringIO()  # a shrunk schedule's log is small: written whole, or not at all
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


def replayed(path: str | os.PathLike[str]) -> tuple[int, str] | None:
    """What ``replay`` says of a step log: its first finding's step and invariant, or None
    when it finds nothing (the log does not carry what the failed check read)."""
    from ..database import connect
    from ..replay import run

    with connect(":memory:") as db:
        report = run(db, str(path))
    if not report.findings:
        return None
    first = min(report.findings, key=lambda f: f.step)
    return first.step, first.invariant


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
