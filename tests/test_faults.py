"""Fault injection: full disks, read-only locations, permissions (signals at random moments:
tests/test_faults_signals.py). After each fault the command has failed cleanly (a one-line
error, no traceback) or succeeded, the database opens and holds exactly the old or the new
state, and no stray file is left: not beside the database, not beside an output, not in
the temporary directory.

Full disks are small tmpfs mounts (root, as CI runs) and, everywhere, RLIMIT_FSIZE;
permissions are enforced on root by dropping CAP_DAC_OVERRIDE with setpriv."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pagedkv_sql

from .faults import (
    clean_error,
    cli,
    everything,
    finish,
    fsize_limit,
    no_strays,
    step_log,
    synth_dir,
)
from .helpers import DATA, SEED_OUTPUT

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mounts and setuid need root (CI is root)")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """tmpfs("256k") -> a fresh mount point of that size, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str, *options: str) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        opts = ",".join([f"size={size}", *options])
        run = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True
        )
        if run.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {run.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], check=False)


# root without the capabilities that let it ignore file permissions: another user
NO_OVERRIDE = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")


# -- full disks ----------------------------------------------------------------------


@needs_root
def test_schema_creation_on_a_full_disk_leaves_no_file(
    tmpfs: Callable[..., Path], work: Path
) -> None:
    disk = tmpfs("16k")
    code, _, err = finish(
        cli(["load", str(DATA), "--db", str(disk / "new.duckdb")], work, work / "tmp")
    )
    assert code == 1
    clean_error(err)
    assert err.startswith("Error: cannot ")
    assert "No space left on device" in err or "space" in err.lower(), err
    no_strays(disk, set())
    no_strays(work / "tmp", set())


def test_schema_creation_beyond_the_file_size_limit_leaves_no_file(work: Path) -> None:
    code, _, err = finish(
        cli(
            ["load", str(DATA), "--db", "new.duckdb"], work, work / "tmp", preexec=fsize_limit(4096)
        )
    )
    assert code == 1
    clean_error(err)
    assert "File too large" in err, err
    no_strays(work, {"tmp"})


@needs_root
def test_load_on_a_full_disk_fails_fast_and_keeps_the_old_state(
    tmpfs: Callable[..., Path], work: Path
) -> None:
    disk = tmpfs("2m")
    db = disk / "kv.duckdb"
    with pagedkv_sql.connect(db) as d:
        d.load(DATA)
    before = everything(db)
    big = synth_dir(work / "big", 300)
    code, _, err = finish(cli(["load", str(big), "--db", str(db)], work, work / "tmp"))
    assert code == 1
    clean_error(err)
    assert "No space left on device" in err, err
    assert "malformed" not in err  # the I/O error is reported as one, not diagnosed
    assert everything(db) == before
    with pagedkv_sql.connect(db, read_only=True) as d:
        assert d.resolve_table().num_rows == 7
    no_strays(disk, {"kv.duckdb", "kv.duckdb.wal"})
    with pagedkv_sql.connect(db):  # a writable open checkpoints what is left
        pass
    no_strays(disk, {"kv.duckdb"})
    no_strays(work / "tmp", set())


@pytest.mark.parametrize("command", ["replay", "load", "import", "replay --at"])
def test_a_full_disk_reports_its_real_cause_not_the_rollbacks(
    tmpfs: Callable[..., Path], work: Path, command: str
) -> None:
    """A write that fills the disk, or finds it full, fails with "No space left on
    device" (DuckDB ends the transaction itself; the ROLLBACK after it, saying "cannot
    rollback - no transaction is active", must not hide the cause). The state is kept."""
    disk = tmpfs("3m")
    db = disk / "kv.duckdb"
    log = step_log(work / "run.jsonl", 3000)
    with pagedkv_sql.connect(db) as d:
        d.load(DATA)
        if command == "replay --at":
            d.replay(str(step_log(work / "small.jsonl", 40)))
    before = everything(db)
    if command != "replay":  # already full: the next write cannot even begin
        with contextlib.suppress(OSError), (disk / "fill").open("wb") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    args = {
        "replay": ["replay", str(log)],
        "load": ["load", str(synth_dir(work / "big", 20))],
        "import": ["import", "flashinfer", str(DATA / "engines" / "flashinfer.npz")],
        "replay --at": ["replay", "--at", "39"],
    }[command]
    code, _, err = finish(cli([*args, "--db", str(db)], work, work / "tmp"))
    assert code == 1, err
    clean_error(err)
    assert "No space left on device" in err, err
    assert "cannot rollback" not in err and "no transaction is active" not in err, err
    assert "Current transaction is aborted" not in err, err
    (disk / "fill").unlink(missing_ok=True)
    assert everything(db) == before


@needs_root
def test_resolve_output_on_a_full_disk_leaves_the_old_file(
    tmpfs: Callable[..., Path], work: Path
) -> None:
    db = work / "kv.duckdb"
    with pagedkv_sql.connect(db) as d:
        d.load(synth_dir(work / "big", 200), diagnostics=False)
    disk = tmpfs("256k")
    (disk / "out.tsv").write_text("old\n")
    for fmt in ("tsv", "parquet", "arrow", "json"):
        code, _, err = finish(
            cli(
                ["resolve", "--db", str(db), "-f", fmt, "-o", str(disk / "out.tsv")],
                work,
                work / "tmp",
            )
        )
        assert code == 1, fmt
        clean_error(err)
        assert err == f"Error: cannot write {disk / 'out.tsv'}: No space left on device\n", err
        assert (disk / "out.tsv").read_text() == "old\n"
        no_strays(disk, {"out.tsv"})


@needs_root
def test_synth_on_a_full_disk_writes_all_files_or_none(
    tmpfs: Callable[..., Path], work: Path
) -> None:
    disk = tmpfs("512k")
    code, _, err = finish(
        cli(["synth", str(disk / "out"), "-s", "300", "--mean-length", "1000"], work, work / "tmp")
    )
    assert code == 1
    clean_error(err)
    assert "No space left on device" in err, err
    assert list(disk.iterdir()) == []  # not even the directory it made


def test_stdin_spool_beyond_the_file_size_limit(work: Path) -> None:
    with pagedkv_sql.connect(work / "kv.duckdb") as d:
        d.load(DATA)
    before = everything(work / "kv.duckdb")
    proc = cli(
        ["load", "-", "-r", "virtual_token", "--db", "kv.duckdb"],
        work,
        work / "tmp",
        preexec=fsize_limit(2_000_000),
        stdin=subprocess.PIPE,
    )
    _out, err = proc.communicate("1\t2\t0\t2\n" * 400_000, timeout=300)
    assert proc.returncode == 1
    clean_error(err)
    assert err.startswith(
        f"Error: <stdin>: cannot copy it to a temporary file in {work / 'tmp'}: File too large\n"
    )
    assert everything(work / "kv.duckdb") == before
    no_strays(work / "tmp", set())


# -- read-only locations and other users -------------------------------------------------


@needs_root
def test_a_read_only_mount(tmpfs: Callable[..., Path], work: Path) -> None:
    disk = tmpfs("8m")
    with pagedkv_sql.connect(disk / "kv.duckdb") as d:
        d.load(DATA)
    before = everything(disk / "kv.duckdb")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    db = str(disk / "kv.duckdb")
    code, _, err = finish(cli(["load", str(DATA), "--db", db], work, work / "tmp"))
    assert code == 1
    clean_error(err)
    assert "Read-only file system" in err, err
    assert err.rstrip().endswith(
        "Fix: DuckDB writes the database and a .wal file beside it: the file and its "
        "directory must be writable"
    )
    code, out, err = finish(cli(["resolve", "--db", db], work, work / "tmp"))
    assert (code, out, err) == (0, SEED_OUTPUT, "")
    code, _, err = finish(
        cli(["load", str(DATA), "--db", str(disk / "new.duckdb")], work, work / "tmp")
    )
    assert code == 1
    clean_error(err)
    code, _, err = finish(cli(["synth", str(disk / "out"), "-s", "2"], work, work / "tmp"))
    assert code == 1
    assert err == f"Error: cannot create {disk / 'out'}: Read-only file system\n"
    code, _, err = finish(
        cli(["resolve", "--db", db, "-o", str(disk / "o.tsv")], work, work / "tmp")
    )
    assert code == 2, err  # refused before the query: nothing was done
    assert err.startswith(
        f"Error: --output {disk / 'o.tsv'}: cannot create a file in {disk}: Read-only file "
        "system; nothing was done\n"
    ), err
    assert everything(disk / "kv.duckdb") == before
    no_strays(disk, {"kv.duckdb"})


@needs_root
def test_permissions_root_would_ignore(work: Path) -> None:
    locked = work / "locked"
    locked.mkdir()
    with pagedkv_sql.connect(locked / "kv.duckdb") as d:
        d.load(DATA)
    (locked / "kv.duckdb").chmod(0o666)
    locked.chmod(0o555)  # the database is writable, its directory is not
    before = everything(locked / "kv.duckdb")
    secret = work / "secret"
    shutil.copytree(DATA, secret)
    (secret / "root_table.facts").chmod(0)
    hidden = work / "hidden"
    shutil.copytree(DATA, hidden)
    hidden.chmod(0)
    (work / "mine").mkdir()
    cases = {
        ("load", str(DATA), "--db", str(locked / "kv.duckdb")): "cannot ",
        ("load", str(secret), "--db", "mine/a.duckdb"): (
            f"Error: {secret}/root_table.facts: cannot read it: Permission denied\n"
        ),
        ("load", str(hidden), "--db", "mine/a.duckdb"): (
            f"Error: {hidden}: cannot read it: Permission denied\n"
        ),
        ("load", str(DATA), "--db", str(locked / "new.duckdb")): "cannot ",
    }
    for args, expected in cases.items():
        code, _, err = finish(cli(list(args), work, work / "tmp", prefix=NO_OVERRIDE))
        assert code == 1, (args, err)
        clean_error(err)
        assert err.startswith(expected) if expected.startswith("Error") else expected in err
    assert everything(locked / "kv.duckdb") == before
    no_strays(locked, {"kv.duckdb"})
    no_strays(work / "mine", set())
    code, out, err = finish(
        cli(["resolve", "--db", str(locked / "kv.duckdb")], work, work / "tmp", prefix=NO_OVERRIDE)
    )
    assert (code, out) == (0, SEED_OUTPUT), err


def _events(path: Path, batches: int) -> Path:
    import msgspec

    enc = msgspec.msgpack.Encoder()
    with path.open("wb") as f:
        for s in range(batches):
            hashes = list(range(20 * s, 20 * s + 20))
            f.write(enc.encode([1.0, [{"type": "BlockStored", "block_hashes": hashes}], 0]))
    return path


def test_kv_events_and_watch_beyond_the_file_size_limit_name_the_real_error(work: Path) -> None:
    events = _events(work / "ev.msgpack", 20_000)
    code, _, err = finish(
        cli(["kv-events", str(events), "--db", "k.duckdb"], work, work / "tmp",
            preexec=fsize_limit(2_000_000))
    )  # fmt: skip
    assert code == 1
    clean_error(err)
    assert err.startswith("Error: cannot store the events in k.duckdb: IO Error: "), err
    assert "File too large" in err and "Current transaction is aborted" not in err, err
    assert "ev.msgpack" not in err  # the input is not blamed
    no_strays(work, {"tmp", "ev.msgpack"})
    code, _, err = finish(
        cli(["watch", str(events), "--db", "w.duckdb"], work, work / "tmp",
            preexec=fsize_limit(2_000_000))
    )  # fmt: skip
    assert code == 1
    last = err.splitlines()[-2]
    # the write that passes the limit, or the commit after it (as the disk's timing falls)
    stored = "Error: cannot store what was watched in w.duckdb: "
    assert last.startswith(
        (stored + "IO Error: ", stored + "TransactionContext Error: Failed to commit: ")
    ), err
    assert "File too large" in last and "ev.msgpack" not in last, err
    # what a commit stored before the limit (every 0.5 s: none when the file is read and
    # stored in one go) stays, and the error says how much
    said = re.search(r"\((\d+) event row\(s\) committed before it are kept\)", last)
    kept = int(said[1]) if said else 0
    if kept:
        assert len(everything(work / "w.duckdb")["engine_kv_event"]) == kept, err
    else:  # a database the watch created and stored nothing in is not left behind
        assert not (work / "w.duckdb").exists(), err
