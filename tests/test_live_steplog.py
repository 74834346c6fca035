"""The incremental step-log check of `watch` (live/steplog.py): window by window, over the
state carried between windows, it finds exactly what `replay` finds over the whole log,
for every planted fault and for random logs, whatever the window; its memory is bounded by
the state, not by the log; an unreadable line, a new header and a restart are handled as
docs/replay.md says."""

from __future__ import annotations

import io
import json
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.live import steplog
from pagedkv_sql.live.steplog import StepLog
from pagedkv_sql.replay import synth

from .steplogs import BLOCKS, HEADER, REQS, op

Finding = tuple[Any, ...]


def _lines(header: dict[str, Any] | None, steps: list[dict[str, Any]]) -> list[bytes]:
    head = [json.dumps(header).encode()] if header is not None else []
    return head + [json.dumps(s).encode() for s in steps]


def whole(lines: list[bytes]) -> list[Finding]:
    """`replay --keep-going` over the whole log."""
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(io.BytesIO(b"\n".join(lines) + b"\n"), keep_going=True)
    return sorted(
        (f.check, f.step, f.event, f.request, f.block_id, f.message) for f in report.findings
    )


def incremental(
    lines: list[bytes], window: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Finding], StepLog]:
    monkeypatch.setattr(steplog, "WINDOW_LINES", window)
    log = StepLog("log.jsonl")
    scratch = duckdb.connect(":memory:")
    found = []
    for number, line in enumerate(lines, start=1):
        log.add(number, line)
    while log.pending:
        found += log.check(scratch)
    return sorted((f.check, f.step, f.event, f.request, f.block_id, f.message) for f in found), log


@pytest.mark.parametrize("fault", list(synth.FAULTS))
def test_every_planted_fault_is_found_as_replay_finds_it_whatever_the_window(
    fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = synth.StepSynthConfig(
        steps=50, num_gpu_blocks=200, max_running=12, observe_every=2, seed=7,
        faults=((fault, 20), ("double_free", 41)),
    )  # fmt: skip
    lines = [synth.header(cfg).to_json().encode()] + [
        json.dumps(s).encode() for s in synth.steps(cfg)
    ]
    expected = whole(lines)
    assert {f[0] for f in expected} >= {fault, "double_free"}
    for window in (3, 17):
        assert incremental(lines, window, monkeypatch)[0] == expected, window


observed = st.builds(
    lambda refs, free: {"ref_cnt": {str(b): n for b, n in refs.items()}, "num_free_blocks": free},
    st.dictionaries(st.sampled_from(BLOCKS), st.integers(0, 3), max_size=3),
    st.integers(0, 16),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    st.lists(st.tuples(st.lists(op, max_size=4), st.none() | observed), min_size=1, max_size=12),
    st.integers(1, 4),
)
def test_random_logs_are_checked_as_replay_checks_them(
    steps: list[tuple[list[Any], Any]], window: int
) -> None:
    arrive = [{"op": "allocate", "req": r, "blocks": []} for r in REQS]
    log = [{"step": 0, "ops": arrive}] + [
        {"step": n, "ops": ops, **({"observed": obs} if obs else {})}
        for n, (ops, obs) in enumerate(steps, start=1)
    ]
    lines = _lines(HEADER, log)
    try:
        expected = whole(lines)
    except InputError:
        assume(False)  # a log replay refuses: its lines are named, not checked
    with pytest.MonkeyPatch.context() as mp:
        assert incremental(lines, window, mp)[0] == expected


def test_a_refcount_mismatch_names_the_last_change_made_windows_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = [
        {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]},
        {"step": 1, "ops": [{"op": "share", "req": "b", "blocks": [1]}]},
        {"step": 2, "ops": [{"op": "release", "req": "b", "blocks": [1]}]},
        {"step": 3, "ops": [{"op": "allocate", "req": "c", "blocks": [2]}]},
        {"step": 4, "ops": [], "observed": {"ref_cnt": {"1": 2}}},
    ]
    lines = _lines(HEADER, steps)
    expected = whole(lines)
    assert [f[5] for f in expected] == [
        "engine reports ref_cnt 2 for block 1, replay has 1 holder(s) "
        "(last changed by request b's release)"
    ]
    assert incremental(lines, 1, monkeypatch)[0] == expected


def test_a_freed_request_named_windows_later_is_named_with_its_free_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = [
        {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]},
        {"step": 3, "ops": [{"op": "free", "req": "a"}]},
        {"step": 4, "ops": [{"op": "allocate", "req": "b", "blocks": [2]}]},
        {"step": 9, "ops": [{"op": "append", "req": "a", "tokens": 2}]},
    ]
    lines = _lines(HEADER, steps)
    expected = whole(lines)
    assert [f[5] for f in expected] == ["request a was freed at step 3 but append names it"]
    assert incremental(lines, 1, monkeypatch)[0] == expected


def test_memory_is_the_state_not_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3,000 requests come and go: the log grows, the state (one live request) does not
    steps = []
    for n in range(3000):
        ops = [{"op": "allocate", "req": f"r{n}", "blocks": [1 + n % 8]}]
        if n:
            ops.insert(0, {"op": "free", "req": f"r{n - 1}"})
        steps.append({"step": n, "ops": ops})
    monkeypatch.setattr(steplog, "MAX_FREED", 100)
    found, log = incremental(_lines(HEADER, steps), 500, monkeypatch)
    assert found == []
    assert not log.pending and log.lines == 3001
    assert len(log.freed) == 100 and log.forgotten == 2899
    assert sum(r.alive for r in log.builder.requests.values()) == 1  # type: ignore[union-attr]
    assert len(log.builder.requests) == 101  # type: ignore[union-attr]
    assert [n for n in log.notes if "forgotten" in n] == [
        "log.jsonl: more than 100 requests freed: the oldest are forgotten (a later "
        "reference to one is read as a new request)"
    ]


def test_an_unreadable_line_ends_the_check_of_its_log_the_lines_before_it_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = [
        {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]},
        {"step": 1, "ops": [{"op": "release", "req": "b", "blocks": [1]}]},  # unknown b
    ]
    lines = [*_lines(HEADER, steps[:1]), b'{"step": 1, "ops": [{"op": "allocate", "req": "b", '
             b'"blocks": [1]}]}', b'{"step": 2, "ops": [{"op": "allo']  # fmt: skip
    log = StepLog("torn.jsonl")
    for number, line in enumerate(lines, start=1):
        log.add(number, line, last=number == len(lines))
    found = log.check(duckdb.connect(":memory:"))
    assert [(f.check, f.step) for f in found] == [("fresh_while_held", 1)]
    assert log.problems == [
        "torn.jsonl:4: malformed JSON: Unterminated string starting at; the last line has no "
        "newline: it was cut off while written (a full disk?); the log is not checked past "
        "this line"
    ]


def test_a_header_after_steps_and_a_restart_each_start_a_new_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = _lines(HEADER, [{"step": 5, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}])
    log = StepLog("s.jsonl")
    for number, line in enumerate(one + one, start=1):
        log.add(number, line)
    log.restart("s.jsonl was truncated; reading it from the start")
    for number, line in enumerate(one, start=1):
        log.add(number, line)
    scratch = duckdb.connect(":memory:")
    while log.pending:
        assert log.check(scratch) == []  # step 5 again, block 1 again: a new log each time
    assert [s.lines for s in log.segments] == [2, 2, 2]
    assert log.notes == [
        "s.jsonl:3: a new step log begins (a header line); checked from its start",
        "s.jsonl was truncated; reading it from the start",
    ]


def test_a_recorders_mark_is_said_once_and_ends_the_check_of_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As replay: the lines before the mark are checked, the mark said as a note (not a
    problem), and what follows it is not read (the fault after it is no finding)."""
    before = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}
    bad = {"step": 1, "ops": [{"op": "allocate", "req": "b", "blocks": [1]}]}
    stopped = {"stopped": "cannot write run.jsonl: No space left on device", "after_step": 1}
    after = {"step": 2, "ops": [{"op": "allocate", "req": "c", "blocks": [1]}]}
    found, log = incremental(_lines(HEADER, [before, bad, stopped, after]), 2, monkeypatch)
    assert [f[0] for f in found] == ["fresh_while_held"]
    assert log.notes == [
        "log.jsonl:4: the log stops after step 1: the recorder stopped (cannot write "
        "run.jsonl: No space left on device); the lines after it are not checked"
    ]
    assert log.problems == []
    # without the mark the step after it is read: block 1 handed out a second time
    unmarked, _ = incremental(_lines(HEADER, [before, bad, after]), 2, monkeypatch)
    assert [f[0] for f in unmarked] == ["fresh_while_held", "fresh_while_held"]
