"""The catalogue of invariants (pagedkv_sql/invariants.py): every check of every model has a
line, every line is checked by some model, and what lists invariants derives from it."""

from __future__ import annotations

import re

import pytest

from pagedkv_sql import invariants, sqlfiles
from pagedkv_sql.engines import fastcheck_rules
from pagedkv_sql.invariants import CATALOGUE, ENGINE, FASTCHECK, LIVE, REPLAY, SPEC
from pagedkv_sql.live import checker


def model_checks() -> dict[str, set[str]]:
    """Every check each model has, read from its own source: the views of
    sql/constraints.sql and sql/engines.sql, the fast check's rules, replay's queries, the
    live checker's kinds."""
    constraints = {s.name for s in sqlfiles.statements_in("constraints.sql")}
    engines = {s.name for s in sqlfiles.statements_in("engines.sql")}
    replay = {s.name for s in sqlfiles.statements_in("replay.sql")}
    return {
        SPEC: {n for n in constraints if re.fullmatch(r"(spec|diag)_\w+", n)},
        ENGINE: {n for n in engines if n.startswith("diag_engine_")},
        FASTCHECK: {rule.__name__ for rule in fastcheck_rules.CHECKS},
        REPLAY: {n.removeprefix("replay_check_") for n in replay if n.startswith("replay_check_")},
        LIVE: set(checker.CHECKS),
    }


@pytest.mark.parametrize("model", invariants.MODELS)
def test_every_check_of_every_model_has_one_line_in_the_catalogue(model: str) -> None:
    named = [name for name, _ in invariants.checks(model)]
    assert len(named) == len(set(named)), f"a {model} check named by two ideas"
    assert set(named) == model_checks()[model]


def test_every_idea_is_checked_by_some_model_and_named_once() -> None:
    names = [inv.name for inv in CATALOGUE]
    assert len(names) == len(set(names))
    for inv in CATALOGUE:
        assert inv.models(), inv.name
        assert inv.severity in ("error", "warning"), inv.name
        assert set(inv.causes) <= set(invariants.BY_NAME), inv.name
        assert all(invariants.BY_NAME[c].rank < inv.rank for c in inv.causes), inv.name


def test_the_spec_constraints_are_the_errors() -> None:
    errors = {c for inv in CATALOGUE if inv.severity == "error" for c in inv.checks[SPEC]}
    assert errors == {n for n in model_checks()[SPEC] if n.startswith("spec_")}


def test_a_check_is_looked_up_to_its_idea_and_rank() -> None:
    assert invariants.idea_of(REPLAY, "double_free").name == "double_free"
    assert invariants.idea_of(ENGINE, "diag_engine_lock_ref").name == "ref_count"
    assert invariants.rank_of(REPLAY, "double_free") < invariants.rank_of(REPLAY, "stale_token")
    assert invariants.rank_of(REPLAY, "no_such_check") > max(i.rank for i in CATALOGUE)
    with pytest.raises(KeyError):
        invariants.idea_of(SPEC, "no_such_check")


def test_the_synth_faults_are_the_catalogues() -> None:
    from pagedkv_sql.replay import synth

    assert set(synth.FAULTS) == set(invariants.faults())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_fuzz_plants_are_the_catalogues(engine: str) -> None:
    import importlib

    module = importlib.import_module(f"pagedkv_sql.fuzz.{engine}")
    assert set(module.PLANTS) == set(invariants.plants(engine))
