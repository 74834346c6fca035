"""The step log's published JSON Schema (pagedkv_sql/replay/step-log.schema.json,
for engine authors who write logs themselves) says what the reader reads: every line a
synthetic log with every fault writes and docs/replay.md's examples are valid, lines the
reader refuses for their shape are not, and its keys and operations are the reader's."""

from __future__ import annotations

import io
import json
import re
from importlib import resources
from typing import Any

import pytest

from pagedkv_sql.replay.header import HEADER_KEY, STEP_KEYS, STEP_OPS, Header
from pagedkv_sql.replay.synth import FAULTS, StepSynthConfig, header, steps

from .helpers import ROOT
from .steplogs import WINDOW_HEADER, window_log

jsonschema = pytest.importorskip("jsonschema")


def schema() -> dict[str, Any]:
    text = (resources.files("pagedkv_sql.replay") / "step-log.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def validator() -> Any:
    return jsonschema.Draft202012Validator(schema())


def test_the_schema_is_a_valid_2020_12_schema_naming_the_readers_keys() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    defs = schema()["$defs"]
    assert set(defs["step"]["properties"]) == set(STEP_KEYS)
    assert set(defs["header"]["properties"]) == {HEADER_KEY, *Header.__dataclass_fields__}
    assert tuple(defs["op"]["properties"]["op"]["enum"]) == STEP_OPS


def test_every_line_of_a_synthetic_log_with_every_fault_is_valid() -> None:
    faults = tuple((name, 20 + 5 * i) for i, name in enumerate(FAULTS))
    cfg = StepSynthConfig(steps=200, faults=faults)
    check = validator()
    lines = [json.loads(header(cfg).to_json()), *steps(cfg)]
    assert len(lines) > 100
    for line in lines:
        check.validate(json.loads(json.dumps(line)))


def test_every_line_of_a_sliding_window_log_is_valid() -> None:
    """Placeholders (null) in a share, a window_free, the header's groups."""
    for line in [WINDOW_HEADER, *window_log()]:
        validator().validate(line)


def test_the_examples_of_docs_replay_md_are_valid() -> None:
    doc = (ROOT / "docs" / "replay.md").read_text()
    examples = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", doc, re.S)]
    assert len(examples) >= 2
    for example in examples:
        validator().validate(example)


@pytest.mark.parametrize(
    "line",
    [
        {"step": -1},
        {"step": 1, "unknown": 2},
        {"step": 1, "ops": [{"op": "teleport", "req": "a"}]},
        {"step": 1, "ops": [{"op": "fork", "req": "a"}]},
        {"step": 1, "ops": [{"op": "free"}]},
        {"step": 1, "ops": [{"op": "allocate", "req": "a", "group": -1, "blocks": [1]}]},
        {"step": "1"},
        {"pagedkv_step_log": 1, "block_size": 300},
        {"pagedkv_step_log": 1, "block_bytes": 100},
        {"pagedkv_step_log": 3},
        {"step": 1, "ops": [{"op": "cache", "blocks": [1]}]},
        {"step": 1, "ops": [{"op": "cache", "blocks": [1], "hashes": [None]}]},
        {"step": 1, "ops": [{"op": "share", "req": "a", "blocks": [1], "hashes": ["abc"]}]},
        {"step": 1, "observed": {"free_list": [-1]}},
        {"pagedkv_step_log": 1, "pool": 4},
        {"pagedkv_step_log": 2, "groups": [{"kind": "rswa", "block_size": 16}]},
        {"pagedkv_step_log": 2, "groups": [{"kind": "sliding_window", "block_size": 16}]},
        {
            "pagedkv_step_log": 2,
            "groups": [{"kind": "mamba", "block_size": 1, "sliding_window": 4}],
        },
        {"step": 1, "ops": [{"op": "release", "req": "a", "blocks": [None]}]},
        {"step": 1, "ops": [{"op": "window_free", "req": "a", "blocks": [1]}]},
    ],
)
def test_a_line_the_reader_refuses_for_its_shape_is_invalid(line: dict[str, Any]) -> None:
    import pagedkv_sql
    from pagedkv_sql.errors import InputError

    assert not validator().is_valid(line)
    text = json.dumps(line) + "\n"
    if HEADER_KEY not in line:  # a step line: after a header, as a log
        text = '{"pagedkv_step_log": 1}\n' + text
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError):
        db.replay(io.BytesIO(text.encode()))
