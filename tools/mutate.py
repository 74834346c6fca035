"""Mutation testing for pagedkv-sql: `make mutate` (docs/mutation.md says how to read it).

Python modules are mutated with cosmic-ray's operators (the subset named in
tools/mutate.toml); SQL with the versioned, hand-written list in tools/sql_mutants.toml.
Each mutant is applied alone to a scratch copy of the tree, and only the tests mapped to
its file run, in the order given, stopping at the first failure. A mutant is killed when
they fail (or time out) and survives when they pass. The report counts both per file.

    python tools/mutate.py                      # the core (`core` in tools/mutate.toml)
    python tools/mutate.py pagedkv_sql/engines  # any files or folders instead
    python tools/mutate.py --list               # show the mutants, run nothing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from mutation.config import ROOT, STOP, Config, Mutant
from mutation.mutants import collect, select_files
from mutation.outcomes import (
    outcome,
    past_killers,
    read_outcomes,
    report,
    report_only,
    save_killers,
    seed_killers,
)
from mutation.scheduler import run_mutants
from mutation.server import Server, make_tree, serve, tracked_files
from mutation.testmap import TestMap, build_map


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="files or folders (default: the core)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--python", default=sys.executable, help="runs the tests")
    parser.add_argument("--report", type=Path, help="also write the report to this file")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--pool", nargs="+", help="the tests the map runs (default: the config's)")
    parser.add_argument("--save-map", type=Path, help="write the coverage map to this file")
    parser.add_argument(
        "--map",
        type=Path,
        nargs="+",
        help="reuse saved maps (same code), merged: e.g. the suite's and one of new tests",
    )
    parser.add_argument(
        "--also-map",
        nargs="+",
        default=[],
        help="files or folders whose lines the map records too (for a later --map of them)",
    )
    parser.add_argument(
        "--cap", type=float, help="CPU seconds a mutant's tests may take (default: the config's)"
    )
    parser.add_argument(
        "--history",
        type=Path,
        help="outcomes of earlier runs (JSON lines, appended to): a mutant runs the test "
        "that killed it last time first",
    )
    parser.add_argument(
        "--killers",
        type=Path,
        help="the versioned last killer of each mutant (tools/mutate-killers.jsonl): run "
        "first where --history has none (a fresh clone)",
    )
    parser.add_argument(
        "--save-killers",
        type=Path,
        help="write the killers file from this run's outcomes (or --report-only's files)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        nargs="+",
        help="report --resume files, run nothing: a later file's outcome of a mutant replaces "
        "an earlier one's (a --rerun of survivors after new tests); mutants today's code and "
        "rules no longer make are left out",
    )
    parser.add_argument("--seed", type=int, default=17, help="of the random order")
    parser.add_argument("--sample", type=float, help="run this random share of the mutants")
    parser.add_argument("--only", help="only mutants whose `file:line` matches this regex")
    parser.add_argument("--results", type=Path, help="write every mutant's outcome (JSON)")
    parser.add_argument(
        "--resume", type=Path, help="append each outcome here (JSON lines); skip those in it"
    )
    parser.add_argument(
        "--rerun", type=Path, help="only the mutants that survived in this --results file"
    )
    parser.add_argument("--serve", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        return 0

    config = Config.load()
    if args.report_only:  # the report of --resume files, with today's equivalents
        if args.save_killers:
            outcomes = [r for f in args.report_only for r in read_outcomes(f)]
            saved = save_killers(args.save_killers, outcomes)
            print(f"mutate: {saved} killers saved to {args.save_killers}")
            return 0
        print(report_only(args.report_only, config))
        return 0
    if args.pool:
        config = replace(config, pool=args.pool)
    if args.cap is not None:
        config = replace(config, cap=args.cap)
    files = select_files(args.paths, config, ROOT)
    mutants = collect(files, ROOT, config)
    if args.only:
        mutants = [m for m in mutants if re.search(args.only, f"{m.file}:{m.line}")]
    made = len(mutants)
    if args.sample:  # a seeded random share: an estimate of the whole figure, cheaper
        mutants = random.Random(args.seed).sample(mutants, round(args.sample * len(mutants)))
    if args.resume and args.resume.exists():  # the mutants a stopped run has done
        earlier = {
            (r["file"], r["kind"], r["line"], r["after"]): r for r in read_outcomes(args.resume)
        }
        where = {(f, k, n) for f, k, n, _ in earlier}
        left = []
        for m in mutants:
            if (m.file, m.kind, m.line) not in where:  # no need to make it to know
                left.append(m)
                continue
            with contextlib.suppress(Exception):
                m.mutate((ROOT / m.file).read_text(), config)
            r = earlier.get((m.file, m.kind, m.line, m.after))
            if r is None:
                left.append(m)
            else:
                for f in ("outcome", "killer", "tests", "covering", "cpu", "seconds"):
                    setattr(m, f, r[f])
                m.capped = r.get("capped", False)
        resumed = [m for m in mutants if m not in left]
        mutants = left
    else:
        resumed = []
    if args.rerun:
        survived = {
            (r["file"], r["kind"], r["before"], r["after"])
            for r in read_outcomes(args.rerun)
            if r["outcome"] == "survived"
        }
        keep = []
        texts = {f: (ROOT / f).read_text() for f in {m.file for m in mutants}}
        rows = {f: text.splitlines() for f, text in texts.items()}
        befores = {(f, k, b) for f, k, b, _ in survived}
        for m in mutants:
            line = rows[m.file][m.line - 1].strip() if 0 < m.line <= len(rows[m.file]) else ""
            if m.kind != "sql" and (m.file, m.kind, line) not in befores:
                continue  # not on a survivor's line: no need to make it
            with contextlib.suppress(Exception):
                m.mutate(texts[m.file], config)
            if m.key in survived:
                keep.append(m)
        mutants = keep
    if args.list:
        for m in mutants:
            try:
                m.mutate((ROOT / m.file).read_text(), config)
            except Exception as e:
                m.after = f"(cannot be made: {type(e).__name__})"
            print(f"{m.file}:{m.line} {m.kind}: {m.before} -> {m.after}")
        print(f"{len(mutants)} mutants")
        return 0
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    start, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    mapped = 0.0
    with tempfile.TemporaryDirectory(prefix="pagedkv-mutate-") as tmp:
        scratch = Path(tmp)
        tracked = tracked_files(ROOT)
        servers = [
            Server(args.python, make_tree(ROOT, scratch / f"tree{i}", tracked), config.preload)
            for i in range(args.jobs)
        ]
        try:
            print(
                f"mutate: {len(mutants)} mutants in {len(files)} files; "
                "first the coverage map (the pool of tests, once)",
                flush=True,
            )
            if args.map:
                lines: dict[str, dict[int, set[str]]] = {}
                seconds: dict[str, float] = {}
                for saved in (json.loads(p.read_text()) for p in args.map):
                    for f, by in saved["lines"].items():
                        for n, c in by.items():
                            lines.setdefault(f, {}).setdefault(int(n), set()).update(c)
                    seconds.update(saved["seconds"])
                testmap = TestMap(lines, seconds)
            else:
                also = select_files(args.also_map, config, ROOT) if args.also_map else []
                testmap = build_map(servers, sorted({*files, *also}), config, scratch)
            if args.save_map:
                lines_out = {
                    f: {n: sorted(c) for n, c in by.items()} for f, by in testmap.lines.items()
                }
                args.save_map.write_text(
                    json.dumps({"lines": lines_out, "seconds": testmap.seconds})
                )
            mapped = time.monotonic() - start
            print(f"mutate: map of {len(testmap.seconds)} tests in {mapped:.0f} s", flush=True)
            done = 0

            def progress(m: Mutant) -> None:
                nonlocal done
                if m.outcome == "pending":
                    return
                done += 1
                for keep in {args.resume, args.history} - {None}:
                    if keep is not None:
                        with keep.open("a") as f:
                            f.write(json.dumps(outcome(m)) + "\n")
                if m.outcome in ("survived", "invalid"):
                    cut = f" (cut at the cap after {m.tests} of {m.covering})" if m.capped else ""
                    print(
                        f"[{done}/{len(mutants)}] {m.outcome}{cut}: {m.file}:{m.line} "
                        f"{m.kind}: {m.before} -> {m.after}",
                        flush=True,
                    )
                elif done % 50 == 0:
                    print(f"[{done}/{len(mutants)}] {time.monotonic() - start:.0f} s", flush=True)

            # a seeded random order: the mutants done when a run is stopped are a random
            # sample of all of them, so its figures estimate the whole run's
            random.Random(args.seed).shuffle(mutants)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: STOP.set())
            killers = seed_killers(args.killers) | past_killers(args.history)
            pristine = make_tree(ROOT, scratch / "pristine", tracked)
            run_mutants(mutants, servers, config, testmap, progress, killers, pristine)
        finally:
            for server in servers:
                server.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    mutants = resumed + [m for m in mutants if m.outcome != "pending"]
    if STOP.is_set():
        print(f"mutate: stopped; {len(mutants)} mutants done", flush=True)
    text = report(mutants, time.monotonic() - start, cpu, args.jobs, commit, mapped)
    if args.sample:
        text = f"A random sample of {len(mutants)} of {made} mutants (seed {args.seed}). {text}"
    print(text)
    if args.report:
        args.report.write_text(text)
    if args.results:
        args.results.write_text(json.dumps([outcome(m) for m in mutants], indent=1))
    if args.save_killers:
        saved = save_killers(args.save_killers, [outcome(m) for m in mutants])
        print(f"mutate: {saved} killers saved to {args.save_killers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
