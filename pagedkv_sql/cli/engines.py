"""Serving engines' own arrays: `import` a snapshot, `export flashinfer|vllm` the stored
relations as an engine's page table (pagedkv_sql/engines)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .. import faces
from . import common, text
from .common import DbOption, guard
from .help import examples

if TYPE_CHECKING:
    from ..engines import Snapshot

EXPORT_HELP = "Write the stored relations as an engine's own arrays, or as Parquet for Spark."


IMPORT_EXAMPLES = examples(
    "pagedkv-sql import vllm snapshot.safetensors",
    "pagedkv-sql import flashinfer pages.npz --page-size 16 --request-ids ids.txt",
)


def register(app: typer.Typer) -> None:
    app.command("import", epilog=IMPORT_EXAMPLES)(import_)
    export = common.group(app, "export", help=EXPORT_HELP)
    export.command("flashinfer")(export_flashinfer)
    export.command("vllm")(export_vllm)


# the engines' faces (faces.py, standard library only): TAB completion imports nothing heavy
ENGINE_NAMES = faces.NAMES


def _complete_engine(incomplete: str) -> list[str]:
    return [name for name in ENGINE_NAMES if name.startswith(incomplete)]


def import_(
    engine: str = typer.Argument(
        ...,
        help=f"{', '.join(ENGINE_NAMES[:-1])} or {ENGINE_NAMES[-1]}.",
        show_default=False,
        autocompletion=_complete_engine,
    ),
    path: str = typer.Argument(
        ..., help="A snapshot file (.safetensors or .npz).", show_default=False
    ),
    page_size: int | None = typer.Option(
        None,
        "--page-size",
        "--block-size",
        metavar="N",
        min=1,
        help="Tokens a page (block) when the file does not record it (a plain np.savez "
        "without a page_size member).",
        show_default=False,
    ),
    request_ids: Path | None = typer.Option(
        None,
        "--request-ids",
        metavar="FILE",
        help="The sequences' request ids, one a line, when the file does not record them.",
        show_default=False,
    ),
    db: str | None = DbOption,
    strict: bool = common.strict_option("Refuse the import if any diagnostic (warning) fires."),
    convert: bool = typer.Option(
        False,
        "--convert",
        help="Accept index arrays of a dtype the engine would refuse (FlashInfer int64).",
    ),
    diagnostics: bool = common.diagnostics_option(
        "Run the checks and engine invariants after importing; report warnings."
    ),
    max_errors: int = common.max_errors_option(),
) -> None:
    """Import a serving engine's snapshot: replaces the stored relations with the ones it
    maps to, and keeps the engine's own facts (request ids, free queue...) beside them."""
    with guard(max_errors):
        from .. import engines

        snapshot = _read(engine, path, page_size, request_ids)
        with common.open_to_write(db) as database, common.progress(database, "import"):
            report = engines.load(
                database, snapshot, strict=strict, diagnostics=diagnostics, convert=convert
            )
        if not common.quiet():
            common.err(text.import_summary(report, database.path))


def _read(engine: str, path: str, page_size: int | None, request_ids: Path | None) -> Snapshot:
    """The snapshot file, completed by what the command line gives (before the database
    is opened: a file refused leaves no database behind)."""
    from .. import engines
    from ..engines.meta import complete

    engines.engine(engine)  # an unknown engine is a usage error before any file is read
    snap = engines.read(path, engine)
    ids = None if request_ids is None else read_lines(request_ids, "--request-ids")
    complete(snap.source, snap.meta, block_size=page_size, request_ids=ids)
    return snap


def read_lines(path: Path, option: str) -> list[str]:
    """A text file's lines (UTF-8, a last newline optional), for an option naming one
    (``--request-ids``): split at LF and CRLF only (never at the form feeds, NELs and
    U+2028 that ``str.splitlines`` takes for line ends: an id may hold them), read within
    bounds (``/dev/zero`` is refused after a few KiB, never read to the memory's end)."""
    from ..errors import InputError, UsageError
    from ..limits import MAX_REQUEST_ID_BYTES, MAX_REQUEST_IDS, LineTooLong, bounded_lines

    hint = "one id a line, UTF-8 text, one line a sequence"
    lines: list[str] = []
    try:
        with path.open("rb") as f:
            for raw in bounded_lines(f, MAX_REQUEST_ID_BYTES):
                if len(lines) == MAX_REQUEST_IDS:
                    raise InputError(
                        f"{option} {path}: more than {MAX_REQUEST_IDS:,} lines: more request "
                        "ids than an engine runs sequences",
                        hint=hint,
                    )
                body = raw.removesuffix(b"\n").removesuffix(b"\r")
                try:
                    lines.append(body.decode("utf-8-sig" if not lines else "utf-8"))
                except UnicodeDecodeError as e:
                    raise InputError(
                        f"{option} {path}:{len(lines) + 1}: not UTF-8 (byte "
                        f"0x{body[e.start]:02x} at column {e.start + 1})",
                        hint=hint,
                    ) from None
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except LineTooLong as e:
        raise InputError(
            f"{option} {path}:{e.number}: a line longer than {e.limit:,} bytes: no request id "
            "is that long",
            hint=hint,
        ) from None
    except OSError as e:
        raise InputError(f"{option} {path}: cannot read it: {e.strerror or e}", hint=hint) from None
    return lines


def _export(engine: str, db: str | None, out: Path, strict: bool) -> None:
    with guard(), common.open_read_only(db) as database:
        from ..engines import export_arrays
        from ..engines.export import check_target

        check_target(out, engine, database.path)  # refused before the export's work
        with common.progress(database, f"export {engine}"):
            result = export_arrays(database, engine)
        for seq_id, request_id, reason in result.refused:
            label = f" (request {request_id})" if request_id is not None else ""
            common.err(f"refused: seq_id {seq_id}{label}: {reason}")
        if strict and result.refused:
            common.err(f"Error: {len(result.refused)} sequence(s) refused; nothing was written")
            raise typer.Exit(1)
        written = result.write(out, database=database.path)
    exported = len(result.snapshot.meta["seq_ids"])
    common.err(f"wrote {exported} sequence(s) to {out}: {', '.join(p.name for p in written)}")


ExportOut = common.output_option("Directory to write.", ..., metavar=None)
ExportStrict = common.strict_option("Write nothing if any sequence is refused (exit 1).")


def export_flashinfer(
    output_dir: Path = ExportOut, db: str | None = DbOption, strict: bool = ExportStrict
) -> None:
    """FlashInfer's CSR page table: kv_indptr, kv_indices, kv_last_page_len (int32), one
    .npy each, and flashinfer.npz with page_size. A sequence that is not a contiguous,
    fully resident run of tokens 0..len-1 is refused, naming why."""
    _export("flashinfer", db, output_dir, strict)


def export_vllm(
    output_dir: Path = ExportOut, db: str | None = DbOption, strict: bool = ExportStrict
) -> None:
    """vLLM's worker-side block_table (int32), num_blocks_per_row and slot_mapping
    (int64), one .npy each, and vllm.npz with block_size."""
    _export("vllm", db, output_dir, strict)
