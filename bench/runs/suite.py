"""The main benchmark at one size: its inputs (the synthetic facts, the Arrow tokens, a
FlashInfer snapshot), its measurements in order (each a fresh `bench/run.py --one`
process, medians of the repeats), the table of ratios against the baselines, and at the
end the scaling table across the sizes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from . import common
from .common import COLUMNS, SCALING, SCRIPT, SPEC, has_report_extra
from .measurements import SPARK, SPARK_JOBS, export_for_spark, same_output


def measure(name: str, data: Path, db: Path, work: Path, fresh_db: bool) -> dict[str, float]:
    if fresh_db:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--one",
            name,
            "--data",
            str(data),
            "--db",
            str(db),
            "--work",
            str(work),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(run.stdout))


def print_scaling() -> None:
    """How cost grows with the tokens: time per token and peak RSS of load (with its default
    diagnostics), resolve to Parquet and check, each under a memory_limit of 4 GB, and the
    growth of the time per token from one size to the next."""
    if not SCALING:
        return
    print(
        f"\n## Scaling (memory_limit {common.SCALE_MEMORY_LIMIT}; spill directories left: ", end=""
    )
    print(f"{sum(r[p]['left_over'] for _, r in SCALING for p in SCALE_PHASES if p in r):.0f})\n")
    print(
        "| tokens | phase | seconds | ns per token | vs the size before | CPU ns per token "
        "| vs the size before | peak RSS | spilled |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cpu_before: dict[str, float] = {}
    before: dict[str, float] = {}
    for tokens, r in SCALING:
        for phase in SCALE_PHASES:
            if phase not in r:
                continue
            per = r[phase]["seconds"] / tokens * 1e9
            growth = f"{per / before[phase]:.2f}x" if phase in before else ""
            before[phase] = per
            cpu = r[phase].get("cpu", 0.0) / tokens * 1e9
            cpu_growth = f"{cpu / cpu_before[phase]:.2f}x" if cpu_before.get(phase) else ""
            cpu_before[phase] = cpu
            print(
                f"| {tokens:,} | {phase.removeprefix('scale_')} | {r[phase]['seconds']:.2f} | "
                f"{per:.0f} | {growth} | {cpu:.0f} | {cpu_growth} | "
                f"{r[phase]['peak_mb']:.0f} MB | {'yes' if r[phase].get('spilled') else 'no'} |"
            )


SCALE_PHASES = ("scale_load", "scale_resolve", "scale_check")


def flashinfer_inputs(size: int, work: Path) -> None:
    """A FlashInfer snapshot of ``size`` tokens (sequences of about 1000, pages of 16 in a
    shuffled pool), and the relations it maps to as Arrow IPC files, for the import
    benchmark."""
    import numpy as np

    import pagedkv_sql
    from pagedkv_sql.engines import flashinfer

    rng = np.random.default_rng(1)
    lengths = rng.integers(500, 1500, size=max(1, size // 1000))
    lengths[-1] += size - lengths.sum()  # exactly `size` tokens
    lengths = np.maximum(lengths, 1)
    pages = -(-lengths // 16)
    indptr = np.zeros(pages.size + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(pages)
    indices = rng.permutation(int(indptr[-1])).astype(np.int32)
    last = (lengths - (pages - 1) * 16).astype(np.int32)
    flashinfer.snapshot(indptr, indices, last, 16).save(work / "flashinfer.npz")
    with pagedkv_sql.connect(":memory:") as d:
        d.load_engine(work / "flashinfer.npz", diagnostics=False)
        for rel in COLUMNS:
            table = d.sql(f"SELECT * FROM {rel}").to_arrow_table()
            with pa.ipc.new_file(str(work / f"fi_{rel}.arrow"), table.schema) as w:
                w.write_table(table)


OUTPUT_FORMATS = (
    "resolve_tsv",
    "resolve_json",
    "resolve_jsonl",
    "resolve_table",
    "duckdb_copy_json",
    "duckdb_copy_jsonl",
)


def bench_size(size: int, repeat: int, work: Path, only, SynthConfig, synthesize, write) -> None:  # type: ignore[no-untyped-def]
    tables = synthesize(
        SynthConfig(sequences=max(1, size // 1000), mean_length=1000, missing_fraction=0.01, seed=1)
    )
    data = work / "data"
    write(tables, data, "facts")

    def wanted(*names: str) -> bool:  # inputs only some measurements read (GBs at 100M)
        return only is None or any(n in only for n in names)

    if wanted("load_crlf"):
        crlf = work / "data_crlf"
        crlf.mkdir(exist_ok=True)
        for f in data.iterdir():
            text = f.read_bytes().replace(b"\n", b"\r\n")
            (crlf / f.name).write_bytes(text.replace(b"\r\n", b"\n", 1))  # mixed line ends
    arrow_inputs = ("load_arrow", "load_arrow_file", "load_arrow_alone", "load_arrow_bare")
    if wanted(*arrow_inputs, "resolve_stream", "resolve_stream_distinct"):
        with pa.ipc.new_file(str(work / "tokens.arrow"), tables["virtual_token"].schema) as w:
            w.write_table(tables["virtual_token"], max_chunksize=1 << 20)  # read a batch at a time
    tokens = tables["virtual_token"].num_rows
    del tables  # the measurements run in processes of their own: free the synth's memory
    if only is None or any(n.startswith("flashinfer") for n in only):
        flashinfer_inputs(size, work)
    db, bare_db = work / "bench.duckdb", work / "bare.duckdb"

    loads: dict[str, list[float]] = {}  # the load average before and after each run

    def measured(name: str, target: Path, fresh: bool) -> dict[str, float]:
        seen = loads.setdefault(name, [])
        seen.append(os.getloadavg()[0])
        got = measure(name, data, target, work, fresh)
        seen.append(os.getloadavg()[0])
        return got

    def med(name: str, target: Path, fresh: bool) -> dict[str, float]:
        runs = [measured(name, target, fresh) for _ in range(repeat)]
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    souffle = shutil.which("souffle")
    names = [
        ("bare_load", bare_db, True),
        ("load_with_diagnostics", db, True),
        ("load_crlf", work / "crlf.duckdb", True),
        ("load", db, True),  # leaves db loaded for what follows
        *(
            (name, db, False)
            for name in (
                "bare_union_all_tsv",
                "union_view_tsv",
                *OUTPUT_FORMATS,
                "bare_union_all_arrow",
                "resolve_arrow",
                "resolve_parquet",
                "scan",
                "scan_and_anti_join",
                "check",
                "stats",
                *(("map", "report") if has_report_extra() else ()),
                "load_arrow",
                "load_arrow_file",
                "load_arrow_alone",
                "load_arrow_bare",
                "resolve_stream",
                "resolve_stream_distinct",
                "bare_script",
                "flashinfer_import",
                "flashinfer_arrow",
                "flashinfer_import_diagnostics",
                "flashinfer_arrow_diagnostics",
            )
        ),
        ("end_to_end", work / "e2e.duckdb", True),
        ("scale_load", work / "scale.duckdb", True),
        ("scale_resolve", work / "scale.duckdb", False),
        ("scale_check", work / "scale.duckdb", False),
    ]
    if souffle and SPEC.exists():
        subprocess.run(
            ["souffle", "-o", str(work / "souffle_bin"), str(SPEC)], check=True, cwd=work
        )
        names += [("souffle_interpreted", db, False), ("souffle_compiled", db, False)]
    names += [(name, db, False) for name in (*SPARK_JOBS, "spark_warm", "duckdb_warm")]
    r = {}
    scale_only = only is not None and all(n.startswith("scale_") for n in only)
    # the output formats are held against each other: measured in interleaved rounds, so a
    # change in the machine's load in the middle hits all of them alike
    rounds = [n for n in OUTPUT_FORMATS if only is None or n in only]
    for name, target, fresh in names:
        # `load` fills the database the rest read; the scale_* phases load their own
        if only is not None and name not in only and (name != "load" or scale_only):
            continue
        if name in rounds:
            if name == rounds[0]:
                runs: dict[str, list[dict[str, float]]] = {n: [] for n in rounds}
                for _ in range(repeat):
                    for n in rounds:
                        runs[n].append(measured(n, target, fresh))
                for n, got in runs.items():
                    r[n] = {k: statistics.median(x[k] for x in got) for k in got[0]}
            continue
        if name in SPARK_JOBS or name.endswith("_warm"):
            if shutil.which("java") is None or importlib.util.find_spec("pyspark") is None:
                continue  # the spark extra or Java is missing: said below
            if not (work / "parquet").exists():
                export_for_spark(db, work)
        r[name] = med(name, target, fresh)

    rows = [
        ("load .facts (validated, no diagnostics) vs bare read_csv", "load", "bare_load"),
        ("load .facts with diagnostics vs bare read_csv", "load_with_diagnostics", "bare_load"),
        ("load with CRLF/mixed line ends vs load of the same LF files", "load_crlf", "load"),
        ("resolve to TSV vs bare UNION ALL + ORDER BY, COPY", "resolve_tsv", "bare_union_all_tsv"),
        ("resolve --format json (array) vs to TSV (facts)", "resolve_json", "resolve_tsv"),
        ("resolve --format jsonl vs to TSV (facts)", "resolve_jsonl", "resolve_tsv"),
        ("resolve --format table vs to TSV (facts)", "resolve_table", "resolve_tsv"),
        (
            "resolve --format json vs DuckDB's COPY (FORMAT json, ARRAY true), same bytes",
            "resolve_json",
            "duckdb_copy_json",
        ),
        (
            "resolve --format jsonl vs DuckDB's COPY (FORMAT json)",
            "resolve_jsonl",
            "duckdb_copy_jsonl",
        ),
        (
            "plain UNION view to TSV vs bare UNION ALL (why we avoid it)",
            "union_view_tsv",
            "bare_union_all_tsv",
        ),
        ("resolve to Arrow vs bare UNION ALL to Arrow", "resolve_arrow", "bare_union_all_arrow"),
        ("check (all views) vs one scan of the inputs", "check", "scan"),
        ("stats vs check", "stats", "check"),
        ("map (PNG) vs check", "map", "check"),
        ("report (HTML) vs check", "report", "check"),
        ("report (HTML) vs check + stats, the two it runs", "report", "check_stats"),
        (
            "check vs one scan + the bare anti-join of the tokens (its floor)",
            "check",
            "scan_and_anti_join",
        ),
        (
            "resolve_stream (1M-token batches) vs resolve() on stored tokens",
            "resolve_stream",
            "resolve_arrow",
        ),
        (
            "resolve_stream, distinct across batches, vs resolve()",
            "resolve_stream_distinct",
            "resolve_arrow",
        ),
        (
            "`load` + `resolve -o` (two CLI runs, db file) vs bare in-memory script",
            "end_to_end",
            "bare_script",
        ),
        (
            "import of a FlashInfer snapshot (.npz) vs load_arrow of the same relations",
            "flashinfer_import",
            "flashinfer_arrow",
        ),
        (
            "the same, each followed by every check (import's default)",
            "flashinfer_import_diagnostics",
            "flashinfer_arrow_diagnostics",
        ),
        ("`load` + `resolve -o` vs Soufflé interpreted", "end_to_end", "souffle_interpreted"),
        ("`load` + `resolve -o` vs Soufflé compiled (-o)", "end_to_end", "souffle_compiled"),
        (
            f"`spark resolve` ({SPARK}) vs `load` + `resolve -o x.parquet`, Parquet in and out",
            "spark_resolve_job",
            "duckdb_resolve_job",
        ),
        (f"`spark check` ({SPARK}) vs `load` + `check`", "spark_check_job", "duckdb_check_job"),
        (
            f"Spark ({SPARK}, session running) vs DuckDB: resolve, Parquet in and out",
            "spark_warm",
            "duckdb_warm",
        ),
    ]
    if "check" in r and "stats" in r:
        r["check_stats"] = {
            k: r["check"][k] + r["stats"][k]
            if k == "seconds"
            else max(r["check"][k], r["stats"][k])
            for k in ("seconds", "peak_mb")
        }
    if "scale_load" in r:
        SCALING.append((tokens, r))
    resolved = f" ({r['resolve_tsv']['rows']:,.0f} resolved rows)" if "resolve_tsv" in r else ""
    print(f"\n## {tokens:,} tokens{resolved}, median of {repeat}\n")
    print(f"{os.cpu_count()} cores; load average: the least and most over both sides' runs\n")
    print("| what | ours | baseline | ratio | our peak RSS | baseline peak RSS | load average |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, name, base in rows:
        if name in r and base in r:
            a, b = r[name], r[base]
            seen = loads.get(name, []) + loads.get(base, [])
            load = f"{min(seen):.1f}-{max(seen):.1f}" if seen else "-"
            print(
                f"| {label} | {a['seconds']:.2f} s | {b['seconds']:.2f} s | "
                f"{a['seconds'] / b['seconds']:.2f}x | {a['peak_mb']:.0f} MB | "
                f"{b['peak_mb']:.0f} MB | {load} |"
            )
    print()
    arrow_loads = [
        ("load_arrow", "into :memory:, no diagnostics"),
        ("load_arrow_file", "into a database file holding the block tables, diagnostics on"),
        ("load_arrow_alone", "alone into a new file, diagnostics on (every token unresolved)"),
        ("load_arrow_bare", "bare DuckDB CREATE TABLE AS into a new file"),
    ]
    if any(n in r for n, _ in arrow_loads):
        first = next(r[n] for n, _ in arrow_loads if n in r)
        print(
            f"load_arrow of the token table ({first['arrow_mb']:.0f} MB of Arrow in memory): "
            "peak memory growth / Arrow size"
        )
        for n, what in arrow_loads:
            if n in r:
                la = r[n]
                print(
                    f"- {what}: +{la['growth_mb']:.0f} MB, "
                    f"{la['growth_mb'] / la['arrow_mb']:.2f}x; {la['seconds']:.2f} s"
                )
    if "resolve_parquet" in r:
        rp = r["resolve_parquet"]
        print(
            f"resolve() streamed to Parquet: result {rp['result_mb']:.0f} MB as int64, "
            f"peak resident memory {rp['peak_mb']:.0f} MB; {rp['seconds']:.2f} s."
        )
    if "resolve_stream" in r and "resolve_arrow" in r:
        st = r["resolve_stream"]
        print(
            f"resolve_stream: {st['tokens'] / st['seconds'] / 1e6:.1f} M tokens/s; resolve() "
            f"on stored tokens: {tokens / r['resolve_arrow']['seconds'] / 1e6:.1f} M tokens/s."
        )
    if "map" in r and "report" in r:
        print(
            f"map.png {r['map']['file_mb']:.2f} MB; report.html {r['report']['file_mb']:.1f} MB "
            "(plotly.js's cartesian bundle inlined: about 1.5 MB of it)."
        )
    elif not has_report_extra():
        print("map, report: the report extra (matplotlib) is not installed here.")
    if "spark_warm" in r and "duckdb_warm" in r:
        sw, dw = r["spark_warm"], r["duckdb_warm"]
        print(
            f"Spark ({SPARK}): session start-up {sw['startup']:.1f} s; check (all views) "
            f"{sw['check_seconds']:.2f} s vs DuckDB {dw['check_seconds']:.2f} s "
            f"({sw['check_seconds'] / dw['check_seconds']:.1f}x)."
        )
    elif only is None or any(n in only for n in (*SPARK_JOBS, "spark_warm")):
        print(
            "Spark: not measured (needs Java and the spark extra: make test-spark installs both)."
        )
    if "souffle_compiled" in r and "end_to_end" in r:
        print(same_output(work / "e2e.tsv", work / "souffle_compiled.out"))
    if souffle is None:
        print("Soufflé: not on PATH here, so not measured (docs/benchmarks.md says why).")
    elif not SPEC.exists():
        print(f"Soufflé: found, but the spec is not at {SPEC}, so not measured.")
