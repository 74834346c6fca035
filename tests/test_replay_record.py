"""The recorders' shared skeleton (pagedkv_sql/replay/record.py): wraps on the instance
without changing what the method does, writes the header and one line a non-empty step,
and puts the engine's methods back on close; a safe recorder whose writer stopped (here a
real full device, /dev/full) says it once, puts the methods back and lets the engine go on,
an unsafe one raises. The file's own behaviour: tests/test_replay_record_writer.py. The
engine recorders themselves run against the real vLLM and SGLang in tests/engines/real
(make test-engines) and inside a real server in tests/serving."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay.record import StepRecorder

HEADER = {
    "pagedkv_step_log": 2,
    "engine": "test",
    "block_size": 4,
    "num_gpu_blocks": 8,
    "reserved_blocks": [0],
}
APPEND_A = [{"op": "append", "req": "a", "tokens": 8}]
APPEND_B = [{"op": "append", "req": "b", "tokens": 4}]


class Pool:
    """A stand-in engine object: hands out block ids, one at a time."""

    def __init__(self) -> None:
        self.next = 1

    def alloc(self, n: int, *, tag: str = "") -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


class Recorder(StepRecorder):
    def __init__(self, pool: Pool, path: Any, observe: bool = False, safe: bool = False) -> None:
        self.observe, self.touched = observe, 0
        super().__init__(
            path, engine="test", block_size=4, num_gpu_blocks=8, reserved_blocks=[0], safe=safe
        )
        self._wrap(pool, "alloc", self._alloc)

    def _alloc(self, original: Any, n: int, **kw: Any) -> list[int]:
        ids: list[int] = original(n, **kw)
        self.ops.append({"op": "allocate", "req": kw.get("tag", "r"), "blocks": ids})
        self.ops.append({"op": "append", "req": kw.get("tag", "r"), "tokens": 4 * n})
        self.touched += n
        return ids

    def _observed_step(self) -> dict[str, Any] | None:
        return {"touched": self.touched} if self.observe else None

    def _start_step(self) -> None:
        self.touched = 0


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_wraps_writes_steps_and_unwraps(tmp_path: Path) -> None:
    pool, log = Pool(), tmp_path / "run.jsonl"
    rec = Recorder(pool, log)
    assert rec.flush(10)
    assert log.read_text() == json.dumps(HEADER, separators=(",", ":")) + "\n"  # at once
    assert pool.alloc(2, tag="a") == [1, 2]  # the original's result, arguments passed on
    assert rec.step() == 1
    assert rec.step() == 1  # nothing happened: no line, same step number
    pool.alloc(1, tag="b")
    rec.close()
    assert "alloc" not in vars(pool)  # the class's own method again
    assert pool.alloc(1) == [4]
    assert rec.writer is not None and not rec.writer.alive  # closed
    assert lines(log.read_text()) == [
        HEADER,
        {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1, 2]}, *APPEND_A]},
        {"step": 1, "ops": [{"op": "allocate", "req": "b", "blocks": [3]}, *APPEND_B]},
    ]
    with pagedkv_sql.connect(":memory:") as db:  # and the log is one replay reads
        assert db.replay(log).first is None


def test_observed_counts_per_step_and_a_stream_left_open() -> None:
    pool, out = Pool(), io.StringIO()
    with Recorder(pool, out, observe=True) as rec:
        pool.alloc(2, tag="a")
        rec.step()
        pool.alloc(1, tag="b")
    assert not out.closed  # the caller's stream stays the caller's
    assert "alloc" not in vars(pool)
    steps = lines(out.getvalue())[1:]
    assert [s["observed"] for s in steps] == [{"touched": 2}, {"touched": 1}]


def test_a_safe_recorder_whose_disk_is_full_says_it_once_and_steps_aside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """/dev/full: every write fails with ENOSPC, as on a full disk. The writer says it once;
    the recorder's next step puts the engine's method back; the engine's calls go on."""
    pool = Pool()
    with caplog.at_level("ERROR", logger="pagedkv_sql.record"):
        rec = Recorder(pool, Path("/dev/full"), safe=True)
        rec.flush(10)
        for _ in range(3):
            assert pool.alloc(1) == [pool.next - 1]
            rec.step()
    assert isinstance(rec.failed, OSError) and rec.failed.errno == 28
    assert "alloc" not in vars(pool)  # the engine's own method again
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert "the step recorder stopped before its first step" in said[0]
    assert "/dev/full: No space left on device" in said[0]
    rec.close()


def test_an_unsafe_recorder_raises_its_writers_error_at_the_next_step() -> None:
    pool = Pool()
    rec = Recorder(pool, Path("/dev/full"))
    rec.flush(10)
    pool.alloc(1)
    with pytest.raises(OSError, match="No space left"):
        rec.step()
