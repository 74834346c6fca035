"""Start-up benchmark (not a test): how long the CLI takes before it does anything.

    python bench/startup.py --repeat 20

Each figure is the median wall time (and CPU time, which a busy machine moves less) of N
fresh processes of `pagedkv-sql --help`,
`--version`, a bash TAB completion and a zsh one (answered from the table, and the same
two answered by typer: the baseline), as a ratio to `duckdb -c "select 1"`
(the DuckDB shell, the duckdb-cli test dependency) measured in the same run, the runs
interleaved so that a busy moment of the shared machine falls on all of them alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
# the CLI entered past the table TAB completion answers from (pagedkv_sql/completion.py)
TYPER = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'pagedkv-sql'; from pagedkv_sql.cli import main; main()",
]


def _tool(name: str) -> str:
    """The console script beside this Python (the venv's), else the one on PATH."""
    found = BIN / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        sys.exit(f"bench/startup.py: {name} not found beside {sys.executable} nor on PATH")
    return on_path


def commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    cli = _tool("pagedkv-sql")
    bash = {"_PAGEDKV_SQL_COMPLETE": "complete_bash", "COMP_WORDS": "pagedkv-sql ex"}
    zsh = {"_PAGEDKV_SQL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "pagedkv-sql export "}
    return {
        'duckdb -c "select 1"': ([_tool("duckdb"), "-c", "select 1"], {}),
        "pagedkv-sql --help": ([cli, "--help"], {}),
        "pagedkv-sql --version": ([cli, "--version"], {}),
        "TAB completion (bash: `pagedkv-sql ex`)": ([cli], {**bash, "COMP_CWORD": "1"}),
        "TAB completion (zsh: `pagedkv-sql export `)": ([cli], zsh),
        # the same two TABs answered by typer: the baseline the table's answers are held to
        "... by typer (bash)": (TYPER, {**bash, "COMP_CWORD": "1"}),
        "... by typer (zsh)": (TYPER, zsh),
    }


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and the CPU seconds (user + system) of the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20, help="runs of each command")
    args = parser.parse_args()
    todo = commands()
    for argv, env in todo.values():  # warm the page cache once, untimed
        once(argv, env)
    walls: dict[str, list[float]] = {name: [] for name in todo}
    cpus: dict[str, list[float]] = {name: [] for name in todo}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeat):
        for name, (argv, env) in todo.items():
            wall, cpu = once(argv, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    load_after = os.getloadavg()[0]
    wall_base = statistics.median(next(iter(walls.values())))
    cpu_base = statistics.median(next(iter(cpus.values())))
    print(
        f"# pagedkv-sql start-up: {platform.platform()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; median of {args.repeat} interleaved runs; "
        f"load average {load_before:.1f} -> {load_after:.1f}"
    )
    print()
    print("| command | median wall | ratio to duckdb | median CPU | ratio to duckdb |")
    print("| --- | --- | --- | --- | --- |")
    for name in todo:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(
            f"| {name} | {wall * 1000:.0f} ms | {wall / wall_base:.2f}x "
            f"| {cpu * 1000:.0f} ms | {cpu / cpu_base:.2f}x |"
        )


if __name__ == "__main__":
    main()
