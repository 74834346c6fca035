"""replay/builder.py, the witness: what a version 2 log carries beyond the block tables,
read into the event table, and an engine's hash cut to the log's 64 bits the same way on
both sides."""

from __future__ import annotations

import pytest

from pagedkv_sql.replay.builder import short_hash
from pagedkv_sql.replay.header import LogLineError, as_hash, hash_text
from pagedkv_sql.replay.log import Builder, Header


@pytest.mark.parametrize(
    ("engine_hash", "text"),
    [
        # a SHA-256: vLLM's published integer, its last 8 bytes (not its first, 00..07)
        (bytes(range(32)), "18191a1b1c1d1e1f"),
        (b"\x01\x02", "0000000000000102"),  # a short one: the same number
        (0x1234, "0000000000001234"),
        (-1, "ffffffffffffffff"),  # an integer: its low 64 bits
        (None, None),
    ],
)
def test_an_engine_hash_is_cut_to_64_bits(engine_hash: object, text: str | None) -> None:
    assert short_hash(engine_hash) == text


@pytest.mark.parametrize("text", ["0000000000000000", "7fffffffffffffff", "8000000000000000"])
def test_a_log_hash_is_a_signed_64_bit_value_and_back(text: str) -> None:
    value = as_hash(text, "h")
    assert -(2**63) <= value < 2**63 and hash_text(value) == text
    assert as_hash(text.upper(), "h") == value


def test_the_witness_reads_into_events() -> None:
    builder = Builder(Header(block_size=4, num_gpu_blocks=16))
    h = "00000000000000ff"
    builder.step({"step": 0, "ops": [{"op": "cache", "blocks": [3], "hashes": [h]}]})
    builder.step(
        {
            "step": 1,
            "new_requests": [
                {"req_id": "a", "block_ids": [3, 4], "num_computed_tokens": 4, "hashes": [h]}
            ],
            "ops": [{"op": "free", "req": "a", "handed": [4, 4]}],
            "observed": {"free_list": [4, 4, 5]},
        }
    )
    rows = [
        (r["op"], r["request"], r["block_index"], r["block_id"], r["value"])
        for r in builder.table().to_pylist()
    ]
    assert rows == [
        ("cache", None, None, 3, 255),
        ("arrive", "a", None, None, None),
        ("share", "a", 0, 3, 255),
        ("allocate", "a", 1, 4, None),
        ("append", "a", None, None, None),
        ("kept", "a", 0, 3, None),  # not handed
        ("free", "a", 1, 4, None),
        ("free", "a", None, 4, None),  # handed once more than held
        ("free", "a", None, None, None),
        ("observe_free_list", None, None, 4, 2),
        ("observe_free_list", None, None, 5, 1),
    ]


def test_a_version_1_builder_refuses_the_witness() -> None:
    builder = Builder(Header(), version=1)
    with pytest.raises(LogLineError, match="operation 'cache', 'hashes' are format version 2"):
        builder.step({"step": 0, "ops": [{"op": "cache", "blocks": [1], "hashes": []}]})


def test_the_header_names_the_hash_fold_and_a_log_without_it_reads_as_before() -> None:
    from pagedkv_sql.hashes import canonical, first8, from_signed, to_signed
    from pagedkv_sql.replay.header import header_from

    assert header_from({"pagedkv_step_log": 2}).hash == "first8"
    new = header_from({"pagedkv_step_log": 2, "hash": "vllm_last8"})
    assert new.hash == "vllm_last8" and '"hash": "vllm_last8"' in new.to_json()
    assert '"hash"' not in header_from({"pagedkv_step_log": 2}).to_json()
    with pytest.raises(LogLineError, match="header 'hash' must be one of vllm_last8, first8"):
        header_from({"pagedkv_step_log": 2, "hash": "last8"})
    digest = bytes(range(32))
    assert canonical(digest) == 0x18191A1B1C1D1E1F and first8(digest) == 0x0001020304050607
    assert to_signed(2**64 - 1) == -1 and from_signed(-1) == 2**64 - 1
    assert from_signed(to_signed(2**63)) == 2**63 and to_signed(5) == 5
