"""The fast engine check (engines/fastcheck.py) against the SQL views it mirrors: on
random engine states, and on random vLLM and SGLang snapshots, both give the
same findings, check name, reason text, request ids and block id alike. The SQL views are
the reference."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, check_snapshot, check_state, digest, engine
from pagedkv_sql.engines.fastcheck import Finding, check_sql
from pagedkv_sql.engines.tables import (
    EngineState,
    Pool,
    create_schema,
    create_views,
    table,
    write_engine_tables,
)

EXAMPLES = 200  # random engine states a run (the figure docs/benchmarks.md quotes)

block = st.integers(-2, 13)
maybe = st.one_of(st.none(), st.integers(-1, 3))
hashes = st.sampled_from(["aa00", "bb11", "cc22", "aa00aa00aa00aa00aa00ff"])


@st.composite
def states(draw: Any) -> EngineState:
    """Any engine state the tables can hold: duplicates, holes, NULLs, negative ids, seq
    ids with no request, pools of every tier, every optional table present or not."""
    b = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(0, 4))
    ids = [draw(st.sampled_from(["r0", "r1", "r2", "req x"])) for _ in range(n)]
    seqs = list(range(n)) + draw(st.lists(st.integers(0, 3), max_size=1))  # a seq twice
    ids += [draw(st.sampled_from(["r0", "r9"])) for _ in seqs[n:]]
    seq = st.integers(0, n + 1)  # n, n + 1: block lists of no request
    pools = [
        Pool(
            pid,
            f"pool{pid}",
            draw(st.sampled_from(["gpu", "gpu", "cpu", "disk"])),
            num_blocks=draw(st.one_of(st.none(), st.integers(0, 12))),
            free_count=draw(st.one_of(st.none(), st.integers(0, 6))),
        )
        for pid in range(draw(st.integers(1, 2)))
    ]
    pool = st.integers(0, len(pools) - 1)
    bt = draw(
        st.lists(
            st.tuples(seq, st.integers(0, 1), st.integers(0, 4), pool, st.one_of(st.none(), block)),
            max_size=14,
        )
    )
    blocks = draw(
        st.lists(
            st.tuples(pool, block, maybe, st.one_of(st.none(), hashes), maybe, st.booleans()),
            max_size=14,
        )
    )
    # blocks and request hashes that meet the holds, so that the joins find pairs
    listed = [r for r in bt if r[4] is not None]
    for r in draw(st.lists(st.sampled_from(listed), max_size=4)) if listed else []:
        blocks.append((r[3], r[4], draw(maybe), draw(hashes), draw(maybe), False))
    free = draw(st.one_of(st.none(), st.lists(st.tuples(pool, block), max_size=10)))
    slots = draw(st.lists(st.tuples(seq, st.integers(0, 20), st.integers(-20, 60)), max_size=8))
    csr = draw(
        st.lists(
            st.tuples(seq, st.integers(-1, 6), st.integers(-1, 6), st.integers(-1, 17)),
            max_size=4,
        )
    )
    req_hashes = draw(
        st.lists(
            st.tuples(seq, st.integers(0, 1), st.integers(0, 4), st.one_of(st.none(), hashes)),
            max_size=10,
        )
    )
    for r in draw(st.lists(st.sampled_from(listed), max_size=4)) if listed else []:
        req_hashes.append((r[0], r[1], r[2], draw(st.one_of(st.none(), hashes))))
    info = {"tree_pages": "recorded"} if draw(st.booleans()) else {}
    kinds = st.sampled_from(
        [None, "full_attention", "sliding_window", "chunked_local_attention", "mamba"]
    )
    groups = draw(
        st.lists(
            st.tuples(
                st.integers(0, 2),
                kinds,
                st.sampled_from([1, 2, 4, 16]),
                st.one_of(st.none(), st.integers(1, 9)),
                st.booleans(),
            ),
            max_size=3,
        )
    )
    tokens = [draw(st.integers(0, 20)) for _ in seqs]
    computed = [draw(st.one_of(st.none(), st.integers(0, 20))) for _ in seqs]

    def cols(rows: list[tuple[Any, ...]], *names: str) -> dict[str, list[Any]]:
        return {name: [r[i] for r in rows] for i, name in enumerate(names)}

    return EngineState(
        "test",
        b,
        table(
            "engine_request",
            seq_id=seqs,
            request_id=ids,
            num_tokens=tokens,
            num_computed_tokens=computed,
        ),
        table(
            "engine_block_table",
            **cols(bt, "seq_id", "group_id", "block_index", "pool_id", "block_id"),
        ),
        pools,
        blocks=table(
            "engine_block",
            **cols(blocks, "pool_id", "block_id", "ref_cnt", "block_hash", "lock_ref", "is_null"),
        ),
        free_blocks=None
        if free is None
        else table(
            "engine_free_block",
            pool_id=[f[0] for f in free],
            position=draw(st.permutations(range(len(free)))),
            block_id=[f[1] for f in free],
        ),
        token_slots=table("engine_token_slot", **cols(slots, "seq_id", "token_pos", "slot"))
        if slots
        else None,
        csr_rows=table(
            "engine_csr_row",
            **cols(csr, "seq_id", "indptr_begin", "indptr_end", "last_page_len"),
        )
        if csr
        else None,
        request_hashes=table(
            "engine_request_hash",
            **cols(req_hashes, "seq_id", "group_id", "block_index", "block_hash"),
        )
        if req_hashes
        else None,
        kv_groups=table(
            "engine_kv_group",
            **cols(groups, "group_id", "kind", "block_size", "window_tokens", "is_primary"),
            layers=[[] for _ in groups],
        )
        if groups
        else None,
        info=info,
    )


@contextmanager
def sql_reference() -> Iterator[Any]:
    """A database whose engine tables take one state after another: the SQL findings."""
    with pagedkv_sql.connect(":memory:") as db:
        create_schema(db.con)

        def findings(state: EngineState) -> list[Finding]:
            write_engine_tables(db.con, state, "random")
            create_views(db.con)  # once: later calls find this version's views there
            return check_sql(db.con)

        yield findings


def test_fast_check_equals_the_views_on_random_states() -> None:
    seen: dict[str, int] = {}
    with sql_reference() as sql:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(states())
        def same(state: EngineState) -> None:
            expected = sql(state)
            note(f"SQL: {[str(f) for f in expected]}")
            assert check_state(state) == expected
            for f in expected:
                seen[f.check] = seen.get(f.check, 0) + 1

        same()
    # the random states reach every check (a differential test of silent checks proves
    # nothing)
    from pagedkv_sql.engines.fastcheck import CHECKS

    missing = {f"diag_engine_{c.__name__}" for c in CHECKS} - set(seen)
    assert not missing, (missing, seen)


def test_the_checks_are_the_views() -> None:
    """One function a view, the same names, and the one-query view lists every view."""
    from pagedkv_sql.engines.fastcheck import CHECKS
    from pagedkv_sql.sqlfiles import statements_in

    views = [s.name for s in statements_in("engines.sql") if s.name.startswith("diag_engine_")]
    assert [f"diag_engine_{c.__name__}" for c in CHECKS] == views
    union = next(s.sql for s in statements_in("engines.sql") if s.name == "engine_view_findings")
    assert [v for v in views if f"FROM {v}\n" in union or f"FROM {v};" in union] == views


# -- random vLLM and SGLang snapshots, through each engine's to_state ----------------------
@st.composite
def vllm_snapshots(draw: Any) -> Snapshot:
    num_blocks = draw(st.integers(2, 12))
    rows = draw(st.integers(0, 4))
    width = draw(st.integers(1, 4))
    lists = [draw(st.lists(st.integers(0, num_blocks - 1), max_size=width)) for _ in range(rows)]
    table_ = np.zeros((rows, width), dtype=np.int32)
    for r, ids in enumerate(lists):
        table_[r, : len(ids)] = ids
    bs = draw(st.sampled_from([1, 4, 16]))
    arrays: dict[str, Any] = {
        "block_table": table_,
        "num_blocks_per_row": np.array([len(x) for x in lists], dtype=np.int32),
        "num_tokens": np.array([draw(st.integers(0, len(x) * bs)) for x in lists], dtype=np.int64),
        "ref_cnt": np.array([draw(st.integers(-1, 3)) for _ in range(num_blocks)], dtype=np.int32),
        "free_block_queue": np.array(
            draw(st.lists(st.integers(0, num_blocks + 1), max_size=num_blocks)), dtype=np.int32
        ),
    }
    names = [f"r{i}" for i in range(rows)]
    meta: dict[str, Any] = {
        "block_size": bs,
        "request_ids": names,
        "num_blocks": num_blocks,
        "num_free_blocks": draw(st.integers(0, num_blocks)),
        "block_hashes": {
            str(b): draw(hashes) for b in draw(st.sets(st.integers(0, num_blocks - 1)))
        },
        "request_block_hashes": [
            [draw(st.lists(st.one_of(st.none(), hashes), max_size=len(x))) for x in lists]
        ],
    }
    return Snapshot("vllm", arrays, meta)


@st.composite
def sglang_snapshots(draw: Any) -> Snapshot:
    page = draw(st.sampled_from([1, 2, 4]))
    num_pages = draw(st.integers(1, 8))
    slots = (num_pages + 1) * page
    rows = draw(st.integers(0, 3))
    width = draw(st.integers(0, 10))
    rtt = np.array(
        [[draw(st.integers(0, slots - 1)) for _ in range(width)] for _ in range(rows)],
        dtype=np.int32,
    ).reshape(rows, width)
    tree = draw(st.lists(st.integers(0, num_pages), max_size=num_pages))
    arrays: dict[str, Any] = {
        "req_to_token": rtt,
        "seq_lens": np.array([draw(st.integers(0, width)) for _ in range(rows)], dtype=np.int64),
        "free_pages": np.array(
            draw(st.lists(st.integers(0, num_pages), max_size=num_pages)), dtype=np.int64
        ),
    }
    if draw(st.booleans()):
        arrays["tree_pages"] = np.array(tree, dtype=np.int64)
        arrays["tree_lock_ref"] = np.array([draw(st.integers(0, 3)) for _ in tree], np.int64)
    meta = {
        "page_size": page,
        "num_pages": num_pages,
        "request_ids": [f"q{i}" for i in range(rows)],
    }
    return Snapshot("sglang", arrays, meta)


@pytest.mark.parametrize("snapshots", [vllm_snapshots, sglang_snapshots])
def test_fast_check_equals_the_views_on_random_snapshots(snapshots: Any) -> None:
    with sql_reference() as sql:

        @settings(max_examples=EXAMPLES // 2, deadline=None)
        @given(snapshots())
        def same(snap: Snapshot) -> None:
            state = engine(snap.engine).to_state(snap)
            assert check_snapshot(snap) == sql(state)

        same()


def test_digest_tells_states_apart_and_repeats_match() -> None:
    a = Snapshot("vllm", {"x": np.array([1, 2], np.int32)}, {"block_size": 4})
    b = Snapshot("vllm", {"x": np.array([1, 2], np.int64)}, {"block_size": 4})
    c = Snapshot("vllm", {"x": np.array([1, 2], np.int32)}, {"block_size": 8})
    again = Snapshot("vllm", {"x": np.array([1, 2], np.int32)}, {"block_size": 4})
    assert digest(a) == digest(again)
    assert len({digest(a), digest(b), digest(c)}) == 3


def test_an_import_creates_the_views_once_per_version(db: pagedkv_sql.Database) -> None:
    """The cheaper SQL path: a second import finds this version's views (the stamp on
    engine_findings) and creates none; a stale stamp makes it create them all again."""
    from pagedkv_sql.engines.tables import write

    state = engine("vllm").to_state(
        Snapshot(
            "vllm",
            {
                "block_table": np.array([[1, 2]], np.int32),
                "num_blocks_per_row": np.array([2], np.int32),
            },
            {"block_size": 4, "num_blocks": 4},
        )
    )
    write(db.con, state, "first")
    db.con.execute("DROP VIEW diag_engine_lock_ref")
    write(db.con, state, "second")  # the stamp is this version's: nothing re-created

    def views() -> int:
        sql = "SELECT count(*) FROM duckdb_views() WHERE view_name = 'diag_engine_lock_ref'"
        return int(db.con.execute(sql).fetchone()[0])  # type: ignore[index]

    assert views() == 0
    db.con.execute("COMMENT ON VIEW engine_findings IS 'pagedkv-sql engine views 0'")
    write(db.con, state, "third")  # an older version's views: all created again
    assert views() == 1
    assert check_sql(db.con) == []
