"""The core commands: load, resolve, violations, check, explain, repair, stats, synth,
synth-log (`sql` and `example` are cli/sql.py's). Each opens the database, calls one
library function and formats what comes back."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .. import paths
from ..formats import ReportFormat, RowsFormat
from . import common, text
from .common import DbOption, OutOption, ReportOption, guard
from .help import examples

if TYPE_CHECKING:
    from ..database import Database


class InputFormatChoice(str, Enum):
    """What `load` reads; types.InputFormat names the same."""

    facts = "facts"
    tsv = "tsv"
    csv = "csv"
    parquet = "parquet"
    arrow = "arrow"
    arrows = "arrows"
    dl = "dl"


class SynthFormat(str, Enum):
    """What `synth` writes."""

    facts = "facts"
    tsv = "tsv"
    csv = "csv"
    parquet = "parquet"
    arrow = "arrow"


LOAD_EXAMPLES = examples(
    "pagedkv-sql load data/  # a file a relation: root_table.facts, virtual_token.csv...",
    "pagedkv-sql load virtual_token.facts.gz --append  # gzip or zstd, by content",
    "pagedkv-sql load - -r virtual_token -f arrows < tokens.arrows",
    "pagedkv-sql load - < facts.dl  # Datalog facts name their relations",
)
RESOLVE_EXAMPLES = examples(
    "pagedkv-sql resolve  # Soufflé's output: tab-separated, no header",
    "pagedkv-sql resolve -f table",
    "pagedkv-sql resolve -o resolved.csv.gz  # gzip CSV, as DuckDB's COPY TO writes it",
)
CHECK_EXAMPLES = examples(
    "pagedkv-sql check",
    "pagedkv-sql check --strict -o check.json  # warnings fail too; one JSON document",
)


def register(app: typer.Typer) -> None:
    app.command(epilog=LOAD_EXAMPLES)(load)
    app.command(epilog=RESOLVE_EXAMPLES)(resolve)
    app.command()(violations)
    app.command(epilog=CHECK_EXAMPLES)(check)
    app.command(context_settings={"ignore_unknown_options": True})(explain)
    app.command()(repair)
    app.command()(stats)
    app.command()(synth)
    app.command("synth-log")(synth_log)


def load(
    sources: list[str] = typer.Argument(..., metavar="SOURCE", show_default=False),
    db: str | None = DbOption,
    append: bool = typer.Option(
        False, "--append", help="Add to the relations instead of replacing them."
    ),
    strict: bool = common.strict_option("Refuse the load if any diagnostic (warning) fires."),
    fmt: InputFormatChoice | None = common.format_option(
        "Force the input format (default: from each file's extension; facts for stdin)."
    ),
    relation: str | None = typer.Option(
        None,
        "--relation",
        "-r",
        metavar="NAME",
        help="Relation of a single file or of stdin.",
        show_default=False,
    ),
    block_size: int | None = common.block_size_option(
        "Store the block size in tokens (default 16)."
    ),
    diagnostics: bool = common.diagnostics_option(
        "Run the checks beyond the spec after loading and report findings as warnings."
    ),
    max_errors: int = common.max_errors_option(),
    empty_missing: bool = typer.Option(
        False,
        "--empty-missing",
        help="Empty the relations a directory has no file for (default: keep them).",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Print no report and no progress (errors still)."
    ),
) -> None:
    """Load facts, all or nothing: malformed input or a spec violation changes nothing.

    SOURCE is a fact directory, a file (.facts .tsv .csv .parquet .arrow .feather .arrows
    .dl), or - for stdin."""
    with guard(max_errors), common.open_to_write(db) as database:
        with _progress(database, quiet):
            report = database.load(
                *sources,
                append=append,
                strict=strict,
                format=fmt.value if fmt is not None else None,
                relation=relation,
                block_size=block_size,
                stdin=None if paths.CLOSED_STREAMS & {0} else sys.stdin.buffer,
                diagnostics=diagnostics,
                empty_missing=empty_missing,
            )
        if not (quiet or common.quiet()):  # after the bar: the report starts on its own line
            common.err(text.load_summary(report, database.path))


@contextmanager
def _progress(database: Database, quiet: bool) -> Iterator[None]:
    """On a terminal, one labelled bar on stderr a stage of the load (read and check each
    relation, diagnostics, write), each monotone; nothing when quiet or not a terminal."""
    if quiet or common.quiet() or not sys.stderr.isatty():
        yield
        return
    from ..progress import Stages

    with (
        Stages(sys.stderr) as bars,
        common.polling(lambda: bars.update(database.stage(), database.progress())),
    ):
        yield


def resolve(
    db: str | None = DbOption,
    fmt: RowsFormat | None = common.format_option(
        "Output format (default: from the --output extension, else facts: Soufflé's "
        "tab-separated output without a header)."
    ),
    out: str | None = OutOption,
    group: int | None = typer.Option(
        None,
        "--group",
        metavar="N",
        help="After an engine import: the tokens KV-cache group N keeps, at its own blocks, "
        "in the same columns (default: the spec's relations, the primary group's; `stats` "
        "lists the groups).",
        show_default=False,
    ),
) -> None:
    """Print resolved_kv_address, sorted by seq_id, token_pos, physical_address."""
    from .. import output

    # the output is checked before the query starts: a refused --output leaves nothing open
    with guard():
        rows_format = common.rows_format(out, fmt, database=common.db_path(db))
        common.refuse_binary_to_terminal(out, rows_format)
    with guard(), common.open_read_only(db) as database:
        if group is None and out not in (None, "-"):  # a file: DuckDB writes it if it can
            from .. import copyto

            paths.protect_output(out, database.path)
            with common.progress(database, "resolve", out):
                if copyto.resolve(database, out, rows_format) is not None:
                    return
    with (
        guard(),
        common.open_read_only(db) as database,
        common.open_output(out, database.path) as stream,
        common.progress(database, "resolve", out),
    ):
        reader = database.resolve(group=group)
        if rows_format == "table":  # for people: the engine's request ids too, after an import
            reader = database.label_requests(reader)
        output.write_batches(reader, rows_format, stream)


def violations(
    db: str | None = DbOption,
    fmt: RowsFormat | None = common.format_option(
        "Output format (default: from the --output extension, else table)."
    ),
    out: str | None = OutOption,
    block_size: int | None = common.block_size_option(
        "Block size in tokens for this run (default: the stored setting)."
    ),
) -> None:
    """Every offending row of every check, one row each: check, severity, row (as JSON),
    reason, then the finding's invariant, model, request_ids and block_ids. Exit 0 whatever
    is found (check's exit code says whether it passes)."""
    from .. import output

    with guard():
        rows_format = common.rows_format(out, fmt, "table", common.db_path(db))
        common.refuse_binary_to_terminal(out, rows_format)
    with guard(), common.open_read_only(db) as database:
        with common.progress(database, "violations"):
            table = database.violations(block_size=block_size)
        with common.open_output(out, database.path) as stream:
            output.write_table(table, rows_format, stream)


def check(
    db: str | None = DbOption,
    strict: bool = common.strict_option("Count warnings as errors (exit 1)."),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
    limit: int = common.limit_option(20, "Offending rows shown per check (0: all)."),
    block_size: int | None = common.block_size_option(
        "Block size in tokens for this run (default: the stored setting, 16 unless changed)."
    ),
) -> None:
    """Run the spec's constraints (errors) and the diagnostics (warnings); exit 1 on errors.
    Tabular formats write the summary, one row a check."""
    with guard():
        fmt_name = common.report_format(out, fmt, database=common.db_path(db))
    with guard(), common.open_read_only(db) as database:
        with common.progress(database, "check"):
            report = database.check(block_size=block_size, limit=limit or None)
        common.write_check(report, out, fmt_name, database.path)
    if not report.ok(strict):
        raise typer.Exit(1)


def explain(
    seq_id: str = typer.Argument(
        ...,
        metavar="SEQ_ID",
        help="A number as in fact files (0x10, -5: negatives need no --).",
        show_default=False,
    ),
    token_pos: str = typer.Argument(..., metavar="TOKEN_POS", show_default=False),
    db: str | None = DbOption,
    layer: int | None = typer.Option(
        None,
        "--layer",
        metavar="N",
        help="Also show the byte addresses of the token's K and V for this layer "
        "(needs an engine import with cache tensors).",
        show_default=False,
    ),
    head: int = typer.Option(0, "--head", metavar="N", help="The KV head for --layer."),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
) -> None:
    """Show how one token resolves: root -> block table -> entry or swapped block -> tier ->
    address, or exactly where that breaks (then exit 1). Tabular formats write one row a
    way it resolves."""
    import dataclasses

    from .. import output

    kv: list[Any] = []
    with guard():
        ids = (_number(seq_id, "SEQ_ID"), _number(token_pos, "TOKEN_POS"))
        fmt_name = common.report_format(out, fmt, database=common.db_path(db))
    with guard(), common.open_read_only(db) as database:
        e = database.explain(*ids)
        if layer is not None:
            from ..engines import kv_addresses

            kv = kv_addresses(database, ids[0], ids[1], layer, head)
        rows = output.pa_table(
            ["seq_id", "token_pos", "tier", "base", "offset_in_block", "physical_address"],
            [
                [e.seq_id, e.token_pos, r.tier, r.base, r.offset_in_block, r.physical_address]
                for r in e.resolutions
            ],
        )
        document = dataclasses.asdict(e)
        if layer is not None:
            document["kv_addresses"] = [dataclasses.asdict(a) for a in kv]
        shown = text.explain_text(e, kv, layer, head)
        common.write_report(out, fmt_name, shown, document, rows, database.path)
    if e.broken:
        raise typer.Exit(1)


def _number(text: str, name: str) -> int:
    """An id on the command line reads as in fact files: 0x10, -5, never 1.0 or 1_5."""
    from ..errors import UsageError
    from ..numbers import NumberSyntaxError, parse_number

    try:
        return parse_number(text)
    except NumberSyntaxError as e:
        raise UsageError(f"{name}: {e}") from None


def repair(db: str | None = DbOption) -> None:
    """Recreate the views and macros pagedkv-sql keeps in the database (after one was dropped
    from the DuckDB shell, say); the facts are untouched."""
    with guard(), common.open_db(db, must_exist=True) as database:
        database.repair()
    common.err(f"repaired {database.path}")


def stats(
    db: str | None = DbOption,
    block_size: int | None = common.block_size_option(
        "Block size in tokens (default: the stored setting)."
    ),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
) -> None:
    """Sequences, tokens, logical blocks (resident / swapped / missing), physical blocks,
    blocks saved by sharing, refcount histogram, internal fragmentation, bytes per tier;
    after an engine import, each pool's blocks: held, cached, free, reserved, unaccounted;
    with KV-cache groups, each group's kind, layers, requests, blocks held and entries
    without a block. Tabular formats write one row a metric."""
    from .. import output

    with guard():
        fmt_name = common.report_format(out, fmt, database=common.db_path(db))
    with guard(), common.open_read_only(db) as database:
        with common.progress(database, "stats"):
            s = database.stats(block_size)
        histogram = [{"refcount": r, "physical_blocks": n} for r, n in s.refcount_histogram]
        pools = {"pools": [dataclasses.asdict(p) for p in s.pools]} if s.pools else {}
        groups = {"kv_cache_groups": [dataclasses.asdict(g) for g in s.groups]} if s.groups else {}
        rows = text.stats_rows(s)
        common.write_report(
            out,
            fmt_name,
            output.text_table(["metric", "value"], rows),
            {**s.counts, "refcount_histogram": histogram, **pools, **groups},
            output.pa_table(["metric", "value"], rows),
            database.path,
        )


def synth(
    out_dir: Path = typer.Argument(
        ..., metavar="DIR", help="Directory to write.", show_default=False
    ),
    sequences: int = typer.Option(
        1000, "--sequences", "-s", metavar="N", help="Number of sequences."
    ),
    mean_length: int = typer.Option(
        1000, "--mean-length", metavar="N", help="Mean tokens a sequence."
    ),
    block_size: int = common.block_size_option("Tokens a block.", 16),
    fork_fraction: float = typer.Option(
        0.2,
        "--fork-fraction",
        metavar="FRACTION",
        help="Sequences forked from the previous one, sharing half its blocks.",
    ),
    swap_fraction: float = typer.Option(
        0.05, "--swap-fraction", metavar="FRACTION", help="Blocks on CPU."
    ),
    missing_fraction: float = typer.Option(
        0.0, "--missing-fraction", metavar="FRACTION", help="Blocks neither resident nor swapped."
    ),
    wide_addresses: bool = typer.Option(False, "--wide-addresses", help="Addresses above 2^44."),
    anomalies: int = typer.Option(0, "--anomalies", metavar="N", help="Inject N of each anomaly."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Random seed."),
    fmt: SynthFormat = common.format_option(
        "File format (tsv and csv with a header).", SynthFormat.facts
    ),
    # the step log's options, hidden: `synth FILE --steps N` is `synth-log FILE --steps N`
    steps: int | None = typer.Option(None, "--steps", metavar="N", hidden=True),
    faults: list[str] = typer.Option([], "--fault", metavar="NAME@STEP", hidden=True),
    num_gpu_blocks: int = typer.Option(1024, "--num-gpu-blocks", metavar="N", hidden=True),
    arrival_rate: float = typer.Option(1.0, "--arrival-rate", metavar="RATE", hidden=True),
) -> None:
    """Write a realistic synthetic workload into DIR (one file a relation) for tests and
    benchmarks; `synth-log` writes a step log."""
    from ..synth import SynthConfig, synthesize, write

    if steps is not None:
        if not common.quiet():
            common.err(OLD_SYNTH_LOG_NOTE)
        _step_log(out_dir, steps, faults, num_gpu_blocks, arrival_rate, block_size, seed, "synth")
        return
    with guard():
        config = SynthConfig(
            sequences,
            mean_length,
            block_size,
            fork_fraction,
            swap_fraction,
            missing_fraction,
            wide_addresses,
            anomalies,
            seed,
        )
        with common.progress(None, "synth"):
            tables = synthesize(config)
            write(tables, out_dir, fmt.value)
    sizes = ", ".join(f"{r} {t.num_rows}" for r, t in tables.items())
    common.err(f"wrote {out_dir}: {sizes}")


OLD_SYNTH_LOG_NOTE = "note: 'synth --steps' is now 'synth-log'; the old spelling will keep working"


def synth_log(
    out: Path = typer.Argument(
        ...,
        metavar="FILE",
        help="The step log to write: .jsonl, or its event table as .parquet / .arrow.",
        show_default=False,
    ),
    steps: int = typer.Option(1000, "--steps", metavar="N", help="Steps to simulate."),
    faults: list[str] = typer.Option(
        [], "--fault", metavar="NAME@STEP", help="Plant fault NAME at STEP (repeatable)."
    ),
    num_gpu_blocks: int = typer.Option(
        1024, "--num-gpu-blocks", metavar="N", help="Blocks in the pool."
    ),
    arrival_rate: float = typer.Option(
        1.0, "--arrival-rate", metavar="RATE", help="New requests a step, on average."
    ),
    block_size: int = common.block_size_option("Tokens a block.", 16),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Random seed."),
) -> None:
    """Write a synthetic step log into FILE: a paged-KV engine simulated step by step, with
    named faults planted at known steps, for tests and benchmarks of `replay`."""
    _step_log(out, steps, faults, num_gpu_blocks, arrival_rate, block_size, seed, "synth-log")


def _step_log(
    out: Path,
    steps: int,
    faults: list[str],
    num_gpu_blocks: int,
    arrival_rate: float,
    block_size: int,
    seed: int,
    label: str,
) -> None:
    with guard():
        from ..paths import ENV_DB, protect_output
        from ..replay import synth as step_synth

        protect_output(out, common.db_path(os.environ.get(ENV_DB) or None))
        config = step_synth.StepSynthConfig(
            steps=steps,
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            arrival_rate=arrival_rate,
            seed=seed,
            faults=tuple(step_synth.parse_fault(f) for f in faults),
        )
        with common.progress(None, label):
            step_synth.write(config, out)
    planted = ", ".join(faults) or "no faults"
    common.err(f"wrote {out}: {steps} steps, {planted}")
