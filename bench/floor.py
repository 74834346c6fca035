"""The main job against the bare DuckDB floor, code before and after a change in the same
run: `load` against a bare `read_csv`, `resolve -o` against a bare `COPY` of the same
sorted query on the same database file, `-f json` against `-f tsv`, and the whole job
(`load` + `resolve -o`) against a bare in-memory script (and Soufflé where it is built).

    python bench/floor.py --seqs 20000 --len 512 --repeat 3 [--before ../main]

Every figure is a fresh process timed from outside (wall, and the child's CPU: user +
system of all its threads), the median of --repeat interleaved rounds: each round runs
every row's sides back to back, before, baseline and after in turn, so that a noisy
neighbour touches all of them. `--before DIR` is a checkout of the code to compare with
(its `pagedkv_sql` first on PYTHONPATH); without it only this tree is measured. Beside
every ratio: the least and most load average seen over that row's runs, and the cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gen_facts import generate
from runs.common import BARE_SCRIPT, COLUMNS, UNION_ALL

ROOT = Path(__file__).resolve().parent.parent
BARE_LOAD = f"""
import duckdb, sys
data, db = sys.argv[1], sys.argv[2]
con = duckdb.connect(db)
for rel, cols in {COLUMNS!r}.items():
    spec = "{{" + ", ".join(f"'{{c}}': 'BIGINT'" for c in cols) + "}}"
    con.execute(
        f"CREATE TABLE {{rel}} AS SELECT * FROM read_csv('{{data}}/{{rel}}.facts', "
        f"delim='\\t', header=false, auto_detect=false, columns={{spec}})"
    )
con.close()
"""
BARE_COPY = f"""
import duckdb, sys
db, out = sys.argv[1], sys.argv[2]
con = duckdb.connect(db, read_only=True)
con.execute(f"COPY ({UNION_ALL}) TO '{{out}}' (DELIMITER '\\t', HEADER false)")
con.close()
"""


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and child CPU seconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


class Sides:
    """The command lines of ours (before and after) and of the baselines."""

    def __init__(self, work: Path, before: Path | None) -> None:
        self.work, self.data, self.db = work, work / "data", work / "kv.duckdb"
        self.trees = {"after": ROOT} | ({"before": before} if before is not None else {})

    def env(self, tree: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(tree)}

    def cli(self, side: str, *args: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "pagedkv_sql", *args], self.env(self.trees[side])

    def run(self, row: str, side: str) -> tuple[float, float]:
        """One run of one side of one row."""
        w = self.work
        if row == "load":
            if side == "bare":
                fresh(w / "bare.duckdb")
                return timed(
                    [sys.executable, "-c", BARE_LOAD, str(self.data), str(w / "bare.duckdb")]
                )
            fresh(w / f"{side}.duckdb")
            return timed(
                *self.cli(side, "--db", str(w / f"{side}.duckdb"), "-q", "load", str(self.data))
            )
        if row == "resolve":
            if side == "bare":
                return timed([sys.executable, "-c", BARE_COPY, str(self.db), str(w / "bare.tsv")])
            return timed(
                *self.cli(side, "--db", str(self.db), "resolve", "-o", str(w / f"{side}.tsv"))
            )
        if row == "json":  # the tsv side of this row is the resolve row's own run
            return timed(
                *self.cli(side, "--db", str(self.db), "resolve", "-o", str(w / f"{side}.json"))
            )
        if row == "job":
            if side == "bare":
                return timed([sys.executable, "-c", BARE_SCRIPT.format(columns=COLUMNS),
                              str(self.data), str(w / "bare_job.tsv")])  # fmt: skip
            db = w / f"job_{side}.duckdb"
            fresh(db)
            first = timed(*self.cli(side, "--db", str(db), "-q", "load", str(self.data)))
            second = timed(
                *self.cli(side, "--db", str(db), "resolve", "-o", str(w / f"job_{side}.tsv"))
            )
            return first[0] + second[0], first[1] + second[1]
        raise ValueError(row)


def fresh(db: Path) -> None:
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)


ROWS = {
    "load": "`load` vs a bare `read_csv` into a database file",
    "resolve": "`resolve -o out.tsv` vs a bare `COPY` of the sorted `UNION ALL`, same file",
    "json": "`resolve -o out.json` vs `resolve -o out.tsv` (each side its own)",
    "job": "the whole job (`load` + `resolve -o`) vs a bare in-memory script",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, default=2_000)
    parser.add_argument("--len", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--rows", default=",".join(ROWS))
    args = parser.parse_args()
    rows = args.rows.split(",")
    with tempfile.TemporaryDirectory(prefix="pagedkv-bench-floor-") as tmp:
        sides = Sides(Path(tmp), args.before)
        generate(sides.data, args.seqs, args.len)
        timed(*sides.cli("after", "--db", str(sides.db), "-q", "load", str(sides.data)))
        tokens = sum(1 for _ in (sides.data / "virtual_token.facts").open("rb"))
        ours = list(sides.trees)
        got: dict[tuple[str, str], list[tuple[float, float]]] = {}
        loads: dict[str, list[float]] = {r: [] for r in rows}
        for i in range(args.repeat):
            for row in rows:
                order = [*ours, "bare"] if row != "json" else ours
                order = order[i % len(order) :] + order[: i % len(order)]  # rotate
                loads[row].append(os.getloadavg()[0])
                for side in order:
                    got.setdefault((row, side), []).append(sides.run(row, side))
                    if row == "resolve" and side != "bare":  # json's tsv side, same round
                        got.setdefault(("json", f"{side} tsv"), []).append(got[(row, side)][-1])
                loads[row].append(os.getloadavg()[0])
        souffle = shutil.which("souffle")
    print(f"# bench/floor.py --seqs {args.seqs} --len {args.len} --repeat {args.repeat}"
          f"{' --before ' + str(args.before) if args.before else ''}: {tokens:,} tokens, "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}")  # fmt: skip
    print("# medians of wall (and child CPU) seconds, fresh processes, interleaved rounds\n")
    print("| what | side | ours | baseline | ratio | CPU ratio | load average | cores |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")

    def med(key: tuple[str, str]) -> tuple[float, float]:
        runs = got[key]
        return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)

    for row in rows:
        load = f"{min(loads[row]):.1f}-{max(loads[row]):.1f}"
        for side in ours:
            (ow, oc) = med((row, side))
            (bw, bc) = med((row, f"{side} tsv") if row == "json" else (row, "bare"))
            print(f"| {ROWS[row]} | {side} | {ow:.2f} s ({oc:.2f}) | {bw:.2f} s ({bc:.2f}) | "
                  f"{ow / bw:.2f}x | {oc / bc:.2f}x | {load} | {os.cpu_count()} |")  # fmt: skip
    found = f"at {souffle} (not measured by this script)" if souffle else "not on PATH here"
    print(f"\nSoufflé: {found}.")


if __name__ == "__main__":
    main()
