"""Facts written in Soufflé's own syntax (``.dl`` files).

``root_table(1, 100).`` and ``block_table_entry(100, 0, 0x10000000, 2).`` are facts; the
declarations, directives, rules and constraints around them are skipped, so the spec file
itself loads. Comments are ``//`` to the end of the line and ``/* ... */``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Problem
from .numbers import NumberSyntaxError, parse_number, shown
from .relations import INPUT_RELATIONS, OUTPUT_RELATION, did_you_mean

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+)
  | (?P<nl>\n)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<open_comment>/\*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>[0-9][0-9A-Za-z_]*(?:\.[0-9][0-9A-Za-z_]*)?)
  | (?P<ident>[A-Za-z_?][A-Za-z0-9_?]*)
  | (?P<rule>:-)
  | (?P<punct>[().,;:\-+*/%<>=!{}\[\]&|^~$@#])
    """,
    re.VERBOSE | re.DOTALL,
)
_OPEN = {"(": ")", "{": "}", "[": "]"}


@dataclass
class Token:
    kind: str
    text: str
    line: int
    column: int


MAX_PROBLEMS = 1000  # problems kept per file; the rest are counted


class Problems(list[Problem]):
    """The first MAX_PROBLEMS problems, and how many there were in all."""

    total = 0

    def append(self, problem: Problem) -> None:
        self.total += 1
        if len(self) < MAX_PROBLEMS:
            super().append(problem)


@dataclass
class DatalogFacts:
    """The facts of one file: per relation, rows and the line each row came from."""

    rows: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    lines: dict[str, list[int]] = field(default_factory=dict)
    problems: Problems = field(default_factory=Problems)

    @property
    def problem_count(self) -> int:
        return self.problems.total


def _tokens(text: str, source: str, problems: Problems) -> Iterator[Token]:
    line, line_start, pos = 1, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        column = pos - line_start + 1
        if m is None:
            problems.append(Problem(source, line, column, f"unexpected character {text[pos]!r}"))
            pos += 1
            continue
        kind = m.lastgroup or ""
        if kind == "open_comment":
            problems.append(Problem(source, line, column, "unterminated /* comment"))
            return
        if kind in ("nl", "block_comment"):
            newlines = m.group().count("\n")
            if kind == "nl" or newlines:
                # a comment spanning lines still ends a directive line
                yield Token("nl", "\n", line, column)
            line += newlines
            if newlines:
                line_start = m.start() + m.group().rfind("\n") + 1
        elif kind not in ("ws", "line_comment"):
            yield Token(kind, m.group(), line, column)
        pos = m.end()


def _statements(tokens: Iterator[Token]) -> Iterator[tuple[str, list[Token]]]:
    """Group tokens into ('directive' | 'clause', tokens). A directive runs to the end of
    its line (or further while a bracket is open); a clause runs to a '.' at depth 0. A
    name right after a ')' that closed depth 0 starts a new clause: the one before it lacks
    its '.' (it comes out as an 'unfinished' clause, an error)."""
    pending: list[Token] = []
    kind = ""
    depth = 0
    for tok in tokens:
        if (
            kind == "clause"
            and depth == 0
            and tok.kind == "ident"
            and pending
            and pending[-1].text == ")"
        ):
            yield "unfinished", pending
            pending = []
        if not pending:
            if tok.kind == "nl":
                continue
            kind = "directive" if tok.text == "." else "clause"
            depth = 0
        if tok.kind == "nl":
            if kind == "directive" and depth <= 0:
                yield kind, pending
                pending = []
            continue
        pending.append(tok)
        if tok.text in _OPEN:
            depth += 1
        elif tok.text in _OPEN.values():
            depth -= 1
        elif tok.text == "." and kind == "clause" and depth <= 0:
            yield kind, pending
            pending = []
    if pending:
        yield kind, pending


def parse_facts(text: str, source: str) -> DatalogFacts:
    """Collect the input facts of a Datalog text, with every problem found."""
    out = DatalogFacts()
    problems = out.problems
    for kind, toks in _statements(_tokens(text, source, problems)):
        if kind == "directive":
            continue
        if kind == "unfinished":
            last = toks[-1]
            problems.append(
                Problem(
                    source,
                    last.line,
                    last.column + 1,
                    "missing '.' after this clause (every fact ends with '.')",
                )
            )
            continue
        if toks[-1].text != ".":
            first = toks[0]
            problems.append(
                Problem(source, first.line, first.column, "clause does not end with '.'")
            )
            continue
        if any(t.kind == "rule" for t in toks):
            continue  # a rule or a constraint
        _fact(toks[:-1], source, out)
    return out


def _fact(toks: list[Token], source: str, out: DatalogFacts) -> None:
    head = toks[0]
    if head.kind != "ident" or len(toks) < 3 or toks[1].text != "(" or toks[-1].text != ")":
        out.problems.append(
            Problem(source, head.line, head.column, "expected a fact such as 'root_table(1, 100).'")
        )
        return
    name = head.text
    if name not in INPUT_RELATIONS:
        if name == OUTPUT_RELATION:
            msg = f"'{name}' is the spec's output relation; it is computed, not loaded"
        else:
            msg = f"facts for unknown relation '{name}'{did_you_mean(name)}"
        out.problems.append(Problem(source, head.line, head.column, msg))
        return
    args: list[list[Token]] = [[]]
    for tok in toks[2:-1]:
        if tok.text == ",":
            args.append([])
        else:
            args[-1].append(tok)
    arity = len(INPUT_RELATIONS[name])
    if len(args) != arity:
        out.problems.append(
            Problem(
                source,
                head.line,
                head.column,
                f"{name} has {arity} attributes, this fact has {len(args)}",
            )
        )
        return
    values: list[int] = []
    for arg in args:
        where = arg[0] if arg else head
        text = "".join(t.text for t in arg)
        if (
            len(arg) > 2
            or (len(arg) == 2 and arg[0].text not in "+-")
            or (arg and arg[-1].kind != "number")
        ):
            out.problems.append(
                Problem(
                    source,
                    where.line,
                    where.column,
                    f"fact argument {shown(text)} is not a number literal",
                )
            )
            return
        try:
            values.append(parse_number(text))
        except NumberSyntaxError as e:
            out.problems.append(Problem(source, where.line, where.column, str(e)))
            return
    out.rows.setdefault(name, []).append(tuple(values))
    out.lines.setdefault(name, []).append(head.line)


# how a Datalog text starts: a directive, a comment, a preprocessor line or a fact
# `name(`; never a number (a fact file) nor a header `seq_id<TAB>...` (TSV, CSV)
_DATALOG_START = re.compile(rb"\s*(?:\.(?:decl|input|output|type)\b|//|/\*|#|[A-Za-z_]\w*\s*\()")


def looks_like_facts(head: bytes) -> bool:
    """Do the first bytes of an input without a name (stdin) read as Datalog facts?"""
    return _DATALOG_START.match(head.removeprefix(b"\xef\xbb\xbf")) is not None


def read_facts(path: Path, label: str) -> DatalogFacts:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        out = DatalogFacts()
        out.problems.append(Problem(label, line, None, "not UTF-8 text; save the file as UTF-8"))
        return out
    return parse_facts(text, label)
