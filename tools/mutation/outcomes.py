"""What a run leaves: each mutant's outcome as JSON, the Markdown report, the history of
earlier runs and the versioned killers file (the test that last killed each mutant, run
first next time), and the report of earlier outcomes against today's code (--report-only)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .config import ROOT, Config, Mutant
from .mutants import collect

# -- report -------------------------------------------------------------------------------


def outcome(m: Mutant) -> dict[str, Any]:
    fields = "file line kind before after outcome killer tests covering capped hinted cpu seconds"
    return {f: getattr(m, f) for f in fields.split()}


def report(
    mutants: list[Mutant], wall: float, cpu: float, jobs: int, commit: str, mapped: float = 0.0
) -> str:
    invalid = [m for m in mutants if m.outcome == "invalid"]
    valid = [m for m in mutants if m.outcome != "invalid"]
    files: dict[str, list[Mutant]] = {}
    for m in valid:
        files.setdefault(m.file, []).append(m)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        f"Mutation report, {when}, commit {commit}: {len(valid)} mutants, "
        f"{wall:.0f} s wall, {cpu:.0f} s CPU, {jobs} job(s).",
    ]
    if mapped and wall > mapped and valid:
        tested = sum(m.cpu for m in valid)
        out.append(
            f"The coverage map took {mapped:.0f} s wall; then {len(valid)} mutants in "
            f"{wall - mapped:.0f} s wall, {60 * len(valid) / (wall - mapped):.1f} mutants a "
            f"minute, {tested / len(valid):.2f} CPU s of tests a mutant."
        )
    out += [
        "",
        "| file | mutants | killed | timeout | survived | of which equivalent | killed % "
        "| of non-equivalent % | test CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def row(name: str, ms: list[Mutant]) -> str:
        killed = sum(m.killed for m in ms)
        hung = sum(m.outcome == "timeout" for m in ms)
        survived = [m for m in ms if not m.killed]
        equivalent = sum(m.why is not None for m in survived)
        ratio = 100.0 * killed / len(ms) if ms else 100.0
        real = len(ms) - equivalent
        of_real = f"{100.0 * killed / real:.1f}" if real else "-"
        return (
            f"| {name} | {len(ms)} | {killed} | {hung} | {len(survived)} | {equivalent} | "
            f"{ratio:.1f} | {of_real} | {sum(m.cpu for m in ms):.0f} |"
        )

    out += [row(f"`{f}`", ms) for f, ms in sorted(files.items())]
    out.append(row("**total**", valid))
    survivors = sorted((m for m in valid if not m.killed), key=lambda m: (m.file, m.line))
    if survivors:
        out += ["", "Survivors:", ""]
        for m in survivors:
            verdict = f"equivalent: {m.why}" if m.why else "**not explained**"
            if m.killer:  # "no test runs this line"
                verdict = f"{m.killer}; {verdict}"
            elif m.capped:
                verdict = (
                    f"cut at the CPU cap: ran {m.tests} of {m.covering} tests "
                    f"in {m.cpu:.0f} CPU s; {verdict}"
                )
            else:
                verdict = f"ran all {m.tests} tests; {verdict}"
            out.append(f"- `{m.file}:{m.line}` {m.kind}: `{m.before}` → `{m.after}` ({verdict})")
    hung = sorted((m for m in valid if m.outcome == "timeout"), key=lambda m: (m.file, m.line))
    if hung:
        out += ["", "Killed by timeout (the test that ran over its limit):", ""]
        out += [
            f"- `{m.file}:{m.line}` {m.kind}: `{m.before}` → `{m.after}` ({m.killer or 'backstop'})"
            for m in hung
        ]
    if invalid:
        out += ["", f"Not counted: {len(invalid)} mutant(s) cosmic-ray listed but could not make:"]
        out += [f"- `{m.file}:{m.line}` {m.kind}: {m.killer}" for m in invalid]
    return "\n".join(out) + "\n"


def read_outcomes(path: Path) -> list[dict[str, Any]]:
    """Outcomes written by --results (one JSON list) or --resume / --history (JSON lines)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def past_killers(path: Path | None) -> dict[tuple[str, ...], str]:
    """The test that last killed each mutant, by its key (file, kind, before, after)."""
    if path is None or not path.exists():
        return {}
    return last_killers(read_outcomes(path))


def last_killers(outcomes: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], str]:
    """The test that killed each mutant last in these outcomes (in order), by its key."""
    killers: dict[tuple[str, ...], str] = {}
    for r in outcomes:
        key = (r["file"], r["kind"], r["before"], r["after"])
        if r["outcome"] in ("killed", "timeout") and "::" in r.get("killer", ""):
            killers[key] = r["killer"]
    return killers


def digest(key: tuple[str, ...]) -> str:
    """A mutant's key (file, kind, before, after) in 16 hex digits: how the versioned
    killers file names it."""
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]


def seed_killers(path: Path | None) -> dict[tuple[str, ...], str]:
    """The versioned last killers (`--killers`, tools/mutate-killers.jsonl): a line a test,
    with the digests of the mutants it killed last. Keyed by `(digest,)`, beside the full
    keys of `--history`, which win (see `last_killer`)."""
    killers: dict[tuple[str, ...], str] = {}
    if path is None or not path.exists():
        return killers
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            killers.update(((d,), r["killer"]) for d in r["mutants"])
    return killers


def last_killer(killers: dict[tuple[str, ...], str], m: Mutant) -> str | None:
    """The test that killed `m` last: from `--history` if it knows, else the killers file."""
    return killers.get(m.key) or killers.get((digest(m.key),))


def save_killers(path: Path, outcomes: list[dict[str, Any]]) -> int:
    """Write the killers file from outcomes: the last killer of each mutant ever killed
    (as `past_killers` reads --history), grouped by test, sorted (a small, stable diff)."""
    last = last_killers(outcomes)
    tests: dict[str, list[str]] = {}
    for known, test in last.items():
        tests.setdefault(test, []).append(digest(known))
    path.write_text(
        "".join(
            json.dumps({"killer": t, "mutants": sorted(ds)}) + "\n"
            for t, ds in sorted(tests.items())
        )
    )
    return len(last)


def report_only(files: list[Path], config: Config) -> str:
    """The report of earlier outcomes: the last outcome of each mutant across `files`,
    only for the mutants that today's code and rules make, with today's equivalents."""
    last: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    for path in files:
        for r in read_outcomes(path):
            last[(r["file"], r["kind"], r["line"], r["after"])] = r
    today = set()
    for m in collect(sorted({f for f, _, _, _ in last}), ROOT, config):
        with contextlib.suppress(Exception):
            m.mutate((ROOT / m.file).read_text(), config)
            today.add((m.file, m.kind, m.line, m.after))
    results = []
    for key, r in last.items():
        if key not in today:
            continue
        m = Mutant(r["file"], r["kind"], lambda text: text, r["line"], r["before"], r["after"])
        for f in ("outcome", "killer", "tests", "covering", "cpu", "seconds"):
            setattr(m, f, r[f])
        m.capped = r.get("capped", False)
        m.why = config.equivalent(m.file, m.before, m.after)
        results.append(m)
    dropped = len(last) - len(results)
    text = report(results, 0.0, sum(m.cpu for m in results), 0, "(from results)")
    return text + (f"\nLeft out: {dropped} outcome(s) of mutants today's code does not make.\n")
