"""vLLM's KV-cache groups (engines/vllm.py, engines/groups.py): snapshots in the shapes
vLLM gives a sliding-window, a hybrid, a chunked-local and a Mamba model (null padding of a
prefix hit, entries freed as they leave the window, a Mamba "align" table like [0, 0, 11],
groups of different block sizes) import with no finding, the spec's relations are the
primary group's and keep the tokens it keeps, and the faults the checks find with full
attention are found in every group, the SQL views and the fast check alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import CacheTensor, Snapshot, check_snapshot, engine
from pagedkv_sql.engines.fastcheck import check_sql
from pagedkv_sql.errors import InputError, UsageError

from .helpers import grouped_snapshot

SWA = {
    "kind": "sliding_window",
    "block_size": 4,
    "sliding_window": 8,
    "layer_names": ["model.layers.0.self_attn.attn"],
}
FULL = {"kind": "full_attention", "block_size": 4, "layer_names": ["model.layers.1.self_attn.attn"]}
CHUNK = {
    "kind": "chunked_local_attention",
    "block_size": 4,
    "attention_chunk_size": 8,
    "layer_names": ["model.layers.0.self_attn.attn"],
}
MAMBA = {"kind": "mamba", "block_size": 8, "layer_names": ["model.layers.0.linear_attn"]}
MAMBA_NONE = {"kind": "mamba", "block_size": 256, "layer_names": ["model.layers.1.mamba"]}

# healthy states as vLLM holds them; comments: what vLLM did to get there
HEALTHY: dict[str, Any] = {
    # window 8, block 4: r1 (13 tokens) had entry 0 freed as it left the window; r2's prefix
    # hit came back as [null, null, 8, 9] (the window's blocks only) and grew a block; r3
    # is young; vLLM 0.32 drifts the null block's ref_cnt negative
    "all sliding": lambda: grouped_snapshot(
        [SWA],
        {"r1": [[0, 7, 5, 6]], "r2": [[0, 0, 8, 9, 10]], "r3": [[11]]},
        {"r1": 13, "r2": 17, "r3": 3},
        null_ref_cnt=-3,
    ),
    # one sliding layer, one full layer: the full group is primary; r2's hit shares the
    # full prefix 1, 2 and pads the window group with nulls
    "sliding + full": lambda: grouped_snapshot(
        [SWA, FULL],
        {"r1": [[0, 7, 5, 6], [1, 2, 3, 4]], "r2": [[0, 0, 8, 9, 10], [1, 2, 12, 13, 14]]},
        {"r1": 13, "r2": 17},
        null_ref_cnt=-3,
    ),
    # chunk 8: r1 (13 tokens) keeps its current chunk's tokens 8..12 only
    "chunked local + full": lambda: grouped_snapshot(
        [CHUNK, FULL],
        {"r1": [[0, 0, 5, 6], [1, 2, 3, 4]], "r2": [[7], [8]]},
        {"r1": 13, "r2": 2},
        null_ref_cnt=-2,
    ),
    # Mamba "align" with prefix caching: a state block a passed boundary, earlier ones
    # nulled ([0, 0, 11]); the Mamba group's blocks are twice the attention group's
    "mamba align + full": lambda: grouped_snapshot(
        [MAMBA, FULL],
        {"r1": [[0, 0, 11], [1, 2, 3, 4, 5]], "r2": [[0, 12], [6, 7, 9]]},
        {"r1": 20, "r2": 9},
        null_ref_cnt=-3,
    ),
    # two full-attention groups of different page sizes (block 4 and 8): the first primary
    "full + full": lambda: grouped_snapshot(
        [FULL, FULL | {"block_size": 8, "layer_names": ["model.layers.2.self_attn.attn"]}],
        {"r1": [[1, 2, 3, 4, 5], [6, 7, 8]], "r2": [[9], [10]]},
        {"r1": 20, "r2": 3},
    ),
    # Mamba without prefix caching: one block of max_model_len tokens a request
    "full + mamba none": lambda: grouped_snapshot(
        [FULL, MAMBA_NONE], {"r1": [[1, 2, 3, 4, 5], [9]], "r2": [[6], [10]]}, {"r1": 20, "r2": 3}
    ),
}


def _sql(snap: Snapshot) -> tuple[list[Any], list[tuple[str, int]]]:
    """The engine views' findings and every check's offending rows after an import."""
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)
        engine_findings = check_sql(db.con)
        rows = [(r.name, r.rows.num_rows) for r in db.check().results if r.rows.num_rows]
    return engine_findings, rows


@pytest.mark.parametrize("case", list(HEALTHY))
def test_a_healthy_engine_of_every_kind_gives_no_finding(case: str) -> None:
    snap = HEALTHY[case]()
    assert check_snapshot(snap) == []
    assert _sql(snap) == ([], [])


def test_the_null_block_counts_when_the_old_views_would_find_a_duplicate() -> None:
    """The plant the healthy cases stand on: the same state found by the checks once the
    null entries are real blocks (block 7 twice, refcount off)."""
    snap = HEALTHY["all sliding"]()
    snap.arrays["block_table"][1, :2] = 7
    found = {f.check for f in check_snapshot(snap)}
    assert {"diag_engine_duplicate_block", "diag_engine_refcount_mismatch"} <= found


def test_an_all_sliding_model_s_tokens_are_those_of_its_window(db: pagedkv_sql.Database) -> None:
    db.load_engine(HEALTHY["all sliding"]())
    tokens = db.sql(
        "SELECT seq_id, min(token_pos), max(token_pos), count(*) FROM virtual_token "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    # r1 13 tokens, window 8: 6..12; r2 17: 10..16; r3 3: 0..2
    assert tokens == [(0, 6, 12, 7), (1, 10, 16, 7), (2, 0, 2, 3)]
    resolved = db.resolve_table()
    assert resolved.num_rows == 17
    assert db.sql("SELECT * FROM engine_kv_group").fetchall() == [
        (0, "sliding_window", 4, 8, ["model.layers.0.self_attn.attn"], True)
    ]


def test_the_primary_group_is_the_first_full_attention_one(db: pagedkv_sql.Database) -> None:
    db.load_engine(HEALTHY["sliding + full"]())
    kinds = db.sql("SELECT group_id, kind, is_primary FROM engine_kv_group ORDER BY 1").fetchall()
    assert kinds == [(0, "sliding_window", False), (1, "full_attention", True)]
    # the spec's relations: group 1's blocks, every token
    bases = db.sql(
        "SELECT block_table_id, block_index, physical_block_base // 256 FROM block_table_entry "
        "ORDER BY ALL"
    ).fetchall()
    assert [b for *_, b in bases] == [1, 2, 3, 4, 1, 2, 12, 13, 14]
    assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(30,)]


def test_resolve_a_group_gives_the_tokens_it_keeps_at_its_blocks(db: pagedkv_sql.Database) -> None:
    db.load_engine(HEALTHY["sliding + full"]())
    spec = db.resolve_table()
    assert db.resolve(group=1).read_all().equals(spec)
    window = db.resolve(group=0).read_all().to_pylist()
    # r1's tokens 6..12 in blocks 7 (entry 1), 5, 6; r2's 10..16 in 8 (entry 2), 9, 10
    assert [(r["seq_id"], r["token_pos"], r["physical_address"]) for r in window[:3]] == [
        (0, 6, 7 * 256 + 2),
        (0, 7, 7 * 256 + 3),
        (0, 8, 5 * 256 + 0),
    ]
    assert len(window) == 14 and window[-1] == {
        "seq_id": 1,
        "token_pos": 16,
        "physical_address": 10 * 256,
    }


@pytest.mark.parametrize(
    ("case", "group", "message"),
    [
        ("mamba align + full", 0, "group 0 is a mamba group: its blocks hold each request's"),
        ("sliding + full", 2, r"no KV-cache group 2 in the imported state; groups: 0, 1"),
    ],
)
def test_resolve_refuses_a_group_with_no_tokens(
    db: pagedkv_sql.Database, case: str, group: int, message: str
) -> None:
    db.load_engine(HEALTHY[case]())
    with pytest.raises(UsageError, match=message):
        db.resolve(group=group)


def test_resolve_a_group_needs_an_engine_import(db: pagedkv_sql.Database) -> None:
    with pytest.raises(UsageError, match="reads an engine import's block lists"):
        db.resolve(group=0)


def test_stats_show_each_group(db: pagedkv_sql.Database) -> None:
    db.load_engine(HEALTHY["sliding + full"]())
    groups = db.stats().groups
    assert [(g.group_id, g.kind, g.window, g.primary) for g in groups] == [
        (0, "sliding_window", 8, False),
        (1, "full_attention", None, True),
    ]
    # group 0: 9 entries, 3 of them null; blocks 7 5 6 8 9 10; group 1: blocks 1 2 3 4 12 13 14
    assert [(g.requests, g.entries, g.blocks, g.placeholders) for g in groups] == [
        (2, 9, 6, 3),
        (2, 9, 7, 0),
    ]
    assert groups[0].rows()[2] == (
        "KV-cache group 0 (sliding_window 8, block size 4) blocks held",
        6,
    )


# -- faults: the same findings in every group --------------------------------------------------
def _mutate(case: str, change: Any) -> Snapshot:
    snap = HEALTHY[case]()
    change(snap)
    return snap


def _entry(snap: Snapshot, group: int, row: int, index: int, block: int) -> None:
    tables = snap.arrays["block_table"]
    (tables[group] if tables.ndim == 3 else tables)[row, index] = block


def _window_hole(snap: Snapshot) -> None:
    """r1's window entry 2 (tokens 8..11, inside the window) freed: null, block 5 free."""
    _entry(snap, 0, 0, 2, 0)
    snap.arrays["ref_cnt"][5] = 0
    snap.arrays["free_block_queue"] = np.append(snap.arrays["free_block_queue"], 5).astype(np.int32)
    snap.meta["num_free_blocks"] += 1


def _sliding_duplicate(snap: Snapshot) -> None:
    """r1's window holds block 6 twice (entries 2 and 3), with its count of two."""
    _entry(snap, 0, 0, 2, 6)
    snap.arrays["ref_cnt"][6] = 2
    snap.arrays["ref_cnt"][5] = 0
    snap.arrays["free_block_queue"] = np.append(snap.arrays["free_block_queue"], 5).astype(np.int32)
    snap.meta["num_free_blocks"] += 1


def _null_in_free_queue(snap: Snapshot) -> None:
    snap.arrays["free_block_queue"] = np.append(snap.arrays["free_block_queue"], 0).astype(np.int32)
    snap.meta["num_free_blocks"] += 1


def _state_block_count(snap: Snapshot) -> None:
    """Mamba's state block 11 counted twice (a decrement skipped)."""
    snap.arrays["ref_cnt"][11] = 2


def _full_list_short(snap: Snapshot) -> None:
    """The second full group's list of r1 one entry short of its 20 tokens (block 8
    dropped; the primary group's short list is refused by the import, as always)."""
    snap.arrays["num_blocks_per_row"][1, 0] = 2
    snap.arrays["ref_cnt"][8] = 0
    snap.arrays["free_block_queue"] = np.append(snap.arrays["free_block_queue"], 8).astype(np.int32)
    snap.meta["num_free_blocks"] += 1


def _sliding_block_also_free(snap: Snapshot) -> None:
    """Block 9 of r2's window is also in the free queue (a use after free)."""
    snap.arrays["free_block_queue"] = np.append(snap.arrays["free_block_queue"], 9).astype(np.int32)
    snap.arrays["ref_cnt"][9] = 1


FAULTS = [
    ("all sliding", _window_hole, "diag_engine_unresolved_token", "r1", None),
    ("sliding + full", _window_hole, "diag_engine_unresolved_token", "r1", None),
    ("chunked local + full", _window_hole, "diag_engine_unresolved_token", "r1", None),
    ("sliding + full", _sliding_duplicate, "diag_engine_duplicate_block", "r1", 6),
    ("sliding + full", _sliding_block_also_free, "diag_engine_held_free_block", "r2", 9),
    ("all sliding", _null_in_free_queue, "diag_engine_outside_pool", None, 0),
    ("mamba align + full", _null_in_free_queue, "diag_engine_outside_pool", None, 0),
    ("mamba align + full", _state_block_count, "diag_engine_refcount_mismatch", "r1", 11),
    ("full + full", _full_list_short, "diag_engine_unresolved_token", "r1", None),
]


@pytest.mark.parametrize(
    ("case", "fault", "check", "rid", "block"),
    FAULTS,
    ids=[f"{c}-{f.__name__.strip('_')}" for c, f, *_ in FAULTS],
)
def test_a_fault_in_any_group_is_found(
    case: str, fault: Any, check: str, rid: str | None, block: int | None
) -> None:
    snap = _mutate(case, fault)
    fast = check_snapshot(snap)
    sql, _ = _sql(snap)
    assert fast == sql
    mine = [f for f in fast if f.check == check]
    assert mine, fast
    assert all(rid is None or f.request_ids == (rid,) for f in mine), mine
    assert all(block is None or f.block_id == block for f in mine), mine


def test_a_window_hole_is_named_with_its_group_and_tokens() -> None:
    [found] = check_snapshot(_mutate("sliding + full", _window_hole))
    assert found.reason == (
        "request r1 holds no block at entry 2 of KV-cache group 0 (sliding_window 8, block "
        "size 4): a placeholder, though the group keeps tokens 8..11 of its 13 computed "
        "tokens there"
    )
    [short] = check_snapshot(_mutate("full + full", _full_list_short))
    assert short.reason == (
        "request r1 holds no block at entry 2 of KV-cache group 1 (full_attention, block size "
        "8): past the end of its 2-entry list, though the group keeps tokens 16..19 of its 20 "
        "computed tokens there"
    )


def test_an_entry_that_left_the_window_may_still_hold_its_block() -> None:
    """vLLM frees by the tokens it processed, which can lag the computed ones: a block
    before the window not yet freed is fine."""
    snap = HEALTHY["all sliding"]()
    _entry(snap, 0, 0, 0, 12)  # r1's entry 0 (tokens 0..3, out of the window) still held
    snap.arrays["ref_cnt"][12] = 1
    snap.arrays["free_block_queue"] = snap.arrays["free_block_queue"][
        snap.arrays["free_block_queue"] != 12
    ]
    snap.meta["num_free_blocks"] -= 1
    assert check_snapshot(snap) == []
    assert _sql(snap) == ([], [])


# -- snapshots from before groups, and refused metadata -----------------------------------
def test_a_snapshot_without_groups_imports_as_one_full_attention_group(
    db: pagedkv_sql.Database,
) -> None:
    snap = HEALTHY["sliding + full"]()
    one = grouped_snapshot([FULL], {"r1": [[1, 2, 3, 4]]}, {"r1": 13})
    del one.meta["kv_cache_groups"]
    db.load_engine(one)
    assert db.sql(
        "SELECT group_id, kind, block_size, is_primary FROM engine_kv_group"
    ).fetchall() == [(0, "full_attention", 4, True)]
    del snap.meta["kv_cache_groups"]
    state = engine("vllm").to_state(snap)
    assert state.kv_groups is not None
    assert state.kv_groups.column("kind").to_pylist() == [None, None]
    assert state.kv_groups.column("is_primary").to_pylist() == [True, False]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g: g[0].update(kind="rswa"), r"kv_cache_groups\[0\]\.kind.*rswa"),
        (lambda g: g[0].pop("sliding_window"), "sliding_window group without its sliding_window"),
        (lambda g: g.pop(), "has 1 group"),
        (lambda g: g[1].update(block_size=8), "primary group, full_attention.*block_size 8"),
        (lambda g: g[0].update(block_size=0), r"kv_cache_groups\[0\]\.block_size"),
    ],
)
def test_groups_that_do_not_describe_the_snapshot_are_refused(
    db: pagedkv_sql.Database, change: Any, message: str
) -> None:
    snap = HEALTHY["sliding + full"]()
    snap.meta["kv_cache_groups"] = [dict(g) for g in snap.meta["kv_cache_groups"]]
    change(snap.meta["kv_cache_groups"])
    with pytest.raises(InputError, match=message):
        db.load_engine(snap)
    assert db.sql("SELECT count(*) FROM root_table").fetchall() == [(0,)]


# -- byte addresses: a layer's K and V in its group's blocks ------------------------------
def _with_tensors(snap: Snapshot) -> Snapshot:
    """One tensor a layer, [blocks, slot, head, dim] with K and V apart, as vLLM's
    per-layer views of one pool: layer 0 (the window group's), layer 1 (the full group's)."""
    shape, strides = (24, 4, 2, 8), (64, 16, 8, 1)
    tensors = [
        CacheTensor(
            f"L{layer}{kv}",
            shape,
            strides,
            "float16",
            2,
            ("block", "slot", "head", "dim"),
            base,
            kv="KV".index(kv),
            layer=layer,
        )
        for layer in (0, 1)
        for kv, base in (("K", 2**30 * (1 + 2 * layer)), ("V", 2**30 * (2 + 2 * layer)))
    ]
    return Snapshot(snap.engine, snap.arrays, snap.meta, tensors)


def test_kv_addresses_of_a_layer_use_its_group(db: pagedkv_sql.Database) -> None:
    db.load_engine(_with_tensors(HEALTHY["sliding + full"]()))
    # token 8 of r1: block 5 in the window group (layer 0), block 3 in the full group
    window = {a.kv: (a.block_id, a.slot, a.address) for a in db.kv_addresses(0, 8, 0, 1)}
    full = {a.kv: (a.block_id, a.slot, a.address) for a in db.kv_addresses(0, 8, 1, 1)}
    assert window == {"K": (5, 0, 2**30 + 2 * (5 * 64 + 8)), "V": (5, 0, 2**31 + 2 * (5 * 64 + 8))}
    assert full["K"] == (3, 0, 3 * 2**30 + 2 * (3 * 64 + 8))
    # token 2 of r1 left the window: no address in layer 0, one in layer 1
    assert db.kv_addresses(0, 2, 0, 0) == []
    assert [a.block_id for a in db.kv_addresses(0, 2, 1, 0)] == [1, 1]


def test_kv_addresses_of_a_mamba_layer_are_refused(db: pagedkv_sql.Database) -> None:
    db.load_engine(_with_tensors(HEALTHY["mamba align + full"]()))
    with pytest.raises(UsageError, match="layer 0 is in KV-cache group 0, a mamba group"):
        db.kv_addresses(0, 8, 0, 0)
