"""datalog.py: reading Datalog facts among comments, directives and rules; its problems."""

from __future__ import annotations

from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql import datalog
from pagedkv_sql.errors import ConstraintError, InputError

from .helpers import DATA, SEED_OUTPUT, SPEC, state, tsv


def test_a_directive_may_span_lines_inside_its_parentheses(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text(
        ".decl root_table(seq_id: number,\n"
        "                 block_table_ptr: number)\n"
        "root_table(1, 100).\n"
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert db.sql("SELECT * FROM root_table").fetchall() == [(1, 100)]


def test_a_fact_without_its_opening_parenthesis_is_refused_as_such(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table 1, 100).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    expected = "expected a fact such as 'root_table(1, 100).'"
    assert [p.message for p in e.value.problems] == [expected]


def test_facts_after_a_rule_still_load(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table(1, 100).\nr(x) :- root_table(x, _).\nroot_table(2, 200).\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert sorted(db.sql("SELECT * FROM root_table").fetchall()) == [(1, 100), (2, 200)]


def test_an_empty_fact_is_an_arity_problem(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table().\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert e.value.problems[0].message.startswith("root_table has 2 attributes")


def test_a_comment_inside_a_directive_line_does_not_end_it(tmp_path: Path) -> None:
    """A /* comment */ on one line is blank space: the directive around it goes on to the
    end of the line (only a comment spanning lines ends it, as a newline would)."""
    f = tmp_path / "facts.dl"
    f.write_text(
        '.input root_table /* from a file */ (IO=file, filename="r.facts")\n'
        "root_table(1, 100).\n"
        ".decl x(a: number) /* one\n"
        "two */ root_table(2, 200).\n"
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert sorted(db.sql("SELECT * FROM root_table").fetchall()) == [(1, 100), (2, 200)]


def test_a_dot_inside_a_facts_parentheses_does_not_end_the_fact(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text("root_table(1., 100).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [p.message for p in e.value.problems] == ["fact argument '1.' is not a number literal"]


def test_a_fact_must_start_with_a_relation_name() -> None:
    from pagedkv_sql import datalog

    facts = datalog.parse_facts('1(2, 3).\n"root_table"(1, 100).\n', "x.dl")
    expected = "expected a fact such as 'root_table(1, 100).'"
    assert [str(p) for p in facts.problems] == [f"x.dl:1:1: {expected}", f"x.dl:2:1: {expected}"]


def test_a_last_clause_without_its_dot_is_named_where_it_starts() -> None:
    from pagedkv_sql import datalog

    facts = datalog.parse_facts("root_table(1, 100).\n  root_table(2, 200)\n", "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:2:3: clause does not end with '.'"]
    assert facts.rows == {"root_table": [(1, 100)]}
    facts = datalog.parse_facts("root_table\n", "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:1:1: clause does not end with '.'"]


def test_datalog_facts_among_comments_directives_and_rules() -> None:
    """A directive ends at its line's end, or at a block comment that spans lines; facts
    take signs, hex and binary, a sign apart from its number; each row keeps its line."""
    text = (
        "// comment\n"
        ".decl root_table(seq_id: number, block_table_ptr: number)\n"
        ".input root_table /* a comment\n"
        "   over two lines */ root_table(1, 100).\n"
        "root_table(-2, +0x20). root_table(3, - 5).\n"
        "  /* c */ block_table_entry(100, 0, 0b100000000, 1).\n"
        "foo(X) :- root_table(X, _).\n"
        "virtual_token(1, 0, 0, 0).\n"
    )
    facts = datalog.parse_facts(text, "x.dl")
    assert facts.rows == {
        "root_table": [(1, 100), (-2, 32), (3, -5)],
        "block_table_entry": [(100, 0, 256, 1)],
        "virtual_token": [(1, 0, 0, 0)],
    }
    assert facts.lines == {"root_table": [4, 5, 5], "block_table_entry": [6], "virtual_token": [8]}
    assert facts.problem_count == 0


def test_datalog_problems_are_named_at_their_line_and_column() -> None:
    text = (
        "root_table(1, 2.5).\n"
        "root_table(1 2, 3).\n"
        "  root_table(1, x).\n"
        "root_table(, 100).\n"
        "root_table(1, + - 5).\n"
        "unknown_rel(1).\n"
        "resolved_kv_address(1, 2, 3).\n"
        "root_table(1, 2, 3).\n"
        "root_table(1, 2) ` .\n"
        "/* a\n"
        "  b */ root_table(1, y).\n"
        "root_table(0x, 1).\n"
        "root_table(3, 4). /* open\n"
    )
    facts = datalog.parse_facts(text, "x.dl")
    expected = "expected a signed 64-bit integer (decimal, 0x hex or 0b binary)"
    assert [str(p) for p in facts.problems] == [
        f"x.dl:1:15: invalid number '2.5'; {expected}",
        "x.dl:2:12: fact argument '12' is not a number literal",
        "x.dl:3:17: fact argument 'x' is not a number literal",
        f"x.dl:4:1: empty field; {expected}",
        "x.dl:5:15: fact argument '+-5' is not a number literal",
        "x.dl:6:1: facts for unknown relation 'unknown_rel'; input relations are: "
        "root_table, block_table_entry, virtual_token, swapped_block",
        "x.dl:7:1: 'resolved_kv_address' is the spec's output relation; it is computed, not loaded",
        "x.dl:8:1: root_table has 2 attributes, this fact has 3",
        "x.dl:9:18: unexpected character '`'",
        "x.dl:11:22: fact argument 'y' is not a number literal",
        f"x.dl:12:12: invalid number '0x'; {expected}",
        "x.dl:13:19: unterminated /* comment",
    ]
    assert facts.rows == {"root_table": [(1, 2), (3, 4)]}


def test_datalog_keeps_the_first_thousand_problems_and_counts_all(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("root_table(1, x).\n" * (datalog.MAX_PROBLEMS + 1))
    facts = datalog.read_facts(f, "x.dl")
    assert len(facts.problems) == datalog.MAX_PROBLEMS
    assert facts.problem_count == datalog.MAX_PROBLEMS + 1
    assert facts.problems[-1].line == datalog.MAX_PROBLEMS


def test_datalog_not_utf8_is_named_at_its_line(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_bytes(b"\xef\xbb\xbfroot_table(1, 100).\nroot_table(2, \xff).\n")
    facts = datalog.read_facts(f, "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:2: not UTF-8 text; save the file as UTF-8"]
    f.write_bytes(b"\xef\xbb\xbfroot_table(1, 100).\n")
    assert datalog.read_facts(f, "x.dl").rows == {"root_table": [(1, 100)]}


def test_datalog_keeps_exactly_one_thousand_problems(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("root_table(1, x).\n" * 1002)
    facts = datalog.read_facts(f, "x.dl")
    assert (len(facts.problems), facts.problem_count) == (1000, 1002)


def test_a_violation_in_a_datalog_file_is_located_by_its_line(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("block_table_entry(1, 0, 256, 1).\n\nblock_table_entry(1, 1, 300, 1).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load(f)
    assert [v.locations for v in e.value.violations] == [(f"{f}:3",)]


def test_each_unexpected_character_in_datalog_is_named() -> None:
    facts = datalog.parse_facts("root_table(1, 2) `` .\n", "x.dl")
    assert [str(p) for p in facts.problems] == [
        "x.dl:1:18: unexpected character '`'",
        "x.dl:1:19: unexpected character '`'",
    ]


@pytest.mark.skipif(not SPEC.exists(), reason="shared/spec is not beside the checkout")
def test_the_spec_file_itself_loads_to_the_same_state(db: pagedkv_sql.Database) -> None:
    db.load(SPEC)
    assert tsv(db.resolve_table()) == SEED_OUTPUT


def test_datalog_facts_for_the_output_relation_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("// comment\nroot_table(1, 2).\nresolved_kv_address(1, 2, 3).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as info:
        db.load(f)
    assert [str(p) for p in info.value.problems] == [
        f"{f}:3:1: 'resolved_kv_address' is the spec's output relation; it is computed, not loaded"
    ]


@pytest.mark.skipif(not SPEC.exists(), reason="shared/spec is not beside the checkout")
def test_spec_file_loads_like_data_dir() -> None:
    with pagedkv_sql.connect(":memory:") as a, pagedkv_sql.connect(":memory:") as b:
        a.load(SPEC)
        b.load(DATA)
        assert state(a) == state(b)


def test_datalog_fact_missing_its_final_dot(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text(
        "root_table(1, 100)\nroot_table(2, 200).\n"
        "block_table_entry(100, 0, 256, 1)\nfoo(X) :- root_table(X, _).\n"
    )
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [str(p) for p in e.value.problems] == [
        f"{f}:1:19: missing '.' after this clause (every fact ends with '.')",
        f"{f}:3:34: missing '.' after this clause (every fact ends with '.')",
    ]
