"""errors.py: the error hierarchy and the values it carries."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv_sql.errors import Problem, Violation

# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- errors.py -----------------------------------------------------------------------------
# (from tests/test_mutation_kills.py)


# killed a mutant of errors.py (mutation run, 2026-11-30)
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
