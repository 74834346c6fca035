"""The recorders' shared skeleton (pagedkv_sql/replay/record.py): wraps on the instance
without changing what the method does, writes the header and one line a non-empty step,
and puts the engine's methods back on close. The engine recorders themselves run against
the real vLLM and SGLang in tests/engines/real (make test-engines)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

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
    def __init__(self, pool: Pool, path: Any, observe: bool = False) -> None:
        self.observe, self.touched = observe, 0
        super().__init__(path, engine="test", block_size=4, num_gpu_blocks=8, reserved_blocks=[0])
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
    assert log.read_text() == json.dumps(HEADER, separators=(",", ":")) + "\n"  # at once
    assert pool.alloc(2, tag="a") == [1, 2]  # the original's result, arguments passed on
    assert rec.step() == 1
    assert rec.step() == 1  # nothing happened: no line, same step number
    pool.alloc(1, tag="b")
    rec.close()
    assert "alloc" not in vars(pool)  # the class's own method again
    assert pool.alloc(1) == [4]
    assert rec.out.closed  # a file it opened, it closes
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
