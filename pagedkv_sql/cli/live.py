"""`kv-events` and `watch`: engines' KV-cache events, recorded or live, on one machinery
(pagedkv_sql/live). `kv-events` checks a recorded stream (with --db it stores it,
all or nothing); `watch` follows running engines and names a broken invariant as it happens.
pyzmq and prometheus-client (the `live` extra) are imported only when `watch` needs them."""

from __future__ import annotations

import json
import signal
from enum import Enum
from typing import TYPE_CHECKING, Any

import typer

from .. import paths
from ..formats import ReportFormat
from . import common, text
from .common import OutOption, ReportOption, guard
from .help import examples

if TYPE_CHECKING:
    from ..live.watchstore import Stored


class EngineChoice(str, Enum):
    auto = "auto"
    vllm = "vllm"
    sglang = "sglang"


class WatchFormat(str, Enum):
    text = "text"
    table = "table"  # the alias every command takes (formats.HUMAN)
    jsonl = "jsonl"


MaxHashesOption = typer.Option(
    1 << 22,
    "--max-hashes",
    metavar="N",
    min=1,
    help="Stored hashes held at once (~70 bytes each); past it a stream's are forgotten, "
    "said, and what names them is unverifiable until its next AllBlocksCleared.",
)
EngineOption = typer.Option(
    EngineChoice.auto,
    "--engine",
    help="Field order of tagged-array msgpack events: vllm or sglang (auto: vLLM's, whose "
    "first six fields SGLang shares; maps need none).",
)


WATCH_EXAMPLES = examples(
    "pagedkv-sql watch zmq://127.0.0.1:5557  # a vLLM engine's KV-event publisher",
    "pagedkv-sql watch --follow vllm-1234.jsonl  # a PAGEDKV_STEP_LOG as it grows",
    "pagedkv-sql watch zmq://127.0.0.1:5557 --exit-on-finding --duration 600",
)


def register(app: typer.Typer) -> None:
    app.command("kv-events")(kv_events)
    app.command("watch", epilog=WATCH_EXAMPLES)(watch)


def kv_events(
    path: str = typer.Argument(
        ...,
        metavar="PATH",
        help="A recorded stream ('-': stdin): msgpack EventBatches or ZMQ frames (vLLM, "
        "SGLang), TensorRT-LLM's event JSON, Dynamo's JSON Lines; told by content.",
        show_default=False,
    ),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
    limit: int = common.limit_option(100, "Findings shown (0: all)."),
    engine: EngineChoice = EngineOption,
    max_hashes: int = MaxHashesOption,
    db: str | None = typer.Option(
        None,
        "--db",
        metavar="PATH",
        help="Also store the events in this database's engine_kv_event table (all or "
        "nothing; the same bytes once: a rerun stores nothing twice). Before the command "
        "name or $PAGEDKV_DB too.",
        show_default=False,
    ),
) -> None:
    """Check a recorded stream of prefix-cache events (BlockStored / BlockRemoved /
    AllBlocksCleared, TensorRT-LLM's stored / removed / created / updated): unknown hashes
    removed, unknown parents, sequence gaps, hashes used after AllBlocksCleared; exit 1 on
    findings. Tabular formats write the findings, one row each."""
    with guard():
        common.require_extra("kv-events", "events", "msgspec")
        from ..live import KVReport, check_stream, open_events

        db = common.recording_db(db)
        fmt_name = common.report_format(out, fmt)
        common.refuse_binary_to_terminal(out, fmt_name)
        if out not in (None, "-"):
            paths.protect_output(out, db, [path] if path != "-" else [])
        source = "<stdin>" if path == "-" else path
        report: KVReport
        stream = open_events(path)  # the one opener of a recorded stream
        kw: dict[str, Any] = {"engine": engine.value, "keep": limit or None}
        try:
            if db is None:
                with common.progress(None, "kv-events"):
                    report = check_stream(stream, source, max_hashes=max_hashes, **kw)
            else:

                def stored(r: KVReport) -> None:
                    common.COMMITTED.append(f"{r.rows} row(s) were stored in {db}")

                with common.open_to_write(db) as database, common.progress(database, "kv-events"):
                    report = check_stream(
                        stream, source, db=database, on_commit=stored, max_hashes=max_hashes, **kw
                    )
        finally:
            if path != "-":
                stream.close()
        for note in report.notes:
            common.err(f"note: {note}")
        if db is not None and report.stored_before is not None:
            first, rows = report.stored_before
            common.err(
                f"not stored again: {db} holds these bytes already ({rows} row(s) stored from "
                f"{first}; engine_kv_load)"
            )
        elif db is not None:
            common.err(f"stored {report.rows} row(s) in {db} (engine_kv_event)")
        document = json.loads(json.dumps(report.to_dict(), default=str))
        common.write_report(
            out, fmt_name, text.kv_events_text(report), document, _findings_table(report), db
        )
    if not report.ok:
        raise typer.Exit(1)


def _findings_table(report: Any) -> Any:
    """`kv-events`' findings as rows (the ones kept: --limit)."""
    from .. import output

    columns = ["check", "source", "stream", "seq", "position", "where", "message", "group"]
    columns += ["group_kind", "group_window"]
    return output.pa_table(columns, [[getattr(f, c) for c in columns] for f in report.findings])


def watch(
    sources: list[str] = typer.Argument(
        ...,
        metavar="SOURCE",
        help="zmq://HOST:PORT (an engine's KV-event publisher), '-' (stdin), or a FILE (KV "
        "events, or a step log); several at once (e.g. one publisher a data-parallel rank).",
        show_default=False,
    ),
    replay_endpoint: list[str] = typer.Option(
        [],
        "--replay-endpoint",
        metavar="zmq://HOST:PORT",
        help="The publisher's replay (ROUTER) socket, asked for the batches a sequence gap "
        "skipped; once per zmq:// source, in their order.",
        show_default=False,
    ),
    topic: str = typer.Option(
        "", "--topic", metavar="TOPIC", help="The publisher's topic (vLLM's default: '')."
    ),
    bind: bool = typer.Option(
        False,
        "--bind",
        help="Bind the zmq:// addresses instead of connecting to them: for publishers given "
        "a plain HOST:PORT (vLLM then connects; it binds only '*' endpoints).",
    ),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-F",
        help="Follow FILEs as they grow, like tail -F: across rotation and truncation (a "
        "PAGEDKV_STEP_LOG of the vLLM plugin, or JSON Lines of events).",
    ),
    fmt: WatchFormat = typer.Option(
        WatchFormat.text,
        "--format",
        "-f",
        help="text (alias table), or jsonl: one JSON object a line.",
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        metavar="PATH",
        help="Keep what was watched in this database: events appended to engine_kv_event "
        "(committed as they come), and one step log stored at the end as `replay` stores "
        "it, never replacing one (a second is refused, or checked and said not stored). "
        "Before the command name or $PAGEDKV_DB too.",
        show_default=False,
    ),
    exit_on_finding: bool = typer.Option(
        False,
        "--exit-on-finding",
        help="Stop at the first finding or input that cannot be read (exit 1), e.g. in CI.",
    ),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        metavar="PORT",
        min=0,
        max=65535,
        help="Serve Prometheus metrics on --metrics-host:PORT (events, batches, gaps, "
        "findings by invariant, lag behind the publisher); 0: a free port, said on stderr.",
        show_default=False,
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1",
        "--metrics-host",
        metavar="ADDRESS",
        help="The address the metrics are served on: 0.0.0.0 (or ::) for a Prometheus on "
        "another host.",
    ),
    engine: EngineChoice = EngineOption,
    duration: float | None = typer.Option(
        None,
        "--duration",
        metavar="SECONDS",
        min=0,
        help="Stop after this many seconds (default: at SIGINT/SIGTERM or the end of input).",
        show_default=False,
    ),
    limit: int = common.limit_option(0, "Findings shown (0: all); all are counted."),
    max_hashes: int = MaxHashesOption,
) -> None:
    """Follow running engines: check every KV-event and step-log invariant as batches
    arrive and print each finding at once (its source and event named). Ends on SIGINT /
    SIGTERM, --duration, --exit-on-finding or the end of input, with a summary. Exit 1 if
    anything was found or some input could not be read (a source never opened, an
    unreadable message or line, a step log not stored); a second SIGINT / SIGTERM while
    --db stores the step log stops that store (130 / 143). Needs pagedkv-sql[events]
    (msgspec), step logs alone included; zmq:// and --metrics-port need pagedkv-sql[live]."""
    import contextlib
    import sys

    with guard():
        common.require_extra("watch", "events", "msgspec")
    from ..live import Watch, WatchOptions
    from ..live.watch import summary_text

    opts = WatchOptions(
        sources=list(sources),
        replay_endpoints=list(replay_endpoint),
        topic=topic,
        bind=bind,
        follow=follow,
        fmt=fmt.value,
        exit_on_finding=exit_on_finding,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        engine=engine.value,
        duration=duration,
        max_findings_shown=limit or None,
        max_hashes=max_hashes,
    )
    db = common.recording_db(db)
    _COMMITS.clear()
    opened = contextlib.nullcontext() if db is None else common.open_to_write(db)
    with guard(), opened as database:
        summary = Watch(opts, sys.stdout, common.err, db=database, on_commit=_committed).run()
    stored = summary.stored
    if (
        database is not None
        and database.created
        and summary.problems
        and stored is not None
        and not stored.events
        and stored.log is None
    ):  # input it could not read, nothing stored: the database it made is not left behind
        paths.remove_new_database(database.path)
        summary.stored = None
        common.err(f"--db: nothing was stored; {db} was not created")
    # a signal now (the watch's own handlers are gone) is said with what was committed
    with guard():
        if fmt == WatchFormat.jsonl:
            typer.echo(json.dumps(summary.to_dict()))
        else:
            typer.echo(summary_text(summary))
        if summary.stored is not None:
            _say_stored(summary.stored, db)
    if summary.total or summary.problems:
        raise typer.Exit(1)


def _say_stored(stored: Stored, db: str | None) -> None:
    """What watch --db stored; after a second signal, exit 128 + its number."""
    common.err(f"stored {stored.events} event row(s) in {db} (engine_kv_event)")
    if stored.log is not None:
        common.err(f"stored {stored.log} in {db} (replay_event)")
    if stored.interrupted is not None:
        signum = signal.Signals[stored.interrupted]
        what = "terminated" if signum == signal.SIGTERM else "interrupted"
        lost = "the step log was not stored (said above)" if stored.not_stored else "nothing lost"
        common.err(
            f"Error: {what} ({stored.interrupted}) while the watch stored what it watched: "
            f"{lost}; the {stored.events} event row(s) stored in {db} stay"
        )
        common.REPORTED.append(True)
        raise typer.Exit(128 + signum)


_COMMITS: dict[str, str] = {}  # what this watch committed: its events, its step log


def _committed(what: str) -> None:
    """What a watch committed: kept (and said) if the command is interrupted or fails."""
    _COMMITS["log" if what.startswith("the step log") else "events"] = what
    common.COMMITTED[:] = ["; ".join(_COMMITS.values())]


__all__ = ["register"]
