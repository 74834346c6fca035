"""The database file opens in the DuckDB shell; an installed wheel works from anywhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import pagedkv_sql

from .conftest import DATA, ROOT, SEED_OUTPUT

DUCKDB_SHELL = shutil.which("duckdb", path=str(Path(sys.executable).parent)) or shutil.which(
    "duckdb"
)


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
    # issue 29: the README's data comes with the wheel (`example DIR`), not from a checkout
    example = subprocess.run([*exe, "example", "facts"], cwd=elsewhere, capture_output=True)
    assert example.returncode == 0, example.stderr
    assert (site / "pagedkv_sql" / "example" / "engines" / "flashinfer.npz").is_file()
    # the step log's schema and the report's plotly.js are package data too (issue 29)
    assert (site / "pagedkv_sql" / "replay" / "step-log.schema.json").is_file()
    assert (site / "pagedkv_sql" / "report" / "assets" / "plotly-cartesian.min.js").is_file()
    # issue 24: TAB is answered from the table shipped beside the CLI, without typer
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
    # the pytest plugin (issue 27): a module beside the package, registered for pytest
    assert (site / "pytest_pagedkv.py").exists()
    entry = next(site.glob("pagedkv_sql-*.dist-info")) / "entry_points.txt"
    assert "[pytest11]\npagedkv_sql = pytest_pagedkv" in entry.read_text()
    # issue 29: the tests' and developers' tools are dependency groups, not extras a user
    # is offered; the extras left are the optional parts of the tool itself
    metadata = (next(site.glob("pagedkv_sql-*.dist-info")) / "METADATA").read_text()
    extras = {line.split(": ", 1)[1] for line in metadata.splitlines() if "Provides-Extra" in line}
    assert extras == {"engines", "vllm", "events", "live", "fuzz", "report", "spark"}
    assert not re.search(r"(pytest|ruff|mypy|playwright|cosmic-ray)", metadata.split("\n\n")[0])
