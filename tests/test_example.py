"""example.py and `pagedkv-sql example DIR`: the README's data from an installed package
(the wheel itself is tested in test_packaging.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .helpers import DATA, Cli


def test_example_writes_the_readme_data_and_replaces_nothing(cli: Cli) -> None:
    made: Any = cli("example", "data")
    assert made.exit_code == 0, made.stderr
    for name in ("virtual_token.facts", "engines/flashinfer.npz"):
        assert (cli.cwd / "data" / name).read_bytes() == (DATA / name).read_bytes()
    (cli.cwd / "data" / "root_table.facts").write_text("1\t2\n")  # the user's own edit
    again: Any = cli("example", "data")
    assert again.exit_code == 2
    assert again.stderr.startswith("Error: data already has root_table.facts, ")
    assert (cli.cwd / "data" / "root_table.facts").read_text() == "1\t2\n"
    loaded: Any = cli("load", "data")
    assert loaded.exit_code == 0, loaded.stderr


def test_example_refuses_a_file_where_its_directory_goes(cli: Cli) -> None:
    Path(cli.cwd / "taken").write_text("mine\n")
    result: Any = cli("example", "taken")
    assert result.exit_code == 2 and "taken is not a directory" in result.stderr
    assert (cli.cwd / "taken").read_text() == "mine\n"


def test_example_refuses_an_empty_directory_name(cli: Cli) -> None:
    """`example ""` (an unset variable) never means the current directory."""
    result: Any = cli("example", "")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: DIR is empty (an unset variable?); nothing was")
    assert list(cli.cwd.iterdir()) == []


def test_example_never_writes_through_a_link_planted_in_its_directory(cli: Cli) -> None:
    """A dangling symlink at one of its names (Path.exists() says False), or an `engines`
    symlink to another directory: refused, and nothing is written anywhere."""
    outside = cli.cwd / "outside"
    outside.mkdir()
    target = cli.cwd / "ex"
    target.mkdir()
    (target / "root_table.facts").symlink_to(outside / "clobbered.txt")
    planted: Any = cli("example", "ex")
    assert planted.exit_code == 2
    assert planted.stderr.startswith("Error: ex already has root_table.facts; nothing was")
    (target / "root_table.facts").unlink()
    (target / "engines").symlink_to(outside)
    linked: Any = cli("example", "ex")
    assert linked.exit_code == 2
    assert linked.stderr.startswith("Error: ex/engines: a symbolic link where a directory")
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in target.iterdir()) == ["engines"]


def test_example_on_a_full_disk_leaves_nothing_and_the_rerun_works(cli: Cli) -> None:
    """A write that fails half way (here the file size limit: EFBIG, as a full disk's
    ENOSPC) leaves no file, no draft and no directory it made; the rerun then works."""
    import subprocess
    import sys

    from .faults import fsize_limit

    command = [sys.executable, "-m", "pagedkv_sql", "example", "demo/data"]
    full = subprocess.run(
        command, cwd=cli.cwd, capture_output=True, text=True, preexec_fn=fsize_limit(1024)
    )
    assert full.returncode == 1
    assert full.stderr.startswith("Error: cannot write demo/data/engines/flashinfer.npz: File")
    assert "Traceback" not in full.stderr
    assert list(cli.cwd.iterdir()) == []
    again = subprocess.run(command, cwd=cli.cwd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (cli.cwd / "demo" / "data" / "engines" / "flashinfer.npz").stat().st_size > 1024
