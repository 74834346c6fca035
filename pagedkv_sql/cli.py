"""The command line: a thin shell over the library. Each command opens the database,
calls one library function and formats what comes back."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import IO, Any

import typer

from . import output, paths
from .clihelp import PlainTyper
from .database import DEFAULT_DB, ENV_DB, Database, connect
from .errors import PagedKVError
from .load import LoadReport
from .output import ReportFormat, RowsFormat, TextFormat
from .spill import ENV_MEMORY_LIMIT


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


app = PlainTyper(
    name="pagedkv-sql",
    help="Keep, check and query the address-translation state of a PagedAttention KV cache "
    "(the Soufflé spec paged_attention.dl) in a DuckDB database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help and plain usage errors, like our own errors
    context_settings={"help_option_names": ["-h", "--help"]},
)

DB_HELP = f"Database file (default: {DEFAULT_DB} here); ':memory:' works."
DbOption = typer.Option(
    None, "--db", metavar="PATH", help=DB_HELP, envvar=ENV_DB, show_default=False
)
OutOption = typer.Option(
    None,
    "--output",
    "-o",
    metavar="FILE",
    help="Write to FILE instead of stdout ('-': stdout); its extension picks the format "
    "when --format is not given.",
    show_default=False,
)
TextFormatOption = typer.Option(TextFormat.text, "--format", "-f", help="text or json.")
MAX_ERRORS_HELP = "List at most N offending rows or lines (0: all)."
# the --db given before the subcommand (or $PAGEDKV_DB), which one given after it overrides
_root_db: str | None = None
_root_db_given = False  # on the command line, so it beats $PAGEDKV_DB after the subcommand
_memory_limit: str | None = None  # --memory-limit / $PAGEDKV_MEMORY_LIMIT: DuckDB's


def _version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"pagedkv-sql {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    db: str | None = DbOption,
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        help="Print the version and exit.",
        callback=_version,
        is_eager=True,
    ),
    memory_limit: str | None = typer.Option(
        None,
        "--memory-limit",
        metavar="SIZE",
        envvar=ENV_MEMORY_LIMIT,
        help="DuckDB's memory limit, e.g. 4GB (default: DuckDB's, 80% of RAM); beyond it, "
        "work spills to a temp directory beside the database, removed afterwards.",
        show_default=False,
    ),
) -> None:
    """Keep, check and query the address-translation state of a PagedAttention KV cache
    (the Soufflé spec paged_attention.dl) in a DuckDB database."""
    global _root_db, _root_db_given, _memory_limit
    _root_db = db
    _memory_limit = memory_limit
    source = ctx.get_parameter_source("db")
    _root_db_given = source is not None and source.name == "COMMANDLINE"


def _err(text: str) -> None:
    """A report on stderr. A closed or full stderr loses the report, never the outcome:
    the exit code still says what happened (docs/decisions.md)."""
    try:
        typer.echo(text, err=True)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fail(error: PagedKVError, max_errors: int) -> None:
    _err(f"Error: {error.message}")
    details = error.details
    shown = details if max_errors == 0 else details[:max_errors]
    for line in shown:
        _err(f"  {line}")
    total = getattr(error, "total", len(details))
    if total > len(shown):
        _err(f"  ... and {total - len(shown)} more (--max-errors 0 lists all that were kept)")
    if error.hint:
        _err(f"Fix: {error.hint}")
    raise typer.Exit(error.exit_code)


@contextmanager
def _guard(max_errors: int = 100) -> Iterator[None]:
    """The one place where the project's errors become a message and an exit code."""
    try:
        yield
    except PagedKVError as e:
        _fail(e, max_errors)
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): not an error of ours
        paths.silence_stdout()
        raise typer.Exit(0) from None
    except OSError as e:  # stdout full (/dev/full) or gone: the output is incomplete
        paths.silence_stdout()
        _fail(PagedKVError(f"cannot write the output: {e.strerror or e}"), max_errors)
    except Exception as e:
        if not _interrupted(e):
            raise
        # Ctrl-C inside a DuckDB query: the transaction was rolled back, output dropped
        _err("Error: interrupted; nothing was changed")
        raise typer.Exit(130) from None


def _interrupted(error: BaseException) -> bool:
    """DuckDB reports a Ctrl-C during a query as its InterruptException, or as a
    RuntimeError 'Query interrupted' from a result being fetched."""
    name = type(error).__name__
    return name == "InterruptException" or (
        isinstance(error, RuntimeError) and "interrupted" in str(error).lower()
    )


def _db_path(db: str | None) -> str:
    """--db after the subcommand, else before it, else $PAGEDKV_DB, else pagedkv.duckdb. An
    empty one, wherever given (an unset variable in a script), is kept: connect() refuses
    it, it never means the default file. ($PAGEDKV_DB set empty is unset to click.)"""
    if _root_db_given and (db is None or db == os.environ.get(ENV_DB)):
        db = _root_db
    return DEFAULT_DB if db is None else db


def _open(db: str | None, *, read_only: bool = False) -> Database:
    path = _db_path(db)
    # an in-memory database is empty and writable: reading it needs no read-only mode
    read_only = read_only and path != ":memory:"
    config = {"memory_limit": _memory_limit} if _memory_limit else None
    return connect(path, read_only=read_only, must_exist=read_only, config=config)


@contextmanager
def _open_to_write(db: str | None) -> Iterator[Database]:
    """Open (or create) for a command that writes: if it fails, a database it created is
    removed again, so a failed command leaves no new file behind."""
    database = _open(db)
    try:
        yield database
    except BaseException:
        database.close()
        if database.created:
            paths.remove_new_database(database.path)
        raise
    database.close()


@app.command()
def load(
    sources: list[str] = typer.Argument(..., metavar="SOURCE", show_default=False),
    db: str | None = DbOption,
    append: bool = typer.Option(
        False, "--append", help="Add to the relations instead of replacing them."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Refuse the load if any diagnostic (warning) fires."
    ),
    fmt: InputFormatChoice | None = typer.Option(
        None,
        "--format",
        "-f",
        help="Force the input format (default: from each file's extension; facts for stdin).",
        show_default=False,
    ),
    relation: str | None = typer.Option(
        None,
        "--relation",
        "-r",
        metavar="NAME",
        help="Relation of a single file or of stdin.",
        show_default=False,
    ),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        metavar="N",
        help="Store the block size in tokens (default 16).",
        show_default=False,
    ),
    diagnostics: bool = typer.Option(
        True,
        "--diagnostics/--no-diagnostics",
        help="Run the checks beyond the spec after loading and report findings as warnings.",
    ),
    max_errors: int = typer.Option(100, "--max-errors", metavar="N", help=MAX_ERRORS_HELP, min=0),
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
    with _guard(max_errors), _open_to_write(db) as database:
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
        if not quiet:  # after the bar is gone: the report starts on its own line
            _err(_load_summary(report, database.path))


@contextmanager
def _progress(database: Database, quiet: bool) -> Iterator[None]:
    """On a terminal, one labelled bar on stderr a stage of the load (read and check each
    relation, diagnostics, write), each monotone; nothing when quiet or not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield
        return
    import threading

    from .progress import Stages

    stop = threading.Event()
    with Stages(sys.stderr) as bars:

        def poll() -> None:
            while not stop.wait(0.25):
                bars.update(database.stage(), database.progress())

        thread = threading.Thread(target=poll)  # stopped and joined below
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _load_summary(report: LoadReport, path: str) -> str:
    rows = []
    for r in report.relations:
        source = r.source if r.source is not None else f"(no file: {r.mode})"
        read = r.rows_read if r.source is not None else "-"
        dropped = r.duplicates_dropped if r.source is not None else "-"
        rows.append([r.relation, r.rows_total, read, dropped, r.mode, source])
    lines = [output.text_table(["relation", "rows", "read", "duplicates", "mode", "source"], rows)]
    lines.append(f"loaded into {path}")
    lines += _warning_lines(report.warnings)
    return "\n".join(lines)


def _warning_lines(warnings: list[Any]) -> list[str]:
    if not warnings:
        return []
    found = ", ".join(f"{w.name} {w.count}" for w in warnings)
    total = sum(w.count for w in warnings)
    return [f"warning: {total} diagnostic finding(s): {found}; see `pagedkv-sql check`"]


@app.command()
def resolve(
    db: str | None = DbOption,
    fmt: RowsFormat | None = typer.Option(
        None,
        "--format",
        "-f",
        help="Output format (default: from the --output extension, else facts: Soufflé's "
        "tab-separated output without a header).",
        show_default=False,
    ),
    out: str | None = OutOption,
) -> None:
    """Print resolved_kv_address, sorted by seq_id, token_pos, physical_address."""
    # the output is checked before the query starts: a refused --output leaves nothing open
    with _guard(), _open(db, read_only=True) as database, _output(out, database.path) as stream:
        reader = database.resolve()
        if fmt == "table":  # for people: the engine's request ids too, after an import
            reader = database.label_requests(reader)
        output.write_batches(reader, _rows_format(out, fmt), stream)


@app.command()
def violations(
    db: str | None = DbOption,
    fmt: RowsFormat | None = typer.Option(
        None,
        "--format",
        "-f",
        help="Output format (default: from the --output extension, else table).",
        show_default=False,
    ),
    out: str | None = OutOption,
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        metavar="N",
        help="Block size in tokens for this run (default: the stored setting).",
        show_default=False,
    ),
) -> None:
    """Every offending row of every check, one row each: check, severity, row (as JSON),
    reason. Exit 0 whatever is found (check's exit code says whether it passes)."""
    with _guard(), _open(db, read_only=True) as database:
        table = database.violations(block_size=block_size)
        with _output(out, database.path) as stream:
            output.write_table(table, _rows_format(out, fmt, "table"), stream)


def _rows_format(out: str | None, fmt: RowsFormat | None, default: str = "facts") -> str:
    return output.format_for(out, fmt.value if fmt is not None else None, default)


def _report_format(out: str | None, fmt: ReportFormat | None) -> str:
    found = output.format_for(out, fmt.value if fmt is not None else None, "text")
    if found not in {f.value for f in ReportFormat}:
        return "text"  # e.g. -o report.txt
    return found


@contextmanager
def _output(path: str | None, database: str | None = None) -> Iterator[IO[bytes]]:
    """stdout for no path or '-', else FILE written whole or not at all; never the
    database or its WAL (paths.protect_output)."""
    if path is None or path == "-":
        if paths.CLOSED_STREAMS & {1}:
            raise PagedKVError(
                "standard output is closed; nothing was written",
                hint="redirect stdout or pass --output FILE",
            )
        stream = output.stdout_binary()
        yield stream
        stream.flush()
        return
    paths.protect_output(path, database)
    with paths.atomic_output(path) as f:
        yield f


def _write_report(
    out: str | None, fmt: str, text: str, document: Any, rows: Any, database: str | None = None
) -> None:
    """Write a report as text, as one JSON document, or its rows (an Arrow table) in a
    tabular format."""
    with _output(out, database) as stream:
        if fmt == "text":
            stream.write((text + "\n").encode())
        elif fmt == "json":
            stream.write((json.dumps(document, indent=2) + "\n").encode())
        else:
            output.write_table(rows, fmt, stream)


ReportOption = typer.Option(
    None,
    "--format",
    "-f",
    help="text (default), json (one document), or the rows as jsonl, csv, tsv, arrow, "
    "arrows or parquet (default: from the --output extension, else text).",
    show_default=False,
)


@app.command()
def check(
    db: str | None = DbOption,
    strict: bool = typer.Option(False, "--strict", help="Count warnings as errors (exit 1)."),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
    limit: int = typer.Option(
        20, "--limit", metavar="N", help="Offending rows shown per check (0: all).", min=0
    ),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        metavar="N",
        help="Block size in tokens for this run (default: the stored setting, 16 unless changed).",
        show_default=False,
    ),
) -> None:
    """Run the spec's constraints (errors) and the diagnostics (warnings); exit 1 on errors.
    Tabular formats write the summary, one row a check."""
    with _guard(), _open(db, read_only=True) as database:
        report = database.check(block_size=block_size, limit=limit or None)
        _write_check(report, out, fmt, database.path)
    if not report.ok(strict):
        raise typer.Exit(1)


def _write_check(
    report: Any, out: str | None, fmt: ReportFormat | None, database: str | None = None
) -> None:
    """A CheckReport as `check` writes it (also `spark check`): text, one JSON document,
    or the summary (one row a check) in a tabular format."""
    summary = output.pa_table(
        ["check", "severity", "found", "description"],
        [[r.name, r.severity, r.count, r.check.description] for r in report.results],
    )
    text = _check_text(report)
    _write_report(out, _report_format(out, fmt), text, report.to_dict(), summary, database)


def _check_text(report: Any) -> str:
    lines = [
        output.text_table(
            ["check", "severity", "found", "what it means"],
            [[r.name, r.severity, r.count, r.check.description] for r in report.results],
        )
    ]
    for r in report.results:
        if not r.count:
            continue
        lines.append("")
        lines.append(f"{r.name} ({r.severity}, {r.count} row{'s' if r.count != 1 else ''}):")
        rows = r.rows.to_pylist()
        table = output.text_table(r.rows.column_names, [list(x.values()) for x in rows])
        lines.extend("  " + t for t in table.splitlines())
        if r.count > len(rows):
            lines.append(f"  ... and {r.count - len(rows)} more (--limit 0 shows all)")
    lines.append("")
    lines.append(f"{report.errors} error(s), {report.warnings} warning(s)")
    return "\n".join(lines)


@app.command(context_settings={"ignore_unknown_options": True})
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
    kv: list[Any] = []
    with _guard():
        ids = (_number(seq_id, "SEQ_ID"), _number(token_pos, "TOKEN_POS"))
    with _guard(), _open(db, read_only=True) as database:
        e = database.explain(*ids)
        if layer is not None:
            kv = database.kv_addresses(ids[0], ids[1], layer, head)
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
        text = _explain_text(e, kv, layer, head)
        _write_report(out, _report_format(out, fmt), text, document, rows, database.path)
    if e.broken:
        raise typer.Exit(1)


def _number(text: str, name: str) -> int:
    """An id on the command line reads as in fact files: 0x10, -5, never 1.0 or 1_5."""
    from .errors import UsageError
    from .numbers import NumberSyntaxError, parse_number

    try:
        return parse_number(text)
    except NumberSyntaxError as e:
        raise UsageError(f"{name}: {e}") from None


@app.command()
def repair(db: str | None = DbOption) -> None:
    """Recreate the views and macros pagedkv-sql keeps in the database (after one was dropped
    from the DuckDB shell, say); the facts are untouched."""
    with _guard(), _open(db) as database:
        database.repair()
    _err(f"repaired {database.path}")


def _explain_text(e: Any, kv: list[Any], layer: int | None, head: int) -> str:
    hexed = output.hex_or_int
    lines = [f"token seq_id {e.seq_id}, token_pos {e.token_pos}"]
    if e.request_id is not None:
        lines.append(f"  engine request     {e.request_id}")
    for block, offset in e.decompositions:
        lines.append(f"  virtual_token      block_index {block}, offset_in_block {offset}")
    for ptr in e.roots:
        lines.append(f"  root_table         seq_id {e.seq_id} -> block table {ptr}")
    for h in e.hops:
        key = f"({h.block_table_ptr}, {h.block_index})"
        if h.resident:
            for base, refcount in h.resident:
                lines.append(f"  block_table_entry  {key}: base {hexed(base)}, refcount {refcount}")
        else:
            lines.append(f"  block_table_entry  {key}: none")
        if h.swapped:
            for cpu in h.swapped:
                lines.append(f"  swapped_block      {key}: cpu_base_address {hexed(cpu)}")
        else:
            lines.append(f"  swapped_block      {key}: none")
    for r in e.resolutions:
        lines.append(
            f"  => {r.tier} tier: {r.base} + {r.offset_in_block} = {hexed(r.physical_address)}"
        )
    if e.broken:
        lines.append(f"  => unresolved: {e.broken}")
    for a in kv:
        where = f"{a.tensor} block {a.block_id} slot {a.slot}"
        bounds = "" if a.in_bounds else " (outside the tensor's shape)"
        lines.append(f"  {a.kv}  layer {layer} head {head}: {where} -> {a.address:#x}{bounds}")
    if layer is not None and not kv:
        lines.append(f"  no K/V address: no recorded tensor holds layer {layer} for this token")
    return "\n".join(lines)


@app.command()
def stats(
    db: str | None = DbOption,
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        metavar="N",
        help="Block size in tokens (default: the stored setting).",
        show_default=False,
    ),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
) -> None:
    """Sequences, tokens, logical blocks (resident / swapped / missing), physical blocks,
    blocks saved by sharing, refcount histogram, internal fragmentation, bytes per tier.
    Tabular formats write one row a metric."""
    with _guard(), _open(db, read_only=True) as database:
        s = database.stats(block_size)
        histogram = [{"refcount": r, "physical_blocks": n} for r, n in s.refcount_histogram]
        rows = [[k.replace("_", " "), v] for k, v in s.counts.items()]
        rows += [[f"physical blocks with refcount {r}", n] for r, n in s.refcount_histogram]
        _write_report(
            out,
            _report_format(out, fmt),
            output.text_table(["metric", "value"], rows),
            {**s.counts, "refcount_histogram": histogram},
            output.pa_table(["metric", "value"], rows),
            database.path,
        )


@app.command()
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
    block_size: int = typer.Option(16, "--block-size", metavar="N", help="Tokens a block."),
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
    fmt: SynthFormat = typer.Option(
        SynthFormat.facts, "--format", "-f", help="File format (tsv and csv with a header)."
    ),
    steps: int | None = typer.Option(
        None,
        "--steps",
        metavar="N",
        help="Write a step log of N steps to the file DIR instead (.jsonl, or its event "
        "table as .parquet / .arrow); see docs/replay.md.",
        show_default=False,
    ),
    faults: list[str] = typer.Option(
        [], "--fault", metavar="NAME@STEP", help="With --steps: plant fault NAME@STEP (repeatable)."
    ),
    num_gpu_blocks: int = typer.Option(
        1024, "--num-gpu-blocks", metavar="N", help="With --steps: pool size."
    ),
    arrival_rate: float = typer.Option(
        1.0, "--arrival-rate", metavar="RATE", help="With --steps: new requests a step, on average."
    ),
) -> None:
    """Write a realistic synthetic workload into DIR (one file a relation) for tests and
    benchmarks; with --steps, a step log with named faults planted at known steps."""
    from .synth import SynthConfig, synthesize, write

    if steps is not None:
        with _guard():
            from .replay import synth as step_synth

            log_config = step_synth.StepSynthConfig(
                steps=steps,
                block_size=block_size,
                num_gpu_blocks=num_gpu_blocks,
                arrival_rate=arrival_rate,
                seed=seed,
                faults=tuple(step_synth.parse_fault(f) for f in faults),
            )
            step_synth.write(log_config, out_dir)
        planted = ", ".join(faults) or "no faults"
        _err(f"wrote {out_dir}: {steps} steps, {planted}")
        return
    with _guard():
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
        tables = synthesize(config)
        write(tables, out_dir, fmt.value)
    sizes = ", ".join(f"{r} {t.num_rows}" for r, t in tables.items())
    _err(f"wrote {out_dir}: {sizes}")


@app.command("import")
def import_(
    engine: str = typer.Argument(
        ..., help="vllm, sglang, flashinfer or trtllm.", show_default=False
    ),
    path: str = typer.Argument(
        ..., help="A snapshot file (.safetensors or .npz).", show_default=False
    ),
    db: str | None = DbOption,
    strict: bool = typer.Option(
        False, "--strict", help="Refuse the import if any diagnostic (warning) fires."
    ),
    convert: bool = typer.Option(
        False,
        "--convert",
        help="Accept index arrays of a dtype the engine would refuse (FlashInfer int64).",
    ),
    diagnostics: bool = typer.Option(
        True,
        "--diagnostics/--no-diagnostics",
        help="Run the checks and engine invariants after importing; report warnings.",
    ),
    max_errors: int = typer.Option(100, "--max-errors", metavar="N", help=MAX_ERRORS_HELP, min=0),
) -> None:
    """Import a serving engine's snapshot: replaces the stored relations with the ones it
    maps to, and keeps the engine's own facts (request ids, free queue...) beside them."""
    with _guard(max_errors), _open_to_write(db) as database:
        report = database.load_engine(
            path, engine, strict=strict, diagnostics=diagnostics, convert=convert
        )
        rows = [[t, n] for t, n in report.rows.items() if n or not t.startswith("engine_")]
        lines = [output.text_table(["table", "rows"], rows)]
        lines.append(f"imported {report.engine} snapshot {report.source} into {database.path}")
        lines += _warning_lines(report.warnings)
        _err("\n".join(lines))


export_app = PlainTyper(
    help="Write the stored relations as an engine's own arrays, or as Parquet for Spark.",
    no_args_is_help=True,
)
app.add_typer(export_app, name="export")


def _export(engine: str, db: str | None, out: Path, strict: bool) -> None:
    with _guard(), _open(db, read_only=True) as database:
        result = database.export_engine(engine)
        for seq_id, request_id, reason in result.refused:
            label = f" (request {request_id})" if request_id is not None else ""
            _err(f"refused: seq_id {seq_id}{label}: {reason}")
        if strict and result.refused:
            _err(f"Error: {len(result.refused)} sequence(s) refused; nothing was written")
            raise typer.Exit(1)
        written = result.write(out)
    exported = len(result.snapshot.meta["seq_ids"])
    _err(f"wrote {exported} sequence(s) to {out}: {', '.join(p.name for p in written)}")


ExportOut = typer.Option(..., "--output", "-o", help="Directory to write.", show_default=False)
ExportStrict = typer.Option(
    False, "--strict", help="Write nothing if any sequence is refused (exit 1)."
)


@export_app.command("flashinfer")
def export_flashinfer(
    output_dir: Path = ExportOut, db: str | None = DbOption, strict: bool = ExportStrict
) -> None:
    """FlashInfer's CSR page table: kv_indptr, kv_indices, kv_last_page_len (int32), one
    .npy each, and flashinfer.npz with page_size. A sequence that is not a contiguous,
    fully resident run of tokens 0..len-1 is refused, naming why."""
    _export("flashinfer", db, output_dir, strict)


@export_app.command("vllm")
def export_vllm(
    output_dir: Path = ExportOut, db: str | None = DbOption, strict: bool = ExportStrict
) -> None:
    """vLLM's worker-side block_table (int32), num_blocks_per_row and slot_mapping
    (int64), one .npy each, and vllm.npz with block_size."""
    _export("vllm", db, output_dir, strict)


@app.command()
def replay(
    log: str | None = typer.Argument(
        None,
        help="Step log: .jsonl (or - for stdin), or its event table (.parquet, .arrow); "
        "omitted: the log stored in the database.",
        show_default=False,
    ),
    db: str | None = DbOption,
    keep_going: bool = typer.Option(
        False, "--keep-going", "-k", help="Report every broken step, not only the first."
    ),
    at: int | None = typer.Option(
        None,
        "--at",
        metavar="STEP",
        help="Write the state at the end of STEP into the spec's tables (then resolve, check, "
        "explain, stats read it); the exit status counts findings up to STEP only.",
        show_default=False,
    ),
    events: Path | None = typer.Option(
        None,
        "--events",
        metavar="FILE",
        help="Also write the log's event table to FILE (.parquet, else Arrow IPC).",
        show_default=False,
    ),
    fmt: TextFormat = TextFormatOption,
    limit: int = typer.Option(
        100, "--limit", metavar="N", help="Findings shown with --keep-going (0: all).", min=0
    ),
    max_errors: int = typer.Option(100, "--max-errors", metavar="N", help=MAX_ERRORS_HELP),
) -> None:
    """Replay an engine's step log: check every invariant at every step at once and name
    the first step that broke one (exit 1), with its request and block ids."""
    from .replay import render

    with _guard(max_errors), _open_to_write(db) as database:
        if events is not None:
            paths.protect_output(events, database.path, [log] if log not in (None, "-") else [])
        source: Any = log
        if log == "-":
            source = sys.stdin.buffer
        report = database.replay(source, keep_going=keep_going or at is not None, limit=None)
        if events is not None:
            from .replay import stored_events, write_events

            write_events(stored_events(database.con), events)
        if at is not None:
            done = database.replay_at(at)
            report = render.until(report, at)
        if not keep_going:
            report = render.first_only(report)
        text = (
            render.json_report(report)
            if fmt == "json"
            else render.text_report(report, limit or None)
        )
        typer.echo(text)
        if at is not None:
            sizes = ", ".join(f"{r} {n}" for r, n in done.rows.items())
            _err(f"state at step {at} written to {database.path}: {sizes}")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def diff(
    log: str | None = typer.Argument(
        None, help="Step log (default: the one stored by `replay`).", show_default=False
    ),
    from_step: int = typer.Option(
        ..., "--from", metavar="STEP", help="Earlier step.", show_default=False
    ),
    to_step: int = typer.Option(
        ..., "--to", metavar="STEP", help="Later step.", show_default=False
    ),
    db: str | None = DbOption,
    fmt: TextFormat = TextFormatOption,
) -> None:
    """What changed between the end of two steps of a step log: requests, block-table
    entries (added, removed, swapped out or in), tokens, refcounts."""
    from .replay import render

    with _guard():
        if log is not None:
            with connect(":memory:") as memory:
                memory.replay(sys.stdin.buffer if log == "-" else log)
                changes = memory.diff(from_step, to_step)
        else:
            with _open(db, read_only=True) as database:
                changes = database.diff(from_step, to_step)
    typer.echo(
        render.diff_text(changes, from_step, to_step)
        if fmt == "text"
        else render.diff_json(changes)
    )


class MapFormat(str, Enum):
    png = "png"
    svg = "svg"


@app.command("map")
def map_(
    db: str | None = DbOption,
    out: str = typer.Option(
        "map.png",
        "--output",
        "-o",
        metavar="FILE",
        help="The picture to write ('-': stdout); its extension picks the format when "
        "--format is not given.",
    ),
    fmt: MapFormat | None = typer.Option(
        None,
        "--format",
        "-f",
        help="Picture format (default: from the --output extension, else png).",
        show_default=False,
    ),
) -> None:
    """Draw the physical memory of each tier: one cell a block in address order, coloured by
    owner and state (shared, swapped, leaked, refcount mismatch, free). Needs
    pagedkv-sql[report]."""
    with _guard(), _open(db, read_only=True) as database:
        from .report import api

        path = None if out == "-" else Path(out)
        drawn = api.draw_map(database, api.map_format(path, fmt.value if fmt else None))
        with _output(out, database.path) as stream:
            stream.write(drawn.content)
    if path is not None:
        _err(f"wrote {out}: {drawn.summary}")


@app.command()
def report(
    db: str | None = DbOption,
    out: str = typer.Option(
        "report.html", "--output", "-o", metavar="FILE", help="The page to write ('-': stdout)."
    ),
    limit: int = typer.Option(
        1000, "--limit", metavar="N", help="Offending rows written per check (0: all).", min=0
    ),
    log: Path | None = typer.Option(
        None,
        "--log",
        metavar="LOG",
        help="A step log for the timeline (default: the one `replay` stored, if any).",
        show_default=False,
    ),
) -> None:
    """Write one self-contained HTML page (no network needed): stats, every finding of check
    with its rows, the memory map, each sequence's block table, refcounts and bytes per tier,
    and the blocks in use per step of a step log; searchable by seq_id or request id. Needs
    pagedkv-sql[report]."""
    with _guard(), _open(db, read_only=True) as database:
        from .report import api

        if log is not None and out != "-":
            paths.protect_output(out, None, [log])
        timeline = api.log_timeline(log) if log is not None else None
        page = api.build_report(database, limit=limit or None, timeline=timeline)
        content = page.encode("utf-8")
        with _output(out, database.path) as stream:
            stream.write(content)
    if out != "-":
        _err(f"wrote {out}: {len(content) / 2**20:.1f} MB")


@app.command("kv-events")
def kv_events(
    path: Path = typer.Argument(
        ...,
        help="A recorded stream: msgpack EventBatches (vLLM, SGLang) or JSON Lines (Dynamo).",
        show_default=False,
    ),
    fmt: TextFormat = TextFormatOption,
    limit: int = typer.Option(100, "--limit", metavar="N", help="Findings shown (0: all).", min=0),
) -> None:
    """Check a recorded stream of prefix-cache events (BlockStored / BlockRemoved /
    AllBlocksCleared): unknown hashes removed, unknown parents, sequence gaps, hashes used
    after AllBlocksCleared; exit 1 on findings."""
    from .replay import kvevents

    with _guard():
        report = kvevents.check_kv_events(kvevents.read_kv_events(path))
    if fmt == "json":
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        lines = [
            f"{report.events} event(s): {report.stored} stored, {report.removed} removed, "
            f"{report.cleared} cleared"
        ]
        shown = report.findings if limit == 0 else report.findings[:limit]
        for f in shown:
            lines.append(f"{f.where}: {f.check}: {f.message}")
        if len(report.findings) > len(shown):
            lines.append(f"... and {len(report.findings) - len(shown)} more (--limit 0: all)")
        lines.append(f"{len(report.findings)} finding(s)")
        typer.echo("\n".join(lines))
    if not report.ok:
        raise typer.Exit(1)


# `spark resolve|check` and `export parquet` (pagedkv_sql/spark; pyspark only when run)
from .spark.cli import export_parquet as _export_parquet  # noqa: E402
from .spark.cli import spark_app  # noqa: E402

app.add_typer(spark_app, name="spark")
export_app.command("parquet")(_export_parquet)


def main() -> None:
    paths.reserve_standard_streams()
    app()


__all__ = ["app", "main"]
