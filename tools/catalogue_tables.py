"""Write the docs' tables of invariants from the catalogue (pagedkv_sql/invariants.py) and
the checks' own doc lines (`make docs`).

Each table sits in a doc between `<!-- catalogue:NAME -->` and `<!-- /catalogue -->`;
docs/invariants.md is written whole. tests/test_docs.py fails while a table differs from
what this writes, so the docs cannot drift from the checks.

    python tools/catalogue_tables.py            # rewrite the tables
    python tools/catalogue_tables.py --check    # exit 1 if one is stale
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pagedkv_sql import faces, invariants, sqlfiles
from pagedkv_sql.invariants import CATALOGUE, ENGINE, FASTCHECK, FLEET, LIVE, REPLAY, SPEC

ROOT = Path(__file__).resolve().parent.parent


def _doc(file: str) -> dict[str, str]:
    """Each statement's doc line(s) of an SQL file, as one sentence."""
    return {s.name: " ".join(s.doc.split()) for s in sqlfiles.statements_in(file)}


def _codes(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def replay_table() -> list[str]:
    docs = _doc("replay.sql")
    lines = [_row("invariant", "check", "what breaks", "planted by"), "| --- | --- | --- | --- |"]
    for name, inv in invariants.checks(REPLAY):
        faults = [f for f in inv.faults if f == name] or list(inv.faults)
        lines.append(
            _row(
                f"`{inv.name}`",
                f"`{name}`",
                docs.get(f"replay_check_{name}", inv.title),
                _codes([f"--fault {f}" for f in faults]),
            )
        )
    return lines


def engine_table() -> list[str]:
    docs = _doc("engines.sql")
    lines = [_row("invariant", "view", "finds"), "| --- | --- | --- |"]
    for name, inv in invariants.checks(ENGINE):
        lines.append(_row(f"`{inv.name}`", f"`{name}`", docs.get(name, inv.title)))
    return lines


def plants_table() -> list[str]:
    lines = [
        _row(
            "engine", "bug", "what it does", "invariant", "the fuzzer's checks", "replay's checks"
        ),
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for engine in faces.FUZZED:
        for plant, what in invariants.plants(engine).items():
            inv = invariants.planted_by("plant", plant, engine)
            lines.append(
                _row(
                    faces.BY_NAME[engine].title,
                    f"`{plant}`",
                    what,
                    f"`{inv.name}`",
                    _codes(inv.checks.get(ENGINE, ())) or "none",
                    _codes(inv.checks.get(REPLAY, ())) or "none",
                )
            )
    return lines


def catalogue_page() -> str:
    """docs/invariants.md: every idea, its check in every model, how it is planted."""
    models = (SPEC, ENGINE, FASTCHECK, REPLAY, LIVE, FLEET)
    head = ["invariant", "what breaks", *models, "planted by"]
    lines = [
        "# Invariants: the catalogue",
        "",
        "Generated from `pagedkv_sql/invariants.py` by `make docs` (`tools/catalogue_tables.py`):",
        "do not edit by hand. Each idea is named once; each model that can see it checks it under",
        'the names below (docs/architecture.md, "A new invariant"). Within one step, findings',
        "are printed in this table's order of rank: a cause before its consequences, and a",
        "consequence names its cause. The conformance test (tests/test_invariants.py) plants",
        "each idea once and requires every model named here to find it.",
        "",
        _row(*head),
        "| " + " | ".join("---" for _ in head) + " |",
    ]
    for inv in sorted(CATALOGUE, key=lambda i: (i.rank, i.name)):
        planted = [f"`--fault {f}`" for f in inv.faults]
        planted += [f"`fuzz {e} --plant {p}`" for e, ps in inv.plants.items() for p in ps]
        cells = [_codes(inv.checks.get(m, ())) for m in models]
        title = inv.title + (f" ({', '.join(inv.upstream)})" if inv.upstream else "")
        if inv.severity == "error":
            title += "; refused"
        lines.append(_row(f"`{inv.name}`", title, *cells, ", ".join(planted)))
    lines += [
        "",
        "## Old names",
        "",
        "Checks and faults renamed to their idea's one word, their old names kept for one",
        "release: the old engine views are views over the new ones (`check` does not run them",
        "twice), and `synth-log --fault` takes the old fault names.",
        "",
        _row("old name", "name"),
        "| --- | --- |",
    ]
    for old, new in (*invariants.RENAMED_VIEWS.items(), *invariants.RENAMED_FAULTS.items()):
        lines.append(_row(f"`{old}`", f"`{new}`"))
    return "\n".join(lines) + "\n"


TABLES: dict[tuple[str, str], Callable[[], list[str]]] = {
    ("docs/replay.md", "replay"): replay_table,
    ("docs/engines.md", "engine"): engine_table,
    ("docs/fuzz.md", "plants"): plants_table,
}
PAGE = ROOT / "docs" / "invariants.md"


def rendered() -> dict[Path, str]:
    """Every file this writes, as it should read."""
    out: dict[Path, str] = {PAGE: catalogue_page()}
    for (doc, name), make in TABLES.items():
        path = ROOT / doc
        text = out.get(path, path.read_text(encoding="utf-8"))
        pattern = re.compile(rf"(<!-- catalogue:{name} -->\n).*?(<!-- /catalogue -->)", re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{doc}: no <!-- catalogue:{name} --> ... <!-- /catalogue --> block")
        body = "\n".join(make()) + "\n"
        start, end = pattern.search(text).span()  # type: ignore[union-attr]  # checked above
        opening = f"<!-- catalogue:{name} -->\n"
        text = text[:start] + opening + body + "<!-- /catalogue -->" + text[end:]
        out[path] = text
    return out


def main(argv: list[str]) -> int:
    stale = [p for p, text in rendered().items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is stale: run `make docs`", file=sys.stderr)
        return 1 if stale else 0
    for p, text in rendered().items():
        p.write_text(text, encoding="utf-8")
    print(f"wrote {', '.join(str(p.relative_to(ROOT)) for p in rendered())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
