"""The shell's floor, shared by every command group: the one place where errors become a
message and an exit code (`guard`), opening the database (`open_read_only`, `open_db`,
`open_to_write`), writing output (`open_output`, `write_report`, `write_check`), and every
option more than one command takes, defined once.

Light on purpose: `--help`, `--version` and TAB completion import this module, so nothing
here imports DuckDB, pyarrow or numpy at import time (tests/test_startup.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import typer

from .. import paths
from ..errors import PagedKVError
from ..formats import (
    BINARY_FORMATS,
    REPORT_FORMATS,
    ROWS_FORMATS,
    ReportFormat,
    RowsFormat,
    format_for,
)
from ..paths import DEFAULT_DB, ENV_DB
from .help import PlainTyper

if TYPE_CHECKING:
    from ..check import CheckReport
    from ..database import Database

# -- the root options (set by the root callback in cli/__init__.py) ---------------------------

# the --db given before the subcommand (or $PAGEDKV_DB), which one given after it overrides
_root_db: str | None = None
_root_db_given = False  # on the command line, so it beats $PAGEDKV_DB after the subcommand
_memory_limit: str | None = None  # --memory-limit / $PAGEDKV_MEMORY_LIMIT: DuckDB's


_verbosity = 0  # -q: -1 (no progress, errors only); -v: 1 (info); -vv: 2 (debug)


def set_root(
    ctx: typer.Context, db: str | None, memory_limit: str | None, verbosity: int = 0
) -> None:
    """Keep the root's --db, --memory-limit and -v / -q for the command that runs; the
    library's log (logger ``pagedkv_sql``) goes to stderr at the level -v / -q choose."""
    global _root_db, _root_db_given, _memory_limit, _verbosity
    COMMITTED.clear()
    _root_db = db
    _memory_limit = memory_limit
    _verbosity = verbosity
    source = ctx.get_parameter_source("db")
    _root_db_given = source is not None and source.name == "COMMANDLINE"
    _log_to_stderr(verbosity)


class _LogLine(logging.Formatter):
    """``warning: message`` on stderr, escaped as every text for people is."""

    def format(self, record: logging.LogRecord) -> str:
        from ..formats import printable

        return f"{record.levelname.lower()}: {printable(record.getMessage())}"


def _log_to_stderr(verbosity: int) -> None:
    logger = logging.getLogger("pagedkv_sql")
    for handler in [h for h in logger.handlers if getattr(h, "_pagedkv_cli", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._pagedkv_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_LogLine())
    levels = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}
    logger.setLevel(levels.get(verbosity, logging.DEBUG))
    logger.addHandler(handler)


def quiet() -> bool:
    """-q before the command: no progress and no log below errors."""
    return _verbosity < 0


# -- errors --------------------------------------------------------------------------------


def err(text: str) -> None:
    """A report on stderr. A closed or full stderr loses the report, never the outcome:
    the exit code still says what happened (docs/decisions.md)."""
    try:
        typer.echo(text, err=True)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fail(error: PagedKVError, max_errors: int) -> None:
    from ..formats import printable  # a string from the input is shown escaped, never obeyed

    err(f"Error: {printable(error.message)}")
    details = error.details
    shown = details if max_errors == 0 else details[:max_errors]
    for line in shown:
        err(f"  {printable(line)}")
    total = getattr(error, "total", len(details))
    if total > len(shown):
        err(f"  ... and {total - len(shown)} more (--max-errors 0 lists all that were kept)")
    if error.hint:
        err(f"Fix: {printable(error.hint)}")
    raise typer.Exit(error.exit_code)


@contextmanager
def guard(max_errors: int = 100) -> Iterator[None]:
    """The one place where the project's errors become a message and an exit code."""
    GUARDED.append(True)
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
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM, main() makes it one) between queries: the transaction under
        # way was rolled back on the way out; say so instead of exiting without a word
        _interrupted_exit()
    except Exception as e:
        if not interrupted(e):
            raise
        # Ctrl-C inside a DuckDB query: the transaction was rolled back, output dropped
        _interrupted_exit()


TERMINATED: list[int] = []  # the signal main() turned into KeyboardInterrupt, if one came
COMMITTED: list[str] = []  # what a command committed already (said if it is interrupted)
GUARDED: list[bool] = []  # one entry a guard() entered: a command may have begun its work
REPORTED: list[bool] = []  # the interrupt was reported (and its exit code chosen) already


def _interrupted_exit() -> None:
    what = "terminated" if TERMINATED else "interrupted"
    err(f"Error: {what}; " + (f"{COMMITTED[-1]} before it" if COMMITTED else "nothing was changed"))
    REPORTED.append(True)
    raise typer.Exit(128 + (TERMINATED[0] if TERMINATED else 2))


def interrupted_outside() -> int:
    """Report a Ctrl-C (or SIGTERM) that came outside every guard: while typer parsed the
    command line or a command imported what it needs (typer then exits 130 without a word,
    or 130 for a SIGTERM). Before any guard nothing was begun; after one, the command may
    have finished its work, so no claim is made. The exit code."""
    what = "terminated" if TERMINATED else "interrupted"
    err(f"Error: {what}" + ("" if GUARDED else "; nothing was changed"))
    REPORTED.append(True)
    return 128 + (TERMINATED[0] if TERMINATED else 2)


def interrupted(error: BaseException) -> bool:
    """DuckDB reports a Ctrl-C during a query as its InterruptException, or as a
    RuntimeError 'Query interrupted' from a result being fetched."""
    name = type(error).__name__
    return name == "InterruptException" or (
        isinstance(error, RuntimeError) and "interrupted" in str(error).lower()
    )


# -- the database ------------------------------------------------------------------------------


def db_path(db: str | None) -> str:
    """--db after the subcommand, else before it, else $PAGEDKV_DB, else pagedkv.duckdb. An
    empty one, wherever given (an unset variable in a script), is kept: connect() refuses
    it, it never means the default file. ($PAGEDKV_DB set empty is unset to click.)"""
    if _root_db_given and (db is None or db == os.environ.get(ENV_DB)):
        db = _root_db
    return DEFAULT_DB if db is None else db


def recording_db(db: str | None) -> str | None:
    """The database a command that stores only when asked (`kv-events`, `watch`) stores
    in: --db after the subcommand, else before it, else $PAGEDKV_DB, else none."""
    if _root_db_given and (db is None or db == os.environ.get(ENV_DB)):
        return _root_db
    return db if db is not None else _root_db


def unused_db_option() -> Any:
    """--db for a command that uses no database: taken (every command takes --db), and
    refused with the reason by ``refuse_db``."""
    return typer.Option(None, "--db", metavar="PATH", hidden=True, show_default=False)


def refuse_db(db: str | None, command: str, hint: str) -> None:
    """--db given to a command that uses no database, after its name or before it, is a
    usage error saying so ($PAGEDKV_DB, set for every command, is not)."""
    from ..errors import UsageError

    given = db if db is not None else (_root_db if _root_db_given else None)
    if given is not None:
        raise UsageError(f"{command} uses no database (--db {given})", hint=hint)


def open_db(db: str | None, *, read_only: bool = False, must_exist: bool = False) -> Database:
    """The database the options name (DuckDB is imported here, when a command runs); a
    command that reads, or mends what is there, needs it to exist."""
    from ..database import connect

    path = db_path(db)
    # an in-memory database is empty and writable: reading it needs no read-only mode
    read_only = read_only and path != ":memory:"
    config = {"memory_limit": _memory_limit} if _memory_limit else None
    return connect(path, read_only=read_only, must_exist=must_exist or read_only, config=config)


def open_read_only(db: str | None) -> Database:
    """For a command that only reads: the file must exist, and is never changed."""
    return open_db(db, read_only=True)


@contextmanager
def open_to_write(db: str | None) -> Iterator[Database]:
    """Open (or create) for a command that writes: if it fails, a database it created is
    removed again, so a failed command leaves no new file behind."""
    database = open_db(db)
    try:
        yield database
    except BaseException:
        database.close()
        if database.created and not COMMITTED:  # what was committed stays
            paths.remove_new_database(database.path)
        raise
    database.close()


# -- extras --------------------------------------------------------------------------------------


def require_extra(what: str, extra: str, *modules: str) -> None:
    """Before a command imports an extra's modules: a missing one is a UsageError naming
    the extra to install, never a traceback. A finder that refuses a module (a broken or
    blocked install) counts as missing."""
    import importlib.util

    from ..errors import UsageError

    def importable(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:
            return False

    missing = [m for m in modules if not importable(m)]
    if missing:
        raise UsageError(
            f"{what} needs {' and '.join(missing)}, which is not installed",
            hint=f"pip install 'pagedkv-sql[{extra}]'",
        )


# -- progress ----------------------------------------------------------------------------------


@contextmanager
def progress(database: Database | None, label: str, out: str | None = "") -> Iterator[None]:
    """On a terminal, a line on stderr while a long command runs: its label and time, and
    what a reader has read (a step log's steps, and their percent of the file) or the
    percent of the DuckDB statement running (a load's stages, if it is one). Nothing
    under -q, when stderr is not a terminal, or when the command's own output streams to
    the same terminal (``out`` None or '-' and stdout a terminal: pass ``out`` for the
    commands that stream rows; the default "" is a command that writes at the end)."""
    streams_here = out in (None, "-") and sys.stdout.isatty()
    if quiet() or not sys.stderr.isatty() or streams_here:
        yield
        return
    from ..progress import Ticker, running

    def tick() -> None:
        stage = database.stage() if database is not None else None
        if stage is not None:
            ticker.label = stage[0]
        ticker.tick(database.progress() if database is not None else -1.0, running())

    with Ticker(label, sys.stderr) as ticker:
        ticker.tick(-1.0)  # at once: the line is there however soon the command ends
        with polling(tick):
            yield


@contextmanager
def polling(tick: Callable[[], None], every: float = 0.25) -> Iterator[None]:
    """Call ``tick`` every ``every`` seconds from a thread while the block runs (a progress
    line's redraw); the thread is stopped and joined at the end."""
    import threading

    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every):
            tick()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# -- output ------------------------------------------------------------------------------------


def rows_format(
    out: str | None, fmt: RowsFormat | None, default: str = "facts", database: str | None = None
) -> str:
    """The rows format of a command: --format, else the --output extension, else
    ``default``. Resolved before the command's work, so a refused --output changes nothing:
    a database, its WAL or any DuckDB file (paths.protect_output), then an extension that
    names no rows format, then a file that could not be written (UsageError each)."""
    return _format(out, fmt, default, ROWS_FORMATS, "--output", database)


def report_format(
    out: str | None, fmt: ReportFormat | None, option: str = "--output", database: str | None = None
) -> str:
    """The report format of a command (text by default), as ``rows_format`` finds it."""
    return _format(out, fmt, "text", REPORT_FORMATS, option, database)


def _format(
    out: str | None, fmt: Any, default: str, known: tuple[str, ...], option: str, db: str | None
) -> str:
    if out not in (None, "-"):
        paths.protect_output(out, db)
    found = format_for(out, fmt.value if fmt is not None else None, default, known)
    if out not in (None, "-"):
        paths.check_writable(out, option)
    return found


def refuse_binary_to_terminal(out: str | None, fmt: str) -> None:
    """Parquet or Arrow bytes are never written to a terminal (they would garble it): the
    user meant a file or a pipe."""
    from ..errors import UsageError

    if fmt in BINARY_FORMATS and out in (None, "-") and sys.stdout.isatty():
        raise UsageError(
            f"{fmt} is binary and stdout is a terminal; nothing was written",
            hint=f"write it to a file (-o out.{'parquet' if fmt == 'parquet' else 'arrow'}) "
            "or pipe it into a program",
        )


@contextmanager
def open_output(path: str | None, database: str | None = None) -> Iterator[IO[bytes]]:
    """stdout for no path or '-', else FILE written whole or not at all, compressed when
    its name ends in .gz or .zst; never the database or its WAL (paths.protect_output)."""
    if path is None or path == "-":
        if paths.CLOSED_STREAMS & {1}:
            raise PagedKVError(
                "standard output is closed; nothing was written",
                hint="redirect stdout or pass --output FILE",
            )
        stream = sys.stdout.buffer
        yield stream
        stream.flush()
        return
    from .. import compression

    paths.protect_output(path, database)
    with compression.output(path) as f:
        yield f


def write_report(
    out: str | None, fmt: str, text: str, document: Any, rows: Any, database: str | None = None
) -> None:
    """Write a report as text, as one JSON document, or its rows (an Arrow table) in a
    tabular format."""
    refuse_binary_to_terminal(out, fmt)
    with open_output(out, database) as stream:
        if fmt == "text":
            stream.write((text + "\n").encode())
        elif fmt == "json":
            stream.write((json.dumps(document, indent=2) + "\n").encode())
        else:
            from .. import output

            output.write_table(rows, fmt, stream)


def write_check(
    report: CheckReport, out: str | None, fmt: str, database: str | None = None
) -> None:
    """A CheckReport as `check` writes it (also `spark check`): text, one JSON document,
    or the summary (one row a check) in a tabular format."""
    from .. import output
    from .text import check_text

    summary = output.pa_table(
        ["check", "severity", "found", "description"],
        [[r.name, r.severity, r.count, r.check.description] for r in report.results],
    )
    text = check_text(report)
    write_report(out, fmt, text, report.to_dict(), summary, database)


# -- groups ------------------------------------------------------------------------------------


def group(
    app: typer.Typer, name: str, help: str | None = None, epilog: str | None = None
) -> typer.Typer:
    """The sub-group `name` of `app`: the one registered already (so two command modules
    can add to `export`), else a new one with this help (and examples), added to `app`."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    sub = PlainTyper(help=help, no_args_is_help=True, epilog=epilog)
    app.add_typer(sub, name=name)
    return sub


# -- options more than one command takes -------------------------------------------------------

DB_HELP = f"Database file (default: {DEFAULT_DB} here); ':memory:' works."
MAX_ERRORS_HELP = "List at most N offending rows or lines (0: all)."


def db_option(help: str = DB_HELP) -> Any:
    """--db PATH, or $PAGEDKV_DB."""
    return typer.Option(None, "--db", metavar="PATH", help=help, envvar=ENV_DB, show_default=False)


def output_option(help: str, default: Any = None, metavar: str | None = "FILE") -> Any:
    """-o/--output: a file (or directory) to write; `...` when it must be given."""
    shown = default not in (None, ...)
    return typer.Option(default, "--output", "-o", metavar=metavar, help=help, show_default=shown)


def format_option(help: str, default: Any = None) -> Any:
    """-f/--format, one of the choices the parameter's Enum type offers."""
    return typer.Option(default, "--format", "-f", help=help, show_default=default is not None)


def strict_option(help: str) -> Any:
    """--strict: what a finding or a refusal makes of the exit code."""
    return typer.Option(False, "--strict", help=help)


def max_errors_option(help: str = MAX_ERRORS_HELP, default: int = 100) -> Any:
    """--max-errors N: how many offending rows an error lists (0: all; never negative)."""
    return typer.Option(default, "--max-errors", metavar="N", help=help, min=0)


def limit_option(default: int, help: str) -> Any:
    """--limit N: how many rows or findings a report shows (0: all)."""
    return typer.Option(default, "--limit", metavar="N", help=help, min=0)


def block_size_option(help: str, default: int | None = None) -> Any:
    """--block-size N: tokens a block (None: the stored setting)."""
    return typer.Option(
        default, "--block-size", metavar="N", help=help, show_default=default is not None
    )


def diagnostics_option(help: str) -> Any:
    """--diagnostics/--no-diagnostics: the checks beyond the spec after writing."""
    return typer.Option(True, "--diagnostics/--no-diagnostics", help=help)


def overwrite_option(help: str) -> Any:
    """--overwrite: replace what is there."""
    return typer.Option(False, "--overwrite", help=help)


DbOption = db_option()
OutOption = output_option(
    "Write to FILE instead of stdout ('-': stdout); its extension picks the format "
    "when --format is not given (.txt for people), and .gz or .zst after it compresses."
)
ReportOption = format_option(
    "text (default; alias table), json (one document), or the rows as jsonl, csv, tsv, "
    "arrow, arrows or parquet (default: from the --output extension, else text)."
)
