"""The command line: a thin shell over the library. This module is its table of contents:
the app, the root options, and each command group registered in the order `--help` lists
them. The floor every group stands on is cli/common.py; a new group is a module
`cli/<group>.py` with `register(app)` and one line below (docs/architecture.md)."""

from __future__ import annotations

import signal

import typer

from .. import paths
from ..spill import ENV_MEMORY_LIMIT
from . import common, core, engines, fleet, fuzz, live, replay, report, spark, sql
from .common import DbOption
from .help import PlainTyper

app = PlainTyper(
    name="pagedkv-sql",
    help="Keep, check and query the address-translation state of a PagedAttention KV cache "
    "(the Soufflé spec paged_attention.dl) in a DuckDB database.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help and plain usage errors, like our own errors
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

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
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        help="Log more to stderr: -v what the library does (info), -vv debug.",
        show_default=False,
    ),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="No progress and no warnings on stderr; errors still.",
    ),
) -> None:
    """Keep, check and query the address-translation state of a PagedAttention KV cache
    (the Soufflé spec paged_attention.dl) in a DuckDB database."""
    common.set_root(ctx, db, memory_limit, -1 if quiet else verbose)


# the table of contents: commands list in this order, then the groups (export, fuzz, spark)
core.register(app)  # load resolve violations check explain repair stats synth synth-log
sql.register(app)  # sql example
engines.register(app)  # import; export flashinfer|vllm
replay.register(app)  # replay diff
report.register(app)  # map report
live.register(app)  # kv-events watch
fuzz.register(app)  # fuzz vllm|sglang
fleet.register(app)  # fleet sim|check
spark.register(app)  # spark resolve|check; export parquet


def main() -> None:
    paths.reserve_standard_streams()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(common.interrupted_outside()) from None
    except SystemExit as e:  # typer turns a Ctrl-C outside our guards into a silent 130
        if e.code == 130 and not common.REPORTED:
            raise SystemExit(common.interrupted_outside()) from None
        raise


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM runs the same way out as Ctrl-C: DuckDB interrupts the query, the
    transaction is rolled back, a database the command created, its WAL and the spill
    directory are removed, and the exit code is 143."""
    common.TERMINATED.append(signum)
    raise KeyboardInterrupt


__all__ = ["app", "main"]
