"""KV-event decoding and checking shared by `kv-events` and `watch`: every
engine's layout by its own field order, the scope key, the Arrow store, and the kv-events
inputs that are refused (event numbers, frames, hashes of the wrong type, bad UTF-8) as one
line naming the byte offset or line, never a traceback."""

from __future__ import annotations

import io
import json
from typing import Any

import msgspec
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.live import check_stream
from pagedkv_sql.live.decode import batches

enc = msgspec.msgpack.encode


def _check(data: bytes, **kw: Any) -> Any:
    return check_stream(io.BytesIO(data), "s", **kw)


def _refused(data: bytes) -> InputError:
    with pytest.raises(InputError) as e:
        list(batches(io.BytesIO(data), "s"))
    return e.value


def stored(h: Any, parent: Any = None, **kw: Any) -> dict[str, Any]:
    event = {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent}
    return {
        **event,
        "token_ids": [0] * 16,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        **kw,
    }


def removed(h: Any, **kw: Any) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", **kw}


def batch(*events: Any, rank: int = 0) -> bytes:
    return enc([1.0, list(events), rank])


# -- layouts ------------------------------------------------------------------------------
def test_sglang_arrays_are_read_in_sglang_order_and_vllm_arrays_in_vllm_order() -> None:
    # position 9 of a vLLM BlockStored array is group_idx; SGLang's array ends at medium (6)
    # and a later SGLang field there must not be taken for a group
    v_stored = ["BlockStored", [1], None, [0] * 16, 16, None, "GPU", None, None, 3]
    v_removed = ["BlockRemoved", [1], "GPU", 3]
    clean = _check(batch(v_stored) + batch(v_removed))
    assert clean.ok and clean.counts["removed"] == 1
    s_stored = ["BlockStored", [1], None, [0] * 16, 16, None, "GPU", "salt", "sess", 7]
    s_removed = ["BlockRemoved", [1], "GPU"]
    assert _check(enc([1.0, [s_stored]]) + enc([2.0, [s_removed]]), engine="sglang").ok
    # read in vLLM's order, SGLang's trailing fields put the store in group 7: a false finding
    wrong = _check(enc([1.0, [s_stored]]) + enc([2.0, [s_removed]]), engine="vllm")
    assert wrong.findings_by_check["unknown_removal"] == 1


def test_every_layout_is_checked_and_stored_alike() -> None:
    # the array layouts decode into classes of their own: each must say what the map
    # layout's classes say (kind, hashes, parent, scope), in the batch-at-once path and the
    # event-by-event walk (a finding in the second batch), stored row for row the same
    def v(e: dict[str, Any]) -> list[Any]:
        if e["type"] == "AllBlocksCleared":
            return ["AllBlocksCleared"]
        if e["type"] == "BlockRemoved":
            return ["BlockRemoved", e["block_hashes"], e["medium"]]
        return ["BlockStored", e["block_hashes"], e["parent_block_hash"], [0] * 16, 16, None,
                e["medium"]]  # fmt: skip

    cleared = {"type": "AllBlocksCleared"}
    batches = [
        [stored(1), stored(2, 1), stored(3, 2)],
        [removed(3), stored(4, 9), removed(8)],
        [cleared, stored(5), removed(2)],
    ]
    layouts = {
        "map": (b"".join(enc([1.0, b, 0]) for b in batches), "auto"),
        "vllm arrays": (b"".join(enc([1.0, [v(e) for e in b], 0]) for b in batches), "auto"),
        "sglang arrays": (b"".join(enc([1.0, [v(e) for e in b]]) for b in batches), "sglang"),
    }
    seen = {}
    for name, (data, engine) in layouts.items():
        with pagedkv_sql.connect() as db:
            r = _check(data, engine=engine, db=db)
            rows = db.sql(
                "SELECT stream, event, kind, block_hash, parent_hash, medium, group_idx, "
                "locality, ownership, window_size FROM engine_kv_event ORDER BY event, block_hash"
            ).fetchall()
        seen[name] = ([(f.check, f.position, f.message) for f in r.findings], r.counts, rows)
    assert [c for c, _, _ in seen["map"][0]] == ["unknown_parent", "unknown_removal", "after_clear"]
    assert len(seen["map"][2]) == 9
    assert seen["vllm arrays"] == seen["map"]
    assert seen["sglang arrays"] == seen["map"]


def test_tensorrt_llm_event_json_stored_removed_created_updated_with_window_size() -> None:
    def ev(i: int, data: dict[str, Any], window: int = 4096) -> dict[str, Any]:
        return {"event_id": i, "data": data, "window_size": window}

    blocks = [{"type": "stored_block", "block_hash": h, "tokens": [], "cache_level": 0,
               "priority": 35} for h in (11, 12)]  # fmt: skip
    diff = {"type": "event_diff", "new_value": 1, "old_value": 0}
    events = [
        ev(0, {"type": "created", "num_blocks_per_cache_level": [128, 0]}),
        ev(1, {"type": "stored", "parent_hash": None, "blocks": blocks}),
        ev(2, {"type": "updated", "block_hash": 12, "cache_level": diff, "priority": diff}),
        ev(3, {"type": "removed", "block_hashes": [12]}, window=512),  # another window: unknown
        ev(5, {"type": "removed", "block_hashes": [11]}),  # event 4 missing
    ]
    as_array = json.dumps(events).encode()  # what get_kv_cache_events() returns, dumped
    as_lines = "\n".join(json.dumps(e) for e in events).encode() + b"\n"
    for data in (as_array, as_lines):
        r = _check(data)
        assert r.counts == {"stored": 1, "removed": 2, "cleared": 0, "updated": 1, "created": 1}
        assert [(f.check, f.seq) for f in r.findings] == [
            ("unknown_removal", 3),
            ("sequence_gap", 5),
        ]
    with pytest.raises(InputError, match="1 line"):
        _check(json.dumps(ev(0, {"type": "teleported"})).encode())


def test_locality_and_ownership_are_part_of_the_scope() -> None:
    r = _check(batch(stored(1, locality="LOCAL"), removed(1, locality="REMOTE")))
    assert r.findings_by_check["unknown_removal"] == 1
    assert _check(batch(stored(1, ownership="t1"), removed(1, ownership="t1"))).ok


def test_a_chain_within_one_batch_and_out_of_order_parents() -> None:
    # the fast path (set operations) and the walk agree: a parent stored by an earlier event of
    # the batch is fine, one stored by a later event is not
    assert _check(batch(stored(1), stored(2, 1), stored(3, 2))).ok
    late = _check(batch(stored(2, 1), stored(1)))
    assert [f.check for f in late.findings] == ["unknown_parent"]
    twice = _check(batch(stored(1)) + batch(removed(1), removed(1)))
    assert [f.message for f in twice.findings] == ["BlockRemoved of 1, which is not stored"]
    again = _check(batch(stored(1)) + batch(removed(1), stored(5, 1)))
    assert [f.check for f in again.findings] == ["unknown_parent"]


# -- the store --------------------------------------------------------------------------
def test_events_are_stored_as_rows_of_engine_kv_event_joinable_by_hash_text() -> None:
    with pagedkv_sql.connect() as db:
        r = _check(batch(stored(b"\xab\x01"), stored(7, b"\xab\x01")) + batch(removed(7)), db=db)
        rows = db.sql(
            "SELECT event, kind, block_hash, parent_hash, medium, location FROM engine_kv_event"
        ).fetchall()
    assert r.rows == 3
    first = len(batch(stored(b"\xab\x01"), stored(7, b"\xab\x01")))
    assert rows == [
        (0, "stored", "ab01", None, "GPU", "s@0"),
        (1, "stored", "7", "ab01", "GPU", "s@0"),
        (2, "removed", "7", None, "GPU", f"s@{first}"),
    ]


# -- malformed events, numbers, UTF-8 and the Ext hash: refused, named ---------------------
@pytest.mark.parametrize(
    "data",
    [
        b"\x91" * 5000 + b"\x01",  # 5,000-deep arrays
        b"\x81\x00" * 5000 + b"\x01",  # 5,000-deep maps
        b"\x92\xcb" + b"\x00" * 8 + b"\x91" * 200_000 + b"\xc0",  # a batch, 200,000 deep
    ],
    ids=["deep-arrays", "deep-maps", "deep-in-a-batch"],
)
def test_deep_msgpack_is_refused_at_its_offset(data: bytes) -> None:
    e = _refused(batch(stored(1)) + data)
    assert f"(byte {len(batch(stored(1)))})" in e.message


@pytest.mark.parametrize(
    "data",
    [b"\xc1", b"\x93\xc4\x00\xc4\x08" + b"\x00" * 8 + b"\xc4\x01\xc1", b"\xff\xff\xff", b"\x93"],
    ids=["opcode", "frame-payload", "negative-ints", "truncated"],
)
def test_a_frame_that_is_not_msgpack_is_refused_at_its_offset(data: bytes) -> None:
    e = _refused(batch(stored(1)) + data)
    assert f"byte {len(batch(stored(1)))}" in e.details[0]


@pytest.mark.parametrize(
    "parent",
    [[1], {"a": 1}, msgspec.msgpack.Ext(1, b"x"), 1.5, True],
    ids=["list", "map", "ext", "float", "bool"],
)
def test_a_parent_or_block_hash_that_is_not_a_hash_is_refused(parent: Any) -> None:
    e = _refused(batch(stored(2, parent)))
    assert "parent_block_hash" in e.details[0]
    e = _refused(batch({"type": "BlockRemoved", "block_hashes": [parent]}))
    assert "block_hashes" in e.details[0]


@pytest.mark.parametrize("parent", ["[1]", '{"a": 1}', "1.5", "true"])
def test_a_json_parent_hash_that_is_not_a_hash_is_refused_with_its_line(parent: str) -> None:
    good = '{"worker_id": 1, "event": {"event_id": 0, "data": "cleared"}}'
    bad = ('{"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"parent_hash": '
           + parent + ', "blocks": [{"block_hash": 5}]}}}}')  # fmt: skip
    e = _refused((good + "\n" + bad + "\n").encode())
    (detail,) = e.details
    assert detail.startswith("s:2: ") and "parent_hash" in detail


@pytest.mark.parametrize(
    "seq",
    [b"\x01" * 3000, b"\x01" * 9, b"", 2**64 - 1],
    ids=["3000-bytes", "9-bytes", "empty", "u64"],
)
def test_a_sequence_number_that_is_not_64_bits_is_refused(seq: Any) -> None:
    frame = enc([b"", seq, batch(stored(1))])
    e = _refused(frame)
    assert "sequence number" in e.details[0] and "byte 0" in e.details[0]


@pytest.mark.parametrize(
    "event_id",
    ["9" * 5000, "1.0", '"3"', "true", "null", str(2**63), "1e3"],
    ids=["5000-digits", "float", "string", "bool", "null", "2^63", "exponent"],
)
def test_event_numbers_that_are_not_integers_are_refused_never_unchecked(event_id: str) -> None:
    # a float or string event_id never switches gap checking off (0 findings, exit 0)
    lines = [
        '{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}}',
        '{"worker_id": 1, "event": {"event_id": ' + event_id + ', "data": "cleared"}}',
    ]
    e = _refused(("\n".join(lines) + "\n").encode())
    (detail,) = e.details
    assert detail.startswith("s:2: ")
    trt = '{"event_id": ' + event_id + ', "data": {"type": "created"}, "window_size": 1}\n'
    assert _refused(trt.encode()).details[0].startswith("s:1: ")


def test_integer_event_numbers_keep_gap_checking_on() -> None:
    lines = [
        '{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}}',
        '{"worker_id": 1, "event": {"event_id": 9, "data": "cleared"}}',
    ]
    r = _check(("\n".join(lines) + "\n").encode())
    assert [f.check for f in r.findings] == ["sequence_gap"]


@pytest.mark.parametrize(
    "first", [b"{bad", b'{"worker_id": 1, "event":', b"[1,", b"{\"a\": 1}}"],
    ids=["garbage", "truncated", "array", "extra-brace"],
)  # fmt: skip
def test_a_malformed_first_json_line_is_reported_as_json_not_msgpack(first: bytes) -> None:
    # a JSON Lines file whose first line is malformed is not "byte 0: not an EventBatch"
    e = _refused(first + b"\n" + b'{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}}\n')
    assert "msgpack" not in e.message and "KV event batches" not in e.message
    assert "JSON" in e.details[0] or "not a KV event" in e.details[0]


@pytest.mark.parametrize(
    "line",
    [
        b'{"worker_id": "r\xff", "event": {"event_id": 1, "data": "cleared"}}',
        b'{"event_id": 1, "data": {"type": "removed", "block_hashes": ["h\xfe"]}}',
        b'{"event_id": 1, "data": {"type": "stored\xfe"}}',
    ],
    ids=["worker-id", "hash", "type"],
)
def test_invalid_utf8_in_json_ids_and_hashes_is_refused_never_replaced(line: bytes) -> None:
    # replacing invalid UTF-8 would merge two ids (h\xfe and h\xff would become one)
    e = _refused(line + b"\n")
    assert "UTF-8" in e.details[0] and e.details[0].startswith("s:1")


def test_invalid_utf8_in_a_msgpack_string_is_refused() -> None:
    bad = batch(stored(1)).replace(b"\xa3GPU", b"\xa3G\xffU")
    assert "UTF-8" in _refused(bad).details[0]


def test_deep_json_and_huge_json_numbers_are_refused_with_their_line() -> None:
    deep = b'{"worker_id": 1, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    assert _refused(deep + b"\n").details[0].startswith("s:1: ")
    huge_hash = (
        b'{"event_id": 1, "data": {"type": "removed", "block_hashes": [' + b"9" * 5000 + b"]}}"
    )
    assert _refused(huge_hash + b"\n").details[0].startswith("s:1: ")


# -- kv-events: a key named twice is refused, never "the last wins" ----------------------
# (in JSON kv-event lines and in JSON files alike)
@pytest.mark.parametrize(
    "text",
    [
        # the event itself twice: event 1 was silently dropped
        b'{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"},'
        b' "event": {"event_id": 2, "data": "cleared"}}',
        # a removal's hashes twice, spaced before the colon
        b'{"worker_id" : 1, "event" : {"event_id" : 1, "data": {"removed":'
        b' {"block_hashes": [1], "block_hashes" : [2]}}}}',
        # TensorRT-LLM: the type twice
        b'{"event_id": 1, "data": {"type": "created", "type": "stored", "blocks": []}}',
        # vLLM's JSON layout: block_hashes twice in a BlockStored
        b'{"type": "BlockStored", "block_hashes": [1], "block_hashes": [2],'
        b' "parent_block_hash": null}',
    ],
    ids=["dynamo-event", "nested-spaced", "trtllm-type", "vllm-hashes"],
)
def test_a_json_kv_event_naming_a_key_twice_is_refused_with_its_line(text: bytes) -> None:
    good = b'{"worker_id": 1, "event": {"event_id": 0, "data": "cleared"}}'
    e = _refused(good + b"\n" + text + b"\n")
    (detail,) = e.details
    assert detail.startswith("s:2: ") and "duplicate key" in detail


def test_a_json_array_of_kv_events_naming_a_key_twice_is_refused() -> None:
    doc = b'[{"event_id": 1, "data": {"type": "created", "type": "removed", "block_hashes": []}}]'
    e = _refused(doc)
    assert "duplicate key 'type'" in e.details[0]


@pytest.mark.parametrize(
    "hash_text", [r'"a\":1"', '"b\\":"', '":"'], ids=["escaped-quote", "trailing", "colon"]
)
def test_strings_that_look_like_keys_are_no_duplicates(hash_text: str) -> None:
    # the quick count of keys in the text over-counts these; the strict reading clears them
    line = (
        '{"worker_id": 1, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, '
        f'"blocks": [{{"block_hash": {hash_text}}}, {{"block_hash": {hash_text}}}]}}}}}}}}'
    )
    r = _check((line + "\n").encode())
    assert r.findings == []


# -- KV-cache groups (vLLM 0.32: group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window)
def _group(g: int, kind: str, window: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"group_idx": g, "kv_cache_spec_kind": kind}
    if window is not None:
        spec["kv_cache_spec_sliding_window"] = window
    return spec


def _hybrid_store(h: int, parent: int | None, g: int) -> dict[str, Any]:
    return stored(
        h, parent, **(_group(0, "sliding_window", 64) if g == 0 else _group(1, "full_attention"))
    )


def test_every_layout_reads_the_group_kind_and_window() -> None:
    # the map layout, vLLM's array (positions 11 and 12) and vLLM-shaped JSON
    as_map = batch(stored(5, 4, **_group(1, "sliding_window", 64)))
    as_array = batch(["BlockStored", [5], 4, [0] * 16, 16, None, "GPU", None, None, 1,
                      "sliding_window", 64])  # fmt: skip
    as_json = json.dumps(
        {"events": [stored(5, 4, **_group(1, "sliding_window", 64))], "ts": 1.0}
    ).encode()
    for data in (as_map, as_array, as_json):
        [b] = list(batches(io.BytesIO(data), "s"))
        [e] = b.events
        assert (e.group, e.spec_kind, e.spec_window) == (1, "sliding_window", 64)
        assert _check(data).ok  # a sliding group's parent need not be stored


@pytest.mark.parametrize("kind", ["sliding_window", "mamba"])
def test_a_windowed_group_s_parent_or_empty_chain_is_no_finding(kind: str) -> None:
    # vLLM's default retention hashes only a window's blocks: a BlockStored of none, naming a
    # parent never stored (llm-d-router #2362), as vLLM 0.32's servers publish them
    spec = _group(0, kind, 64 if kind == "sliding_window" else None)
    empty = {**stored(1, 77, **spec), "block_hashes": []}
    r = _check(batch(empty, stored(5, 78, **spec)) + batch(removed(5, group_idx=0)))
    assert r.ok and r.counts["stored"] == 2
    # a later store of the group without its kind (learned from the first) is not checked
    assert _check(batch(stored(5, 78, **spec)) + batch(stored(6, 79, group_idx=0))).ok


def test_a_full_attention_group_keeps_the_parent_check_and_names_the_group() -> None:
    r = _check(batch(_hybrid_store(1, 77, 0), _hybrid_store(2, 77, 1)))
    assert [(f.check, f.message) for f in r.findings] == [
        ("unknown_parent", "group 1 (full_attention): BlockStored of 2 names parent 77, "
         "which is not stored"),
    ]  # fmt: skip
    assert r.findings[0].to_dict()["group"] == 1
    assert r.findings[0].to_dict()["group_kind"] == "full_attention"


def test_a_removal_takes_its_own_group_s_store() -> None:
    # a hash carries no group: vLLM stores the same hash in each group
    both = batch(_hybrid_store(9, None, 0), _hybrid_store(9, None, 1))
    assert _check(both + batch(removed(9, group_idx=1), removed(9, group_idx=0))).ok
    twice = _check(both + batch(removed(9, group_idx=1)) + batch(removed(9, group_idx=1)))
    assert [(f.check, f.message) for f in twice.findings] == [
        ("unknown_removal", "group 1 (full_attention): BlockRemoved of 9, which is not stored")
    ]
    # group 0 holds the hash: a removal in group 1 that never stored it is still found
    only0 = _check(batch(_hybrid_store(9, None, 0)) + batch(removed(9, group_idx=1)))
    assert [f.message for f in only0.findings] == [
        "group 1: BlockRemoved of 9, which is not stored"
    ]
    assert only0.findings[0].to_dict()["group_kind"] is None


@pytest.mark.parametrize("split", [False, True])
def test_a_hash_stored_twice_in_one_group_is_removed_twice(split: bool) -> None:
    # two blocks of one group with the same tokens: two stores, two removals (vLLM)
    stores = [stored(9, None, **_group(1, "mamba")), stored(9, None, **_group(1, "mamba"))]
    head = b"".join(batch(s) for s in stores) if split else batch(*stores)
    r = _check(head + batch(removed(9, group_idx=1)) + batch(removed(9, group_idx=1)))
    assert r.ok
    three = _check(
        head + batch(removed(9, group_idx=1), removed(9, group_idx=1), removed(9, group_idx=1))
    )
    assert [f.message for f in three.findings] == [
        "group 1 (mamba): BlockRemoved of 9, which is not stored"
    ]
