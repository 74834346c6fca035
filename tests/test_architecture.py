"""docs/architecture.md is the map a newcomer reads first (issue 24): it names every module
of the package and every SQL file, so a room added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "architecture.md"


def _rooms() -> list[str]:
    package = ROOT / "pagedkv_sql"
    modules = [p.relative_to(package).as_posix() for p in sorted(package.rglob("*.py"))]
    sql = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "sql").glob("*.sql"))]
    return modules + sql


@pytest.mark.parametrize("room", _rooms())
def test_every_module_and_sql_file_is_on_the_map(room: str) -> None:
    assert f"`{room}`" in MAP.read_text(encoding="utf-8"), f"add {room} to docs/architecture.md"


def test_the_map_names_no_room_that_is_gone() -> None:
    named = re.findall(r"`([A-Za-z_][\w/]*\.(?:py|sql))`", MAP.read_text(encoding="utf-8"))
    gone = sorted(
        n for n in set(named) if not (ROOT / n).exists() and not (ROOT / "pagedkv_sql" / n).exists()
    )
    assert gone == [], f"docs/architecture.md names files that do not exist: {gone}"
