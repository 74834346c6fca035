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
