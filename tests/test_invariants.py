"""The catalogue of invariants (pagedkv_sql/invariants.py): every check of every model has a
line, every line is checked by some model, and what lists invariants derives from it."""

from __future__ import annotations

import re
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql import invariants, sqlfiles
from pagedkv_sql.engines import fastcheck_rules
from pagedkv_sql.invariants import CATALOGUE, ENGINE, FASTCHECK, FLEET, LIVE, REPLAY, SPEC
from pagedkv_sql.live import checker

from . import conformance
from .plants import PLANTS


def model_checks() -> dict[str, set[str]]:
    """Every check each model has, read from its own source: the views of
    sql/constraints.sql and sql/engines.sql, the fast check's rules, replay's queries, the
    live checker's kinds."""
    constraints = {s.name for s in sqlfiles.statements_in("constraints.sql")}
    engines = {s.name for s in sqlfiles.statements_in("engines.sql")}
    replay = {s.name for s in sqlfiles.statements_in("replay.sql")}
    fleet = {s.name for s in sqlfiles.statements_in("fleet.sql")}
    return {
        SPEC: {n for n in constraints if re.fullmatch(r"(spec|diag)_\w+", n)},
        ENGINE: {n for n in engines if n.startswith("diag_engine_")},
        FASTCHECK: {rule.__name__ for rule in fastcheck_rules.CHECKS},
        REPLAY: {n.removeprefix("replay_check_") for n in replay if n.startswith("replay_check_")},
        LIVE: set(checker.CHECKS),
        FLEET: {n.removeprefix("fleet_check_") for n in fleet if n.startswith("fleet_check_")},
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


# -- conformance: each idea planted once, found by every model that claims it -----------------
def _conformance_ids() -> list[tuple[str, str]]:
    return [(inv.name, m) for inv in CATALOGUE for m in inv.models()]


def test_every_idea_has_a_plant() -> None:
    assert set(PLANTS) == {inv.name for inv in CATALOGUE}


@pytest.mark.parametrize(
    ("idea", "model"), _conformance_ids(), ids=[f"{i}-{m}" for i, m in _conformance_ids()]
)
def test_every_model_that_claims_an_idea_finds_its_plant(idea: str, model: str) -> None:
    """The idea planted once (tests/conformance.py); the model finds it with one of the
    checks the catalogue names for it, at the plant's step (models that have steps), naming
    the plant's request and block (where the model names requests or blocks)."""
    plant = PLANTS[idea]
    found = conformance.found(plant, model)
    mine = [f for f in found if f.check in conformance.checks_of(model, idea)]
    assert mine, f"{model} found no {idea} in its plant: {found}"
    for f in mine:
        if model in (REPLAY, SPEC) and plant.step is not None and f.step is not None:
            assert f.step == plant.step, f
        if plant.request is not None and f.requests:
            assert plant.request in f.requests, f
        if plant.block is not None and f.blocks:
            assert plant.block in f.blocks, f
    if model == REPLAY:  # the first finding is the plant's idea, or a cause of it
        first = invariants.idea_of(REPLAY, found[0].check).name
        assert first == idea or first in invariants.BY_NAME[idea].causes, found


@pytest.mark.parametrize("fault", sorted(invariants.faults()))
def test_each_synth_fault_is_found_by_replay_as_its_idea_at_its_step(fault: str) -> None:
    from pagedkv_sql.replay import synth

    cfg = synth.StepSynthConfig(
        steps=60, num_gpu_blocks=256, output_tokens=8, faults=((fault, 40),)
    )
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(_events(cfg))
    first = report.findings[0]
    assert first.step == 40, report.findings[:3]
    assert first.invariant == invariants.planted_by("fault", fault).name, first


def _events(cfg: Any) -> Any:
    """A synthetic log's event table (what synth-log writes as .parquet)."""
    from pagedkv_sql.replay import synth
    from pagedkv_sql.replay.log import Builder

    builder = Builder(synth.header(cfg))
    for step in synth.steps(cfg):
        builder.step(step)
    return builder.table()
