"""docs/cli.md, the command reference, is the CLI's `--help` as it is now: written by
`make docs` (tools/cli_reference.py), as tests/cli_help.txt is by tests/test_cli_help.py."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from .conftest import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools/cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_the_cli_help_now() -> None:
    expected = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert _generator().render() == expected, "docs/cli.md is stale: run `make docs`"


def test_the_reference_has_a_section_for_every_command_of_the_golden_help() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    golden = (ROOT / "tests" / "cli_help.txt").read_text(encoding="utf-8")
    for title in (line[4:-7] for line in golden.splitlines() if line.endswith(" --help")):
        assert f"\n## {title}\n" in reference, title
