"""export flashinfer / vllm: the engine's own arrays from the stored relations, and the
sequences they cannot hold refused with the reason."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import flashinfer, trtllm
from pagedkv_sql.engines.tables import Pool, write

from .example import example
from .helpers import BLOCK, NUM_BLOCKS, state, vllm_snapshot
from .snapshots import csr_arrays


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


@pytest.mark.parametrize("name", ["vllm", "flashinfer"])
def test_export_keeps_a_block_size_other_than_16(db: pagedkv_sql.Database, name: str) -> None:
    snap = vllm_snapshot()
    snap.meta["block_size"] = 32
    db.load_engine(snap)
    out = db.export_engine(name)
    assert out.snapshot.meta["block_size"] == 32
    assert out.refused == []


def test_export_refuses_what_an_engine_array_cannot_hold(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # seq 1: block 1 at two GPU bases; seq 2: tokens but no root_table row; seq 3: a block
    # table but no token
    tokens = [(s, p, p // 16, p % 16) for s in (1, 2) for p in range(20)]
    entries = [(100, 0, 256, 1), (100, 1, 512, 1), (100, 1, 768, 1), (300, 0, 1024, 1)]
    db.load(
        facts_dir(
            {
                "root_table": [(1, 100), (3, 300)],
                "block_table_entry": entries,
                "virtual_token": tokens,
            }
        )
    )
    out = db.export_engine("vllm")
    assert out.refused == [
        (1, None, "block 1 has 2 different GPU bases"),
        (2, None, "no root_table row (no block table)"),
        (3, None, "no tokens"),
    ]


def test_export_of_nothing_is_empty_arrays(db: pagedkv_sql.Database) -> None:
    arrays = db.export_engine("flashinfer").snapshot.arrays
    assert arrays["kv_indptr"].tolist() == [0]
    assert arrays["kv_indices"].size == 0
    assert arrays["kv_last_page_len"].size == 0
    arrays = db.export_engine("vllm").snapshot.arrays
    assert [arrays[a].size for a in ("block_table", "num_blocks_per_row", "slot_mapping")] == [
        0,
        0,
        0,
    ]


def test_export_writes_into_a_directory_it_creates(
    db: pagedkv_sql.Database, tmp_path: Path
) -> None:
    db.load_engine(vllm_snapshot())
    written = db.export_engine("vllm").write(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "vllm.npz") in written


def test_export_keeps_engine_block_0(db: pagedkv_sql.Database) -> None:
    indptr, _, last = csr_arrays()
    db.load_engine(flashinfer.snapshot(indptr, np.array([0, 7, 2], np.int32), last, BLOCK))
    arrays = db.export_engine("flashinfer").snapshot.arrays
    assert arrays["kv_indices"].tolist() == [0, 7, 2]
    assert "pagedkv_page_base" not in arrays


def test_export_dense_ids_up_to_the_int32_limit(
    db: pagedkv_sql.Database, facts_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three distinct bases numbered from 0 fit a limit of 3, from 1 (vLLM) do not
    from pagedkv_sql.engines import export

    rows = [(100, i, 0x10000 * (i + 1), 1) for i in range(3)]
    tokens = [(1, p, p // 16, p % 16) for p in range(48)]
    db.load(
        facts_dir({"root_table": [(1, 100)], "block_table_entry": rows, "virtual_token": tokens})
    )
    monkeypatch.setattr(export, "INT32_MAX", 3)
    assert db.export_engine("flashinfer").snapshot.arrays["kv_indices"].tolist() == [0, 1, 2]
    with pytest.raises(pagedkv_sql.PagedKVError, match="3 distinct blocks do not fit int32"):
        db.export_engine("vllm")


def test_export_tells_a_swapped_block_from_a_page_fault(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # seq 1 lacks block 1 anywhere; seq 2 has its block 1 swapped to the CPU
    tokens = [(s, p, p // 16, p % 16) for s in (1, 2) for p in range(20)]
    db.load(
        facts_dir(
            {
                "root_table": [(1, 100), (2, 200)],
                "block_table_entry": [(100, 0, 256, 1), (200, 0, 512, 1)],
                "swapped_block": [(200, 1, 4096)],
                "virtual_token": tokens,
            }
        )
    )
    assert db.export_engine("vllm").refused == [
        (1, None, "page fault: block 1 (tokens 16..) is neither resident nor swapped"),
        (2, None, "swapped: block 1 is on the CPU (swapped_block), not resident"),
    ]


def test_export_numbers_densely_bases_off_the_pool_s_block_step(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # pool 0 steps 512 bytes a block; a sequence appended at base 256 is on no block
    st = state({"req-a": [1]})
    st.pools = [Pool(0, "kv", block_bytes=512, num_blocks=NUM_BLOCKS)]
    write(db.con, st, "512-byte blocks")
    tokens = [(5, p, 0, p) for p in range(16)]
    db.load(
        facts_dir(
            {
                "root_table": [(5, 500)],
                "block_table_entry": [(500, 0, 256, 1)],
                "virtual_token": tokens,
            }
        ),
        append=True,
    )
    arrays = db.export_engine("vllm").snapshot.arrays
    assert arrays["pagedkv_block_base"].tolist() == [256, 512]


def test_export_numbers_densely_a_base_below_the_pool(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # a sequence appended after an import with a base below the pool's base (block id -1)
    db.load_engine(vllm_snapshot())
    tokens = [(5, p, 0, p) for p in range(16)]
    db.load(
        facts_dir(
            {
                "root_table": [(5, 500)],
                "block_table_entry": [(500, 0, -256, 1)],
                "virtual_token": tokens,
            }
        ),
        append=True,
    )
    arrays = db.export_engine("vllm").snapshot.arrays
    assert arrays["pagedkv_block_base"].tolist()[0] == -256
    assert arrays["block_table"].min() >= 0


@pytest.mark.parametrize("name", ["vllm", "flashinfer"])
def test_export_without_a_stored_block_size_uses_16(db: pagedkv_sql.Database, name: str) -> None:
    # a database whose settings lost the row (an old or hand-edited file)
    db.load_engine(vllm_snapshot())
    db.con.execute("DELETE FROM pagedkv_settings WHERE name = 'block_size'")
    assert db.export_engine(name).snapshot.meta["block_size"] == 16


# -- an export never writes over the database, and is one set or none ----------------------


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative name -> bytes), to prove nothing changed."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def small(n: int) -> Any:
    """A FlashInfer snapshot of ``n`` one-page sequences (different n, different set)."""
    return flashinfer.snapshot(
        np.arange(n + 1, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        np.full(n, 3, np.int32),
        16,
    )


@pytest.mark.parametrize(
    "name",
    ["flashinfer.npz", "kv_indptr.npy", "vllm.npz", "slot_mapping.npy", "notes.duckdb"],
)
def test_export_into_the_databases_directory_never_touches_it(
    cli: Any, tmp_path: Path, name: str
) -> None:
    """The database under one of the names an export writes (or any other name) in the
    output directory: refused, the database and its directory as they were."""
    out = tmp_path / "ex"
    out.mkdir()
    database = out / name
    assert (
        cli("load", str(Path(__file__).parents[2] / "data"), "--db", str(database)).exit_code == 0
    )
    before = tree(out)
    for engine in ("flashinfer", "vllm"):
        r = cli("export", engine, "--db", str(database), "-o", str(out))
        assert r.exit_code == 2, r.output
        assert "Error: refusing to" in r.output and "Traceback" not in r.output
        # refused before the export's work: no "refused: seq_id ..." first
        assert r.output.startswith("Error: refusing to"), r.output
    assert tree(out) == before
    assert cli("resolve", "--db", str(database)).exit_code == 0


def test_export_refuses_a_link_to_the_database(db: pagedkv_sql.Database, tmp_path: Path) -> None:
    """A symlink or a hard link to the database under an export's name: refused, by the
    library too (``Export.write(DIR, database=...)``)."""
    base = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(base) as file_db:
        file_db.load_engine(example())
        export = file_db.export_engine("flashinfer")
    for how in ("symlink", "hardlink"):
        out = tmp_path / how
        out.mkdir()
        link = out / "flashinfer.npz"
        link.symlink_to(base) if how == "symlink" else os.link(base, link)
        with pytest.raises(pagedkv_sql.UsageError, match=r"refusing to write .*the database"):
            export.write(out, database=str(base))
        with pytest.raises(pagedkv_sql.UsageError, match="refusing to export into"):
            export.write(out)  # without the database's name: not an export's file either
        assert os.path.samefile(link, base)
    with pytest.raises(pagedkv_sql.UsageError, match="it is the database"):
        export.write(base, database=str(base))  # the directory named is the database
    with pagedkv_sql.connect(base, read_only=True) as again:
        assert again.stats()


def test_export_into_a_directory_of_other_files_is_refused(
    db: pagedkv_sql.Database, tmp_path: Path
) -> None:
    db.load_engine(example())
    export = db.export_engine("flashinfer")
    for name, data in [("notes.txt", b"mine"), ("kv_indptr.npy", b"not numpy"), ("sub/x", b"")]:
        out = tmp_path / name.replace("/", "_")
        (out / name).parent.mkdir(parents=True)
        (out / name).write_bytes(data)
        with pytest.raises(pagedkv_sql.UsageError, match="refusing to export into"):
            export.write(out)
        assert (out / name).read_bytes() == data


def test_an_export_replaces_the_set_and_keeps_the_other_engines(
    db: pagedkv_sql.Database, tmp_path: Path
) -> None:
    """flashinfer then vllm into one directory: both sets; flashinfer again with other
    data: its set is exactly the new one (an array the new set lacks is gone), vllm's
    kept; no draft is left beside the directory."""
    out = tmp_path / "out"
    with pagedkv_sql.connect() as facts:  # dense ids: the set has pagedkv_page_base.npy
        facts.sql("INSERT INTO root_table VALUES (1, 100)")
        facts.sql("INSERT INTO block_table_entry VALUES (100, 0, 4096, 1)")
        facts.sql("INSERT INTO virtual_token VALUES (1, 0, 0, 0)")
        facts.export_engine("flashinfer").write(out)
    assert (out / "pagedkv_page_base.npy").exists()
    db.load_engine(example())
    db.export_engine("vllm").write(out)
    vllm_files = {n: b for n, b in tree(out).items() if n.startswith(("block", "num", "slot", "v"))}
    db.export_engine("flashinfer").write(out)
    files = tree(out)
    assert not (out / "pagedkv_page_base.npy").exists()
    assert np.load(out / "kv_indices.npy").tolist() == [5, 7, 9, 5, 2, 11]
    assert all(files[n] == b for n, b in vllm_files.items())
    manifest = json.loads(files[".pagedkv-export.json"])
    assert sorted(manifest["sets"]) == ["flashinfer", "vllm"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5])
def test_a_full_disk_at_any_file_leaves_the_old_set(
    db: pagedkv_sql.Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """ENOSPC at the 1st..3rd array, at the .npz, at the manifest: the old set, byte for
    byte, and nothing beside it."""
    out = tmp_path / "out"
    db.load_engine(small(2))
    db.export_engine("flashinfer").write(out)
    before = tree(tmp_path)
    with pagedkv_sql.connect() as other:
        other.load_engine(small(20))
        export = other.export_engine("flashinfer")
    calls = []
    real_atomic = pagedkv_sql.paths.atomic_output

    @contextlib.contextmanager
    def atomic(path: Any) -> Any:
        calls.append(path)
        with real_atomic(path) as f:
            if len(calls) == fail_at:
                f.write(b"partial")
                raise OSError(errno.ENOSPC, "No space left on device")
            yield f

    monkeypatch.setattr("pagedkv_sql.engines.export.atomic_output", atomic)
    monkeypatch.setattr("pagedkv_sql.engines.snapshot.atomic_output", atomic)
    with pytest.raises(pagedkv_sql.PagedKVError, match="No space left on device; it was left"):
        export.write(out)
    assert tree(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


KILLED_EXPORT = """
import os, signal, sys
import numpy as np
import pagedkv_sql
from pagedkv_sql.engines import flashinfer
n, at = int(sys.argv[2]), int(sys.argv[3])
with pagedkv_sql.connect() as db:
    db.load_engine(flashinfer.snapshot(np.arange(n + 1, dtype=np.int32),
        np.arange(n, dtype=np.int32), np.full(n, 3, np.int32), 16))
    export = db.export_engine("flashinfer")
real, calls = os.fsync, []
def fsync(fd):
    calls.append(fd)
    if len(calls) == at:
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd)
os.fsync = fsync
export.write(sys.argv[1])
"""


@pytest.mark.parametrize("at", [1, 4, 7, 10, 11, 12])
def test_a_kill_at_any_point_leaves_the_old_set_or_the_new(tmp_path: Path, at: int) -> None:
    """SIGKILL at the k-th of its 12 fsyncs (each array, the npz, the manifest, the
    draft directory, the parent after the swap): the directory holds the old set or the
    new one, whole; the next export clears what the killed one left beside it."""
    import subprocess
    import sys

    out = tmp_path / "out"
    subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(out), "2", "0"], check=True)
    old = tree(out)
    code = subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(out), "20", str(at)]).returncode
    assert code == -9
    now = tree(out)
    n = np.load(out / "flashinfer.npz")["kv_indptr"].size - 1
    assert n in (2, 20)
    if n == 2:
        assert now == old
    else:
        assert (
            np.load(out / "kv_indptr.npy").size == 21 and np.load(out / "kv_indices.npy").size == 20
        )
    subprocess.run([sys.executable, "-c", KILLED_EXPORT, str(out), "5", "0"], check=True)
    assert np.load(out / "kv_indices.npy").size == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
