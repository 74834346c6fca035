"""The views of ``sql/`` in Spark SQL: one source of truth, translated, never copied.

Each view of ``resolve.sql`` and ``constraints.sql`` is parsed as DuckDB SQL by sqlglot,
its macros are expanded in place (Spark has no macros), and it is written in the Spark
dialect. Where sqlglot has no Spark form of a DuckDB construct the core SQL is written in
a portable form instead (see the header of ``sql/constraints.sql``); the one exception is
DuckDB's 128-bit ``HUGEINT``, which stays in the core (DuckDB computes it three times
faster than a decimal) and becomes Spark's ``DECIMAL(38, 0)`` here.

``partition_by`` lifts every view to run once per value of a partition column that every
input relation carries (a replica, a snapshot time): the column joins every join, groups
every aggregate and window and correlates every subquery, so each partition value is
resolved and checked on its own, in one Spark job. A construct the lift does not know
raises instead of being translated wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from itertools import count

import sqlglot
from sqlglot import exp

from ..errors import PagedKVError, UsageError
from ..relations import INPUT_RELATIONS
from ..sqlfiles import statements_in

SOURCE_FILES = ("schema.sql", "constraints.sql", "resolve.sql")
SETTINGS = "pagedkv_settings"
_INNER = "_pkv_inner"
_VALUE = "_pkv_value"
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TranslationError(PagedKVError):
    """A view of sql/ uses a construct the Spark translation does not know: a bug in
    pagedkv-sql itself, found by the tests, not by users."""


@dataclass(frozen=True)
class _Macro:
    params: tuple[str, ...]
    body: exp.Expr
    table: bool  # a table macro (query_table(param) names a relation)


@dataclass(frozen=True)
class SparkView:
    name: str
    sql: str  # a Spark SQL query


@cache
def _parsed() -> tuple[dict[str, _Macro], dict[str, exp.Query]]:
    macros: dict[str, _Macro] = {}
    views: dict[str, exp.Query] = {}
    for file in SOURCE_FILES:
        for stmt in statements_in(file):
            if not stmt.sql.lstrip().upper().startswith("CREATE"):
                continue
            tree = sqlglot.parse_one(stmt.sql, read="duckdb")
            if not isinstance(tree, exp.Create):
                continue
            kind = str(tree.args.get("kind") or "").upper()
            if kind == "MACRO":
                udf = tree.this
                params = tuple(p.name for p in udf.expressions)
                body = tree.expression
                macros[udf.this.name.lower()] = _Macro(params, body, isinstance(body, exp.Query))
            elif kind == "VIEW":
                body = tree.expression
                assert isinstance(body, exp.Query)
                views[tree.this.name] = body
    return macros, views


def view_names() -> list[str]:
    """The views, in the order of the files (each view only uses the ones before it)."""
    return list(_parsed()[1])


def check_partition_column(column: str) -> str:
    if not _COLUMN.match(column):
        raise UsageError(
            f"partition column '{column}' is not a plain column name",
            hint="use letters, digits and _ (e.g. replica, snapshot)",
        )
    taken = {c for cols in INPUT_RELATIONS.values() for c in cols}
    taken |= {"reason", "physical_address", "name", "value"}
    if column.lower() in taken or column.lower().startswith("_pkv"):
        raise UsageError(
            f"partition column '{column}' is a column of the spec's relations or checks",
            hint="name the partition something else (e.g. replica, snapshot)",
        )
    return column


def spark_views(partition_by: str | None = None, dialect: str = "spark") -> list[SparkView]:
    """Every view of sql/ as Spark SQL, in dependency order. ``dialect="duckdb"`` writes
    the same translation (macros expanded, partitions lifted) for DuckDB, which the tests
    hold against the views themselves."""
    return list(_spark_views(partition_by, dialect))


@cache
def _spark_views(partition_by: str | None, dialect: str) -> tuple[SparkView, ...]:
    macros, views = _parsed()
    partitioned = set(INPUT_RELATIONS) | set(views)
    out = []
    for name, body in views.items():
        tree = _expand(body.copy(), macros)
        if partition_by is not None:
            tree = _Lift(partition_by, partitioned).query(tree)
        if dialect == "spark":
            tree = tree.transform(_spark_types)
        out.append(SparkView(name, tree.sql(dialect=dialect)))
    return tuple(out)


def translate(query: str, partition_by: str | None = None) -> str:
    """Any query over the spec's relations and views, written for DuckDB, in Spark SQL."""
    macros, views = _parsed()
    tree = _expand(sqlglot.parse_one(query, read="duckdb"), macros)
    if partition_by is not None:
        assert isinstance(tree, exp.Query)
        tree = _Lift(partition_by, set(INPUT_RELATIONS) | set(views)).query(tree)
    return tree.transform(_spark_types).sql(dialect="spark")


# -- macro expansion ------------------------------------------------------------------


def _expand(tree: exp.Expr, macros: dict[str, _Macro]) -> exp.Expr:
    """Replace every macro call by its body, arguments substituted, until none is left."""

    def call(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
            macro = macros.get(node.this.name.lower())
            if macro is None or not macro.table:
                raise TranslationError(f"unknown table function {node.this.sql('duckdb')}")
            body = _substitute(macro, node.this.expressions)
            alias = node.alias or node.this.name.lower()
            return exp.Subquery(this=body, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        if isinstance(node, exp.Anonymous) and node.name.lower() in macros:
            macro = macros[node.name.lower()]
            return exp.Paren(this=_substitute(macro, node.expressions))
        return node

    for _ in range(10):
        before = tree.sql("duckdb")
        tree = tree.transform(call)
        if tree.sql("duckdb") == before:
            return tree
    raise TranslationError("macros nest more than 10 deep")


def _substitute(macro: _Macro, args: list[exp.Expr]) -> exp.Expr:
    if len(args) != len(macro.params):
        raise TranslationError(f"macro takes {len(macro.params)} arguments, given {len(args)}")
    values = dict(zip(macro.params, args, strict=True))

    def sub(node: exp.Expr) -> exp.Expr:
        # query_table('relation') in a table macro: the relation itself
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Anonymous)
            and node.this.name.lower() == "query_table"
        ):
            (arg,) = node.this.expressions
            arg = values.get(arg.name, arg) if isinstance(arg, exp.Column) else arg
            if not isinstance(arg, exp.Literal) or not arg.is_string:
                raise TranslationError(f"query_table of {arg.sql('duckdb')}")
            table = exp.to_table(arg.this)
            if node.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(node.alias)))
            return table
        if isinstance(node, exp.Column) and not node.table and node.name in values:
            value = values[node.name].copy()
            return value if isinstance(value, exp.Literal) else exp.Paren(this=value)
        return node

    return macro.body.copy().transform(sub)


def _spark_types(node: exp.Expr) -> exp.Expr:
    """DuckDB's HUGEINT (128-bit) has no Spark type: DECIMAL(38, 0) holds every value the
    views compute in it (products and differences of two 64-bit numbers)."""
    if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.INT128:
        return exp.DataType.build("DECIMAL(38, 0)")
    return node


# -- the partition lift ---------------------------------------------------------------


class _Lift:
    """Rewrite a query so that it runs independently for every value of column ``part``."""

    def __init__(self, part: str, partitioned: set[str]) -> None:
        self.part = part
        self.partitioned = set(partitioned)
        self.names = count()

    def col(self, table: str | None) -> exp.Column:
        return exp.column(self.part, table=table)

    def query(self, q: exp.Expr) -> exp.Query:
        if isinstance(q, exp.Subquery):
            q.set("this", self.query(q.this))
            return q
        if isinstance(q, exp.SetOperation):
            q.set("this", self.query(q.this))
            q.set("expression", self.query(q.expression))
            self._ctes(q)
            return q
        if isinstance(q, exp.Select):
            return self.select(q)
        raise TranslationError(f"cannot partition a {type(q).__name__}: {q.sql('duckdb')}")

    def _ctes(self, q: exp.Expr) -> None:
        with_ = q.args.get("with_")
        if with_ is None:
            return
        for cte in with_.expressions:
            cte.set("this", self.query(cte.this))
            self.partitioned.add(cte.alias_or_name)

    def _source(self, node: exp.Expr) -> tuple[bool, str | None]:
        """Lift one FROM or JOIN source: (does it carry the partition, its name)."""
        if isinstance(node, exp.Table):
            if node.name == SETTINGS and not node.alias:
                return False, node.name
            if node.name not in self.partitioned:
                raise TranslationError(f"unknown relation {node.name}")
            return True, node.alias_or_name
        if isinstance(node, exp.Subquery):
            node.set("this", self.query(node.this))
            return True, node.alias or None
        raise TranslationError(f"cannot partition a {type(node).__name__} source")

    def select(self, s: exp.Select) -> exp.Select:
        self._ctes(s)
        from_ = s.args.get("from_")
        if from_ is None:
            return s  # a constant row: the same in every partition
        carries, first = self._source(from_.this)
        if not carries:
            return s  # a lookup in the unpartitioned settings
        for join in s.args.get("joins") or []:
            joined, name = self._source(join.this)
            if not joined:
                raise TranslationError("a join with an unpartitioned relation")
            if join.args.get("using"):
                join.set("using", [*join.args["using"], exp.to_identifier(self.part)])
            elif join.args.get("on") is not None:
                if first is None or name is None:
                    raise TranslationError("an ON join of an unnamed subquery")
                same = exp.EQ(this=self.col(first), expression=self.col(name))
                join.set("on", exp.and_(join.args["on"], same))
            else:
                raise TranslationError("a join without USING or ON")
        own = self.col(first)
        # the subqueries of WHERE run per partition: correlate them with this one's
        where = s.args.get("where")
        if where is not None:
            for node in list(where.find_all(exp.In, exp.Exists, exp.Subquery)):
                if self._in_this_select(node, s) and node.find_ancestor(exp.Exists) is None:
                    node.replace(self._predicate(node, own))
        # windows and groups: per partition
        for window in s.find_all(exp.Window):
            if self._in_this_select(window, s):
                window.set("partition_by", [own.copy(), *(window.args.get("partition_by") or [])])
        star = any(isinstance(e, exp.Star) for e in s.expressions)
        if not star:
            s.set("expressions", [exp.alias_(own.copy(), self.part), *s.expressions])
        group = s.args.get("group")
        if group is not None and not group.args.get("all"):
            group.set("expressions", [own.copy(), *group.expressions])
        elif group is None and not star and self._aggregates(s):
            s.set("group", exp.Group(expressions=[own.copy()]))
        return s

    def _predicate(self, node: exp.Expr, own: exp.Column) -> exp.Expr:
        if isinstance(node, exp.In) and node.args.get("query") is not None:
            # x IN (SELECT v FROM r) -> EXISTS (SELECT 1 FROM (r with p) WHERE p = p AND v = x)
            inner = node.args["query"].this
            if len(inner.expressions) != 1:
                raise TranslationError("an IN subquery of more than one column")
            inner.set("expressions", [exp.alias_(inner.expressions[0], _VALUE)])
            name = f"{_INNER}{next(self.names)}"
            lifted = exp.Subquery(
                this=self.query(inner), alias=exp.TableAlias(this=exp.to_identifier(name))
            )
            cond = exp.and_(
                exp.EQ(this=self.col(name), expression=own.copy()),
                exp.EQ(this=exp.column(_VALUE, table=name), expression=node.this.copy()),
            )
            return exp.Exists(this=exp.select("1").from_(lifted).where(cond))
        if isinstance(node, exp.Exists):
            inner = node.this
            if not isinstance(inner, exp.Select) or inner.args.get("joins"):
                raise TranslationError("an EXISTS subquery that is not a single-table SELECT")
            table = inner.args["from_"].this
            if not isinstance(table, exp.Table):
                raise TranslationError("an EXISTS subquery over a subquery")
            name = f"{_INNER}{next(self.names)}"
            old = table.alias_or_name
            table.set("alias", exp.TableAlias(this=exp.to_identifier(name)))
            for c in inner.find_all(exp.Column):
                if c.table == old:
                    c.set("table", exp.to_identifier(name))
            self.select(inner)
            same = exp.EQ(this=self.col(name), expression=own.copy())
            inner.where(same, copy=False)
            return node
        if isinstance(node, exp.Subquery) and isinstance(node.parent, exp.In):
            return node  # lifted with its IN
        if isinstance(node, exp.Subquery) and self._settings_lookup(node.this):
            return node
        raise TranslationError(f"a subquery in WHERE: {node.sql('duckdb')}")

    @staticmethod
    def _settings_lookup(q: exp.Expr) -> bool:
        tables = list(q.find_all(exp.Table))
        return bool(tables) and all(t.name == SETTINGS for t in tables)

    @staticmethod
    def _in_this_select(node: exp.Expr, s: exp.Select) -> bool:
        parent = node.parent
        while parent is not None and not isinstance(parent, exp.Query):
            parent = parent.parent
        return parent is s

    def _aggregates(self, s: exp.Select) -> bool:
        return any(
            isinstance(agg, exp.AggFunc)
            and self._in_this_select(agg, s)
            and agg.find_ancestor(exp.Window) is None
            for e in s.expressions
            for agg in e.find_all(exp.AggFunc)
        )
