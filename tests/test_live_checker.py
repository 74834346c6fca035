"""The checker's fast path (live/checker.py `_fast`: a batch applied with set operations)
against its event-by-event walk (`_slow`), the reference: on random streams of stores,
removals, clears, TensorRT-LLM updates and creations, in several scopes and two streams,
with sequence gaps and a late join, both give the same findings (every field), counts,
gaps and state. The fast path is there for speed (docs/benchmarks.md)."""

from __future__ import annotations

import random
from typing import Any

from pagedkv_sql.live.checker import Checker, KVFinding
from pagedkv_sql.live.events import Batch, Cleared, Created, Removed, Stored, Updated


class _Counted(Checker):
    """The checker as it is, counting the batches its fast path took."""

    taken = 0

    def _fast(self, scopes: Any, events: Any) -> bool:
        took = super()._fast(scopes, events)
        _Counted.taken += took and bool(events)
        return took


class _WalkOnly(Checker):
    """The reference: every batch walked event by event."""

    def _fast(self, scopes: Any, events: Any) -> bool:
        return False


_VALUES = (
    ("GPU", "CPU", None),
    (None, 0, 1),
    (None, "rack-1"),
    (None, "me"),
    (None, 0, 4096, 4097),  # 4096 and 4097: ints the interpreter does not share
)


def _scope(rng: random.Random, base: tuple[Any, ...]) -> tuple[Any, ...]:
    """Mostly the batch's scope; now and then one field of it changed."""
    if rng.random() < 0.85:
        return base
    i = rng.randrange(5)
    value = rng.choice(_VALUES[i])
    if isinstance(value, int):
        value = int(str(value))  # a new int object: equal to the base's, not `is` it
    return (*base[:i], value, *base[i + 1 :])


def _event(rng: random.Random, base: tuple[Any, ...], plain: bool) -> Any:
    def h() -> Any:  # few hashes, ints and bytes: repeats, unknowns and re-stores are common
        return rng.choice([rng.randrange(12), bytes([rng.randrange(4)])])

    r = rng.random() * (0.9 if plain else 1.0)
    if r < 0.45:
        e: Any = Stored([h() for _ in range(rng.randrange(3))], rng.choice([None, h()]))
        if rng.random() < 0.1:  # vLLM's group kind: a windowed group's parents are not checked
            e.spec_kind = rng.choice(["full_attention", "sliding_window", "mamba"])
            e.spec_window = 64 if e.spec_kind == "sliding_window" else None
    elif r < 0.9:
        e = Removed([h() for _ in range(rng.randrange(3))])
    elif r < 0.95:
        return Cleared()
    elif r < 0.98:
        return Updated([h()])
    else:
        return Created()
    e.medium, e.group, e.locality, e.ownership, e.window = _scope(rng, base)
    return e


_PLAIN = ("GPU", None, None, None, None)


def _run(cls: type[Checker], seed: int) -> tuple[Any, ...]:
    rng = random.Random(seed)
    plain = rng.random() < 0.7  # only stores and removals: the fast path's case
    found: list[KVFinding] = []
    c = cls()
    if rng.random() < 0.2:
        c.joined_late("src")
    for i in range(rng.randrange(1, 30)):
        base = tuple(rng.choice(v) for v in _VALUES) if rng.random() < 0.5 else _PLAIN
        events = [_event(rng, base, plain) for _ in range(rng.randrange(8))]
        seq = i if rng.random() < 0.95 else i + 2
        found += c.feed("src", Batch(rng.choice(["dp 0", "dp 1"]), seq, 1.0, f"src@{i}", events))
    state = {
        stream: {
            key: (sc.stored, sc.extra, sc.cleared, sc.clear_pos, sc.kind)
            for key, sc in scopes.items()
        }
        for stream, scopes in c._scopes.items()
    }
    return found, c.counts, c.findings, c.events, c.gaps, c.unverifiable, state


def test_fast_path_equals_the_event_by_event_walk() -> None:
    _Counted.taken = 0
    for seed in range(800):
        assert _run(_Counted, seed) == _run(_WalkOnly, seed), f"seed {seed}"
    # the streams do reach the fast path, not only the walk (a hash stored again, common
    # with these few hashes, is counted by the walk)
    assert _Counted.taken > 800


def test_stored_hashes_are_bounded_past_the_cap_forgotten_said_once_and_not_false_findings() -> (
    None
):
    c = Checker(max_hashes=50)
    pos = 0

    def batch(*events: Any) -> list[KVFinding]:
        nonlocal pos
        pos += 1
        return c.feed("pub", Batch("dp 0", pos, None, f"pub#{pos}", list(events)))

    for h in range(0, 60, 6):  # 60 hashes stored, never removed: past the cap
        assert batch(Stored(list(range(h, h + 6)))) == []
    assert c.held < 50 and c.forgotten == 54
    notes = c.take_notes()
    assert notes == [
        "dp 0: more than 50 hashes stored and not removed: 54 forgotten (memory is bounded); "
        "its removals and parents of hashes not seen since are counted unverifiable, not "
        "findings, until its next AllBlocksCleared"
    ]
    assert batch(Removed([1]), Stored([100], parent=2)) == []  # forgotten: not findings
    assert c.unverifiable == 2 and c.take_notes() == []
    assert [f.check for f in batch(Cleared(), Removed([100]))] == ["after_clear"]  # known again
    assert c.held == 0
