from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql

from .helpers import DATA, Cli, Facts, write_facts


def pytest_report_header() -> list[str]:
    return [f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}"]


@pytest.fixture
def db() -> Iterator[pagedkv_sql.Database]:
    """An in-memory database with the schema."""
    with pagedkv_sql.connect(":memory:") as database:
        yield database


@pytest.fixture
def facts_dir(tmp_path: Path) -> Callable[..., Path]:
    """A factory: facts_dir({"root_table": [(1, 100)]}, fmt="csv") -> a directory."""
    counter = iter(range(1_000_000))

    def make(facts: Facts, fmt: str = "facts") -> Path:
        return write_facts(tmp_path / f"facts{next(counter)}", facts, fmt)

    return make


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    shutil.copytree(DATA, target)
    return target


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.delenv("PAGEDKV_DB", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    return Cli(work)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A world-readable directory (so that `nobody` can reach the venv's files and this)."""
    path = tmp_path / "work"
    path.mkdir()
    for p in (tmp_path, path):
        p.chmod(0o755)
    (path / "tmp").mkdir()
    (path / "tmp").chmod(0o1777)
    return path
