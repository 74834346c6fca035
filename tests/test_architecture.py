"""docs/architecture.md is the map a newcomer reads first: it names every module
of the package and every SQL file, so a room added without a line there fails here;
and the house's rules: no room over 500 lines, no import after code, every test file named
after its subject."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .helpers import WING

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


# The rooms that may pass 500 lines, each with its reason: one purpose whose parts call back
# into each other, where a split at the wall made a circle or a back-and-forth (cohesion
# over a ruler). A room listed here must still be over 500 lines.
LONG_ROOMS = {
    "replay/builder.py": "the Builder and what it is told, each calling back into it: the "
    "step shapes of vLLM's SchedulerOutput and the witness of a version 2 log were modules "
    "of their own that took a Builder and drove it (an import circle held apart by "
    "TYPE_CHECKING)",
    "invariants.py": "the catalogue: one table of every idea with its check in each of the six "
    "models, its faults, plants and old names; split, an idea's lines would stand in two "
    "places and the tables generated from it would read two",
}


# no room over 500 lines unless listed with a reason; no file needs an import after code
# (`noqa: E402`), the way a circle of imports is dodged
@pytest.mark.parametrize("room", [r for r in _rooms() if r.endswith(".py")])
def test_no_room_is_over_500_lines(room: str) -> None:
    lines = len((ROOT / "pagedkv_sql" / room).read_text(encoding="utf-8").splitlines())
    if room in LONG_ROOMS:
        assert lines > 500, f"{room} is {lines} lines: take it off LONG_ROOMS"
        return
    assert lines <= 500, f"split {room} ({lines} lines) at its seams, or list it with a reason"


def test_every_long_room_has_its_reason() -> None:
    rooms = set(_rooms())
    for room, reason in LONG_ROOMS.items():
        assert room in rooms, f"LONG_ROOMS names {room}, which is not a room"
        assert len(reason.split()) >= 8, f"{room}: say why it is one room"


def _tools() -> list[str]:
    files = [p for folder in ("tools", "bench") for p in sorted((ROOT / folder).rglob("*.py"))]
    return [p.relative_to(ROOT).as_posix() for p in files]


# the house rule holds for the developer tools too: the mutation tool behind `make
# mutate` and the benchmarks are read and changed like the package, so no .py file under
# tools/ or bench/ is over 500 lines either (tools/mutate.py was 1,561, bench/run.py 809)
@pytest.mark.parametrize("tool", _tools())
def test_no_developer_tool_is_over_500_lines(tool: str) -> None:
    lines = len((ROOT / tool).read_text(encoding="utf-8").splitlines())
    assert lines <= 500, f"split {tool} ({lines} lines) at its seams"


def test_no_file_imports_after_code() -> None:
    late = re.compile(r"^\s*(?:import|from)\s.*#\s*noqa:[\w ,]*\bE402\b", re.MULTILINE)
    found = [
        p.relative_to(ROOT).as_posix()
        for folder in ("pagedkv_sql", "tests", "bench", "tools")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if late.search(p.read_text(encoding="utf-8"))
    ]
    assert found == [], "import at the top (a sys.path.insert among the imports is allowed)"


def test_the_wing_has_no_room_over_500_lines_and_no_e402() -> None:
    for path in WING.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        assert "noqa: E402" not in text, path.name


# every test file is named after what it tests, so that a test is found where its subject
# is: a module or package of pagedkv_sql (replay/log.py is replay_log, cli/core.py the CLI
# group cli_core, the package replay is replay), a module beside the package
# (pytest_pagedkv), an SQL file (sql/resolve.sql is sql_resolve), or one of the promises
# below, each a rule over many subjects at once or a harness of its own. A folder of a
# capability names its own modules without the prefix (tests/engines/test_vllm.py is
# engines/vllm.py). A subject whose tests would pass 500 lines splits by aspect, each
# aspect listed here.
PROMISES = {
    "architecture": "the map of the house (docs/architecture.md), the sizes and names of its files",
    "layering": "how the package's parts import each other",
    "startup": "what a command imports before it works",
    "packaging": "the wheel, the extras and what make builds and cleans",
    "docs": "the README's and the docs' sessions and examples run as shown",
    "conventions": "behave like the tools users know (DuckDB's API, click's CLI, the formats)",
    "safety": "nothing lost, nothing silently wrong across every command",
    "faults": "full disks, read-only places and signals at random moments",
    "property": "random inputs against the plain reference evaluation",
}
ASPECTS = {
    "replay_log": ("lines", "schema", "hostile"),
    "sql_replay": ("windows", "culprit", "boundaries"),
    "replay_record_vllm": ("spec", "groups"),
    "engines_sglang_swa": ("pure",),  # SGLang's all-sliding-window cache
    "faults": ("signals",),
    "sql_constraints": ("plans",),
    "engines_flashinfer": ("attention",),  # the kernels over an export (tests/gpu, CPU twin)
    "engines_vllm": ("groups",),  # vLLM's KV-cache groups: its spec classes, engines/groups.py
    "replay_builder": ("witness",),  # the witness of a version 2 log, read by the Builder
}


def _subjects() -> set[str]:
    package = ROOT / "pagedkv_sql"
    subjects = set(PROMISES)
    for p in package.rglob("*.py"):
        parts = p.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] != "__main__":
            subjects.add("_".join(parts))
    subjects |= {f"sql_{p.stem}" for p in (ROOT / "sql").glob("*.sql")}
    subjects |= {p.stem for p in ROOT.glob("*.py")}  # pytest_pagedkv.py
    return subjects


def _names_a_subject(path: str, subjects: set[str]) -> bool:
    """Whether tests/.../test_<name>.py names a subject (or an aspect of one)."""
    parts = path.split("/")
    name = parts[-1].removeprefix("test_").removesuffix(".py")
    names = {name} | ({f"{parts[1]}_{name}"} if len(parts) > 2 else set())
    aspects = {f"{s}_{a}" for s, each in ASPECTS.items() if s in subjects for a in each}
    return bool(names & (subjects | aspects))


def _test_files() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))


def test_every_test_file_names_its_subject() -> None:
    subjects = _subjects()
    unnamed = [p for p in _test_files() if not _names_a_subject(p, subjects)]
    assert unnamed == [], (
        "name each after the module, CLI group, SQL file or promise it tests "
        f"(tests/test_architecture.py, PROMISES): {unnamed}"
    )


def test_the_naming_rule_refuses_a_name_of_no_subject() -> None:
    subjects = _subjects()
    assert _names_a_subject("tests/test_replay_log.py", subjects)
    assert _names_a_subject("tests/test_replay_log_lines.py", subjects)  # an aspect
    assert _names_a_subject("tests/test_cli_core.py", subjects)
    assert _names_a_subject("tests/test_sql_resolve.py", subjects)
    assert _names_a_subject("tests/engines/test_vllm.py", subjects)  # engines/vllm.py
    assert _names_a_subject("tests/test_safety.py", subjects)  # a promise
    assert not _names_a_subject("tests/test_boundaries.py", subjects)  # how they were found
    assert not _names_a_subject("tests/test_vllm.py", subjects)  # vllm.py is engines'
    assert not _names_a_subject("tests/test_replay_log_bits.py", subjects)  # no such aspect
    assert not _names_a_subject("tests/test_resolve.py", subjects)  # sql/ needs sql_


# the house rule for the tests too: no test module or helper over 500 lines
@pytest.mark.parametrize(
    "module", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py"))
)
def test_no_test_module_is_over_500_lines(module: str) -> None:
    lines = len((ROOT / module).read_text(encoding="utf-8").splitlines())
    assert lines <= 500, f"split {module} ({lines} lines) by subject or aspect"
