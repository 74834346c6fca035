"""The values the API returns cannot be changed under their holder: `frozen=True` on the
public results and on the packaged statements is API. tools/mutate.toml runs this file
first for what check.py, load.py and sqlfiles.py run at import (their dataclass
declarations), so a dropped `frozen` dies in a second."""

from __future__ import annotations

import dataclasses

import pytest

import pagedkv_sql
from pagedkv_sql import sqlfiles

from .conftest import DATA


def test_the_packaged_statements_are_immutable_values() -> None:
    """One cached dict of them serves the whole process."""
    stats = sqlfiles.load_all()["stats"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.sql = "SELECT 1"  # type: ignore[misc]


def test_what_load_and_check_return_are_immutable_values(db: pagedkv_sql.Database) -> None:
    """A load's report, a check's report and their parts."""
    loaded = db.load(DATA)
    checked = db.check()
    assert checked.errors == 0 and loaded.relations[0].rows_read > 0
    parts = [
        (loaded, "warnings"),
        (loaded.relations[0], "rows_read"),
        (checked, "results"),
        (checked.results[0], "count"),
        (checked.results[0].check, "severity"),
    ]
    for value, name in parts:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
