"""errors.py: the error hierarchy and the values it carries."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv_sql.errors import Problem, Violation


def test_problems_and_violations_are_immutable_values() -> None:
    """A caller may keep the problems of a refused load in a set, or pass a violation on:
    neither can be changed under it."""
    a = Problem("f.facts", 3, 7, "invalid number")
    assert {a, Problem("f.facts", 3, 7, "invalid number")} == {a}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.line = 4  # type: ignore[misc]
    v = Violation("spec_unaligned_base", "block_table_entry", {"base": 1}, "not aligned")
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.reason = "fine"  # type: ignore[misc]
