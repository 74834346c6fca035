"""filesets.py: a set of files whole or not at all; drafts of killed writers swept (a real
SIGKILL), a live writer's never; a set that replaces nothing; directories made for a set
removed when it fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_sql import filesets
from pagedkv_sql.errors import PagedKVError, UsageError

from .helpers import ROOT


def test_a_file_set_replaces_its_names_only_and_leaves_no_draft(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "rel" / "x=1").mkdir(parents=True)
    (out / "rel" / "x=1" / "old.parquet").write_text("old")
    (out / "rel" / "x=2").mkdir()
    (out / "a.facts").write_text("old a")
    (out / "notes.txt").write_text("mine")
    with filesets.file_set(out, ["a.facts", "rel/x=1", "b.facts"]) as draft:
        (draft / "a.facts").write_text("new a")
        (draft / "b.facts").write_text("new b")
        (draft / "rel" / "x=1").mkdir(parents=True)
        (draft / "rel" / "x=1" / "data.parquet").write_text("new")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "a.facts",
        "b.facts",
        "notes.txt",
        "rel",
        "rel/x=1",
        "rel/x=1/data.parquet",
        "rel/x=2",
    ]
    assert (out / "a.facts").read_text() == "new a" and (out / "notes.txt").read_text() == "mine"


def test_a_file_set_that_fails_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.facts").write_text("old a")
    (out / "b.facts").mkdir()  # a file cannot take a directory's place: refused first
    refused = pytest.raises(PagedKVError, match=r"cannot write .*b\.facts: Is a directory")
    with refused, filesets.file_set(out, ["a.facts", "b.facts"]) as draft:
        (draft / "a.facts").write_text("new a")
        (draft / "b.facts").write_text("new b")
    for error in (KeyboardInterrupt, OSError):
        with pytest.raises(error), filesets.file_set(out, ["a.facts"]) as draft:
            (draft / "a.facts").write_text("new a")
            raise error()
    assert sorted(p.name for p in out.iterdir()) == ["a.facts", "b.facts"]
    assert (out / "a.facts").read_text() == "old a"


def test_a_file_set_without_names_swaps_the_whole_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.npy").write_text("old")
    with filesets.file_set(out) as draft:
        assert draft.parent == tmp_path and draft.name.startswith(".out.")
        (draft / "new.npy").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["new.npy"]
    with filesets.file_set(tmp_path / "fresh") as draft:
        (draft / "one.npy").write_text("1")
    assert (tmp_path / "fresh" / "one.npy").read_text() == "1"
    assert not (out / filesets.DRAFT_MARKER).exists()  # the draft's marker stays behind


# a writer that stops inside its set until killed: the draft is there, marked and locked
WRITER = """
import sys, time
from pagedkv_sql.filesets import file_set
names = None if sys.argv[2] == "whole" else ["a.facts"]
with file_set(sys.argv[1], names) as draft:
    (draft / "a.facts").write_text("half")
    print(draft.name, flush=True)
    time.sleep(120)
"""


def _writer(target: Path, mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.mark.parametrize("mode", ["names", "whole"])
def test_the_draft_of_a_killed_writer_is_swept_by_the_next_and_a_live_ones_never(
    tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    where = out if mode == "names" else tmp_path
    killed, dead_draft = _writer(out, mode)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    killed.stdout.close()  # type: ignore[union-attr]
    assert (where / dead_draft).is_dir()  # what a SIGKILL leaves
    alive, live_draft = _writer(out, mode)
    try:
        # a lookalike nobody marked (another program's, an older pagedkv's): never touched
        (where / dead_draft.replace(dead_draft[-17:-5], "0" * 12)).mkdir()
        with filesets.file_set(out, None if mode == "whole" else ["b.facts"]) as draft:
            (draft / "b.facts").write_text("whole")
        assert not (where / dead_draft).exists()
        assert (where / live_draft / "a.facts").read_text() == "half"
        assert (where / dead_draft.replace(dead_draft[-17:-5], "0" * 12)).is_dir()
        assert (out / "b.facts").read_text() == "whole"
    finally:
        alive.kill()
        alive.wait()
        alive.stdout.close()  # type: ignore[union-attr]


def test_a_set_that_replaces_nothing_refuses_any_name_there_and_a_linked_directory(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "a.facts").symlink_to(outside / "planted.txt")  # dangling: exists() says False
    with (
        pytest.raises(UsageError, match=r"already has a\.facts; nothing was written"),
        filesets.file_set(out, ["a.facts"], replace=False),
    ):
        pass
    (out / "a.facts").unlink()
    (out / "engines").symlink_to(outside)
    with (
        pytest.raises(UsageError, match=r"engines: a symbolic link where a directory of the set"),
        filesets.file_set(out, ["engines/x.npz"], replace=False),
    ):
        pass
    assert list(outside.iterdir()) == []
    # a name that appears while the set is written is not replaced either
    (out / "engines").unlink()
    with (
        pytest.raises(UsageError, match=r"already has b\.facts"),
        filesets.file_set(out, ["a.facts", "b.facts"], replace=False) as draft,
    ):
        (draft / "a.facts").write_text("mine")
        (draft / "b.facts").write_text("mine")
        (out / "b.facts").write_text("theirs")
    assert (out / "b.facts").read_text() == "theirs"
    assert sorted(p.name for p in out.iterdir()) == ["a.facts", "b.facts"]  # a moved first


def test_a_directory_made_for_a_set_goes_when_the_set_fails(tmp_path: Path) -> None:
    target = tmp_path / "made" / "deeper"
    with pytest.raises(KeyboardInterrupt), filesets.new_directory(target) as made:
        assert made.is_dir()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(OSError), filesets.new_directory(tmp_path / "mine"):
        raise OSError("full")
    assert (tmp_path / "mine").is_dir()  # not made by it: kept
    (tmp_path / "file").write_text("")
    with (
        pytest.raises(UsageError, match="exists and is not a directory"),
        filesets.new_directory(tmp_path / "file"),
    ):
        pass
