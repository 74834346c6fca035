"""faces.py: each engine's parts named once, and every list of engines derived from them."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

from pagedkv_sql import faces

PARTS = ("state", "capture", "schema", "exporter", "recorder", "fuzz")


@pytest.mark.parametrize("engine", faces.ENGINES, ids=faces.NAMES)
def test_every_part_a_face_names_is_there(engine: faces.Engine) -> None:
    for role in PARTS:
        path = getattr(engine, role)
        if path is not None:
            assert faces.part(path) is not None, (engine.name, role, path)
    assert isinstance(faces.part(engine.state), ModuleType)
    assert callable(faces.part(engine.state).to_state)
    assert engine.name in faces.part(engine.schema)


def test_a_part_that_is_not_there_is_an_import_error() -> None:
    with pytest.raises(AttributeError):
        faces.part("pagedkv_sql.engines.vllm:no_such_part")
    with pytest.raises(ModuleNotFoundError):
        faces.part("pagedkv_sql.engines.no_such_engine")


def test_the_lists_of_engines_are_the_faces() -> None:
    from pagedkv_sql import engines
    from pagedkv_sql.cli.engines import ENGINE_NAMES
    from pagedkv_sql.engines.meta import SCHEMAS
    from pagedkv_sql.live import decode

    assert tuple(engines.ENGINES) == ENGINE_NAMES == faces.NAMES
    assert set(SCHEMAS) == set(faces.NAMES)
    assert engines.EXPORTS == ("flashinfer", "vllm")
    assert decode.ENGINES == ("auto", "vllm", "sglang")
    assert faces.FUZZED == ("vllm", "sglang")
    for name in faces.NAMES:
        assert engines.engine(name) is faces.part(faces.BY_NAME[name].state)


def test_each_engine_a_recorder_or_a_fuzz_driver_names_is_its_own() -> None:
    for e in faces.ENGINES:
        for path in (e.recorder, e.fuzz):
            assert path is None or path.endswith(f".{e.name}") or path.endswith(f"_{e.name}")


def test_the_faces_import_nothing_of_the_capabilities() -> None:
    # the CLI reads the engine names at start-up (tests/test_startup.py): no part is loaded
    code = (
        "import sys, pagedkv_sql.faces; "
        "print(sorted(m for m in sys.modules if m.startswith('pagedkv_sql.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['pagedkv_sql.faces', 'pagedkv_sql.lazy']"
