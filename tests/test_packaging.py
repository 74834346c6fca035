"""What gets built, installed and cleaned: the database file opens in the DuckDB shell, an
installed wheel works from anywhere, every extra-gated command names the extra to install,
and `make clean` removes what make and the tests create."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql

from .helpers import DATA, DUCKDB_SHELL, ROOT, SEED_OUTPUT


@pytest.mark.skipif(DUCKDB_SHELL is None, reason="duckdb-cli is not installed")
def test_the_duckdb_shell_opens_the_database(tmp_path: Path) -> None:
    path = tmp_path / "pagedkv.duckdb"
    with pagedkv_sql.connect(path) as db:
        db.load(DATA)
    assert DUCKDB_SHELL is not None
    version = subprocess.run([DUCKDB_SHELL, "--version"], capture_output=True, text=True)
    shell = subprocess.run(
        [
            DUCKDB_SHELL,
            "-readonly",
            str(path),
            "-csv",
            "-noheader",
            "-separator",
            "\t",
            "-c",
            "SELECT * FROM resolved_kv_address ORDER BY ALL",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shell.returncode == 0, (version.stdout, shell.stderr)
    assert shell.stdout == SEED_OUTPUT
    views = subprocess.run(
        [
            DUCKDB_SHELL,
            "-readonly",
            str(path),
            "-csv",
            "-noheader",
            "-c",
            "SELECT count(*) FROM diag_unresolved_token",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert views.stdout == "1\n"


PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


@pytest.mark.slow
def test_installed_wheel_runs_from_another_directory(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("pagedkv_sql-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # the wheel alone goes into the new environment; its dependencies are borrowed from
    # this one through a .pth file, so the test needs no network
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exe = [str(venv / "bin" / "python"), "-m", "pagedkv_sql"]
    # the README's data comes with the wheel (`example DIR`), not from a checkout
    example = subprocess.run([*exe, "example", "facts"], cwd=elsewhere, capture_output=True)
    assert example.returncode == 0, example.stderr
    assert (site / "pagedkv_sql" / "example" / "engines" / "flashinfer.npz").is_file()
    # the step log's schema and the report's plotly.js are package data too
    assert (site / "pagedkv_sql" / "replay" / "step-log.schema.json").is_file()
    assert (site / "pagedkv_sql" / "report" / "assets" / "plotly-cartesian.min.js").is_file()
    # TAB is answered from the table shipped beside the CLI, without typer
    tab = subprocess.run(
        [
            *exe[:1],
            "-c",
            "import sys; sys.argv = ['pagedkv-sql']; from pagedkv_sql.__main__ import main\n"
            "try:\n    main()\nfinally:\n    print('typer' in sys.modules, file=sys.stderr)",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "_PAGEDKV_SQL_COMPLETE": "complete_bash",
            "COMP_WORDS": "pagedkv-sql ex",
            "COMP_CWORD": "1",
        },
    )
    assert (tab.returncode, tab.stdout, tab.stderr) == (0, "explain\nexample\nexport\n", "False\n")
    for name in ("root_table.facts", "engines/flashinfer.npz"):
        assert (elsewhere / "facts" / name).read_bytes() == (DATA / name).read_bytes()
    where = subprocess.run(
        [*exe[:1], "-c", "import pagedkv_sql, sys; print(pagedkv_sql.__file__)"],
        cwd=elsewhere,
        check=True,
        capture_output=True,
        text=True,
    )
    assert str(site) in where.stdout
    load = subprocess.run([*exe, "load", "facts"], cwd=elsewhere, capture_output=True, text=True)
    assert load.returncode == 0, load.stderr
    out = subprocess.run([*exe, "resolve"], cwd=elsewhere, capture_output=True, text=True)
    assert out.stdout == SEED_OUTPUT
    assert (site / "pagedkv_sql" / "sql" / "resolve.sql").exists()
    # the pytest plugin: a module beside the package, registered for pytest
    assert (site / "pytest_pagedkv.py").exists()
    entry = next(site.glob("pagedkv_sql-*.dist-info")) / "entry_points.txt"
    assert "[pytest11]\npagedkv_sql = pytest_pagedkv" in entry.read_text()
    # the tests' and developers' tools are dependency groups, not extras a user
    # is offered; the extras left are the optional parts of the tool itself
    metadata = (next(site.glob("pagedkv_sql-*.dist-info")) / "METADATA").read_text()
    extras = {line.split(": ", 1)[1] for line in metadata.splitlines() if "Provides-Extra" in line}
    assert extras == {"engines", "vllm", "events", "live", "fuzz", "report", "spark", "fleet"}
    assert not re.search(r"(pytest|ruff|mypy|playwright|cosmic-ray)", metadata.split("\n\n")[0])


BLOCKER = """
import runpy, sys
blocked = set(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = ["pagedkv-sql", *sys.argv[2:]]
runpy.run_module("pagedkv_sql", run_name="__main__")
"""


@pytest.mark.parametrize(
    ("hidden", "command", "extra"),
    [
        ("pyspark,sqlglot", ["spark", "resolve", "--input", ".", "-o", "out"], "spark"),
        ("sqlglot", ["spark", "check", "--input", "."], "spark"),
        ("matplotlib,plotly", ["map", "-o", "m.png", "--db", ":memory:"], "report"),
        ("msgspec,msgpack", ["kv-events", "e.msgpack"], "events"),
        ("msgspec,msgpack", ["watch", "e.msgpack"], "events"),
        ("safetensors", ["import", "vllm", "s.safetensors"], "engines"),
        ("hypothesis", ["fuzz", "vllm"], "fuzz"),
        ("hypothesis", ["fuzz", "sglang", "--plant", "leak_page"], "fuzz"),
    ],
)
def test_a_missing_extra_is_named_not_a_traceback(
    tmp_path: Path, hidden: str, command: list[str], extra: str
) -> None:
    (tmp_path / "e.msgpack").write_bytes(b"\x93\x01\x90\xc0")  # [1, [], nil]: a batch
    (tmp_path / "s.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, hidden, *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: ")
    assert f"pip install 'pagedkv-sql[{extra}]'" in proc.stderr


def test_export_parquet_needs_no_spark_extra(tmp_path: Path) -> None:
    # writing Parquet is DuckDB's: the spark extra's sqlglot is imported only for --partition
    command = ["export", "parquet", "out", "--db", ":memory:"]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, "pyspark,sqlglot", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "pagedkv_settings").is_dir()


@pytest.mark.parametrize(
    ("engine", "fix"), [("vllm", "pip install vllm"), ("sglang", "pip install sglang")]
)
def test_fuzz_without_the_engine_names_it(tmp_path: Path, engine: str, fix: str) -> None:
    # `pagedkv-sql fuzz ENGINE` drives the real engine: without it, what to install, exit 2
    # (a missing dependency of a command, as a missing extra is everywhere)
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, "vllm,sglang", "fuzz", engine],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"Error: pagedkv-sql fuzz needs {engine}")
    assert f"Fix: {fix}" in proc.stderr
    assert not list(tmp_path.iterdir())  # no step log written


MAKEFILE = (ROOT / "Makefile").read_text()


def made_venvs() -> set[str]:
    """Every directory the Makefile runs `python -m venv` into, its variables expanded; a
    static pattern rule's (`$(A) $(B): .venv-%/.installed: ...`, `-m venv .venv-$*`) names
    each of its targets' directories."""
    assigned = dict(re.findall(r"^(\w+)\s*[?:]?=\s*(\S+)", MAKEFILE, re.M))

    def expand(text: str) -> str:
        while variable := re.search(r"\$\((\w+)\)", text):
            text = text.replace(variable.group(0), assigned[variable.group(1)])
        return text

    names = set()
    for target in re.findall(r"-m venv (\S+)", MAKEFILE):
        if "$*" not in target:
            names.add(expand(target))
            continue
        for targets in re.findall(r"^([^:\n]+):\s*\.venv-%/\.installed:", MAKEFILE, re.M):
            names.update(str(Path(expand(t)).parent) for t in targets.split())
    return names


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_clean_removes_every_venv_and_cache_and_keeps_the_database(tmp_path: Path) -> None:
    venvs = made_venvs()
    assert {".venv", ".venv-engines", ".venv-engines-new", ".venv-mutate", ".venv-min"} <= venvs
    assert {".venv-new", ".venv-serving"} <= venvs
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    made = [*venvs, ".images", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"]
    made += [".mutate"]  # make mutate's history and last report
    made += ["dist", "build", "pagedkv_sql/__pycache__", "tests/engines/__pycache__"]
    for name in made:
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "file").write_text("x")
    (tmp_path / "pagedkv.duckdb").write_text("data")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True)
    assert [n for n in made if (tmp_path / n).exists()] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Makefile",
        "pagedkv.duckdb",
        "pagedkv_sql",
        "tests",
    ]


def test_every_install_names_a_declared_extra_or_dependency_group() -> None:
    # test and dev tools are dependency groups (PEP 735), not extras; each venv the
    # Makefile makes names only what pyproject.toml declares
    # the file, not the Python, is tested: the 3.10 tier (test-min) has no tomllib
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(project["project"]["optional-dependencies"])
    groups = set(project["dependency-groups"])
    installs = re.findall(r"pip install (?:[^\n\\]|\\\n)*", MAKEFILE)
    named_extras = {
        e for i in installs for m in re.findall(r"\.\[([\w,-]+)\]", i) for e in m.split(",")
    }
    named_groups = {g for i in installs for g in re.findall(r"--group ([\w-]+)", i)}
    assert named_extras <= extras and named_groups <= groups
    assert {"test", "dev", "report-test", "mutate"} == groups and not groups & extras
    assert named_groups == groups
    # pip learnt --group in 25.1: every venv that installs a group upgrades pip first
    for venv_install in re.findall(r"-m venv [^\n]*\n(?:\t[^\n]*\n)+", MAKEFILE + "\n"):
        if "--group" in venv_install:
            assert "--upgrade pip" in venv_install


@pytest.mark.parametrize(("command", "missing"), [("map", "matplotlib")])
def test_without_the_extra_the_commands_say_how_to_install_it(
    cli: Any, seed_dir: Path, monkeypatch: pytest.MonkeyPatch, command: str, missing: str
) -> None:
    assert cli("load", str(seed_dir)).exit_code == 0
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import missing` fail
    result = cli(command, "-o", "out.file.png" if command == "map" else "out.html")
    assert result.exit_code == 2
    assert f"Error: drawing needs {missing}, which is not installed" in result.output
    assert "pip install 'pagedkv-sql[report]'" in result.output
    assert not list(cli.cwd.glob("out*"))


def test_the_report_needs_neither_matplotlib_nor_plotly(
    cli: Any, seed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's memory map is drawn by plotly.js from the raster: only `map` (PNG, SVG)
    uses matplotlib; plotly.js comes from the package's assets, not from the
    plotly package."""
    assert cli("load", str(seed_dir)).exit_code == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "plotly", None)
    result = cli("report", "-o", "out.html")
    assert result.exit_code == 0, result.output
    page = (cli.cwd / "out.html").read_bytes()
    assert b'id="map-gpu"' in page
    assert b"plotly.js (cartesian - minified) v4.1.1" in page


def test_spark_commands_without_the_extra_say_how_to_install_it(
    cli: Callable[..., object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    session = importlib.import_module("pagedkv_sql.spark.session")
    monkeypatch.setattr(session, "_importable", lambda module: module != "pyspark")
    for command in (["resolve"], ["check"]):
        result: Any = cli("spark", *command, "-i", str(tmp_path), "-o", str(tmp_path / "out"))
        assert result.exit_code == 2  # a missing extra is a usage error, as every other's
        assert result.output.startswith("Error: spark needs pyspark, which is not installed\n")
        assert "pip install 'pagedkv-sql[spark]'" in result.output


@pytest.mark.slow
def test_an_editable_install_loads_the_checkouts_own_files(tmp_path: Path) -> None:
    """`pip install -e .` (a real one, in a venv of its own): nothing of the checkout is
    copied into site-packages (pytest_pagedkv.py, sql/, data/ were, and the copy of the
    plugin was what pytest loaded, not the file a developer edits)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "-q", "-e", str(ROOT)],
        capture_output=True,
        text=True,
    )
    if install.returncode != 0 and "hatchling" in install.stderr:  # pragma: no cover
        pytest.skip("the build backend cannot be fetched here (no package index)")
    assert install.returncode == 0, install.stderr
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    assert not (site / "pytest_pagedkv.py").exists() and not (site / "pagedkv_sql").exists()
    found = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util as u; print(u.find_spec('pytest_pagedkv').origin); "
            "print(u.find_spec('pagedkv_sql').origin)",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert found.stdout.splitlines() == [
        str(ROOT / "pytest_pagedkv.py"),
        str(ROOT / "pagedkv_sql" / "__init__.py"),
    ]
