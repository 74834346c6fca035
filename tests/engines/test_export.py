"""export flashinfer / vllm: the engine's own arrays from the stored relations, and the
sequences they cannot hold refused with the reason."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import flashinfer, trtllm

from .example import example


def test_vllm_block_table_and_slot_mapping(db: pagedkv_sql.Database) -> None:
    db.load_engine(example())
    out = db.export_engine("vllm")
    a = out.snapshot.arrays
    assert a["block_table"].dtype == np.int32 and a["slot_mapping"].dtype == np.int64
    # chat-43's empty last page is not a block of its 16 tokens
    assert a["block_table"].tolist() == [[5, 7, 9], [5, 2, 0], [11, 0, 0]]
    assert a["num_blocks_per_row"].tolist() == [3, 2, 1]
    slots = a["slot_mapping"]
    assert slots.size == 35 + 20 + 16
    assert slots[:3].tolist() == [80, 81, 82]  # block 5, slots 0..2
    assert slots[35 + 17] == 2 * 16 + 1  # chat-42 token 17: block 2, slot 1
    assert out.snapshot.meta["request_ids"] == ["chat-41", "chat-42", "chat-43"]


def test_facts_without_an_engine_get_dense_ids_and_their_bases(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    rows = [(100, i, 0x10000 + 0x1000 * (3 - i), 1) for i in range(3)]
    tokens = [(1, p, p // 16, p % 16) for p in range(40)]
    db.load(
        facts_dir({"root_table": [(1, 100)], "block_table_entry": rows, "virtual_token": tokens})
    )
    out = db.export_engine("flashinfer")
    a = out.snapshot.arrays
    assert a["kv_indices"].tolist() == [2, 1, 0]
    assert a["pagedkv_page_base"].tolist() == [0x11000, 0x12000, 0x13000]
    assert a["kv_last_page_len"].tolist() == [8]
    vllm = db.export_engine("vllm").snapshot.arrays
    assert vllm["block_table"].tolist() == [[3, 2, 1]]  # block 0 is vLLM's null block


def test_swapped_and_missing_blocks_are_refused(db: pagedkv_sql.Database) -> None:
    offsets = np.zeros((1, 3, 2, 2), dtype=np.int32)
    entries = [[(0, 1), (0, 2)], [(0, 3), (1 << 30, 4)], [(0, 5), None]]
    for r, row in enumerate(entries):
        for b, entry in enumerate(row):
            if entry is None:
                offsets[0, r, :, b] = -1
            else:
                flag, block = entry
                offsets[0, r, 0, b] = flag + block * 4
                offsets[0, r, 1, b] = flag + block * 4 + 1
    db.load_engine(
        trtllm.snapshot(
            offsets, np.array([20, 20, 20], np.int32), 16, 2, request_ids=["x", "y", "z"]
        )
    )
    out = db.export_engine("flashinfer")
    assert out.refused == [
        (1, "y", "swapped: block 1 is on the CPU (swapped_block), not resident"),
        (2, "z", "page fault: block 1 (tokens 16..) is neither resident nor swapped"),
    ]
    assert out.snapshot.arrays["kv_indices"].tolist() == [1, 2]
    assert out.snapshot.meta["request_ids"] == ["x"]


def test_cli_export_strict_writes_nothing(cli: Any, tmp_path: Path) -> None:
    assert cli("load", str(Path(__file__).parents[2] / "data")).exit_code == 0
    r = cli("export", "vllm", "--output", str(tmp_path / "out"), "--strict")
    assert r.exit_code == 1
    assert "refused: seq_id 2:" in r.output and "nothing was written" in r.output
    assert not (tmp_path / "out").exists()
    r = cli("export", "sglang", "--output", str(tmp_path / "out"))
    assert r.exit_code == 2


def test_round_trip_through_files(db: pagedkv_sql.Database, tmp_path: Path) -> None:
    snap = example()
    db.load_engine(snap)
    out = db.export_engine("flashinfer")
    out.write(tmp_path)
    again = flashinfer.snapshot(
        np.load(tmp_path / "kv_indptr.npy"),
        np.load(tmp_path / "kv_indices.npy"),
        np.load(tmp_path / "kv_last_page_len.npy"),
        16,
    )
    with pagedkv_sql.connect(":memory:") as other:
        other.load_engine(again)
        assert other.resolve_table().num_rows == db.resolve_table().num_rows


def test_export_onto_a_file_is_refused_and_the_file_kept(cli: Any, tmp_path: Path) -> None:
    assert cli("load", str(Path(__file__).parents[2] / "data")).exit_code == 0
    keep = tmp_path / "keep.txt"
    keep.write_bytes(b"precious\n")
    r = cli("export", "flashinfer", "--output", str(keep))
    assert r.exit_code == 2
    assert f"Error: cannot write to {keep}" in r.output and "Traceback" not in r.output
    assert keep.read_bytes() == b"precious\n"


def test_snapshot_files_are_written_whole_or_not_at_all(
    db: pagedkv_sql.Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.load_engine(example())
    snap = db.export_engine("flashinfer").snapshot
    target = tmp_path / "old.npz"
    target.write_bytes(b"old")

    def disk_full(file: Any, **arrays: Any) -> None:
        file.write(b"PK partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(np, "savez", disk_full)
        with pytest.raises(pagedkv_sql.PagedKVError, match="No space left on device"):
            snap.save(target)
    assert target.read_bytes() == b"old"  # the old file is kept, no partial file beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.npz"]
    snap.save(target)
    assert np.load(target)["kv_indptr"].tolist() == snap.arrays["kv_indptr"].tolist()
