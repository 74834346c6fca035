"""What every part of the main benchmark shares: the repository's place (ROOT, computed
here once, and the entry script bench/run.py the measurements are run as), the queries of
the bare baselines, the input relations' columns, the scaling settings (SCALE_MEMORY_LIMIT
is set by `--memory-limit`: read it as `common.SCALE_MEMORY_LIMIT`), and this process's
resident and peak memory."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import duckdb
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "run.py"  # the entry script: each measurement runs it (--one)
UNION_ALL = (
    "SELECT seq_id, token_pos, physical_address FROM (SELECT * FROM resolved_kv_address_gpu "
    "UNION ALL SELECT * FROM resolved_kv_address_cpu) ORDER BY ALL"
)
ANTI_JOIN = (
    "SELECT count(*) FROM virtual_token ANTI JOIN ("
    "SELECT r.seq_id, b.block_index FROM root_table r "
    "JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr UNION ALL "
    "SELECT r.seq_id, s.block_index FROM root_table r "
    "JOIN swapped_block s ON s.block_table_id = r.block_table_ptr) USING (seq_id, block_index)"
)
COLUMNS = {
    "root_table": ["seq_id", "block_table_ptr"],
    "block_table_entry": ["block_table_id", "block_index", "physical_block_base", "refcount"],
    "virtual_token": ["seq_id", "token_pos", "block_index", "offset_in_block"],
    "swapped_block": ["block_table_id", "block_index", "cpu_base_address"],
}


BARE_SCRIPT = """
import duckdb, sys
data, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
columns = {columns!r}
for rel, cols in columns.items():
    spec = "{{" + ", ".join(f"'{{c}}': 'BIGINT'" for c in cols) + "}}"
    con.execute(
        f"CREATE TABLE {{rel}} AS SELECT * FROM read_csv('{{data}}/{{rel}}.facts', "
        f"delim='\\t', header=false, auto_detect=false, columns={{spec}})"
    )
con.execute(f\"\"\"COPY (
    SELECT v.seq_id, v.token_pos, b.physical_block_base + v.offset_in_block
    FROM virtual_token v JOIN root_table r ON r.seq_id = v.seq_id
    JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr
                            AND b.block_index = v.block_index
    UNION
    SELECT v.seq_id, v.token_pos, s.cpu_base_address + v.offset_in_block
    FROM virtual_token v JOIN root_table r ON r.seq_id = v.seq_id
    JOIN swapped_block s ON s.block_table_id = r.block_table_ptr
                        AND s.block_index = v.block_index
) TO '{{out}}' (DELIMITER '\\t', HEADER false)\"\"\")
"""
SCALE_MEMORY_LIMIT = "4GB"
SCALING: list[tuple[int, dict[str, dict[str, float]]]] = []  # (tokens, figures) per size
SPEC = ROOT.parent / "shared" / "spec" / "paged_attention.dl"


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the
    parent across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak() -> None:
    """Start VmHWM again from the current resident memory (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def token_batches(path: Path, rows: int, counted: list[int]):  # type: ignore[no-untyped-def]
    """The tokens of an Arrow IPC file as batches of ``rows`` rows, read one file batch at
    a time (``counted[0]``: the tokens given so far)."""
    reader = pa.ipc.open_file(pa.OSFile(str(path)))
    pending: list[pa.RecordBatch] = []
    held = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        pending.append(batch)
        held += batch.num_rows
        while held >= rows or (held and i == reader.num_record_batches - 1):
            table = pa.Table.from_batches(pending).combine_chunks()
            take = min(rows, held)
            counted[0] += take
            yield table.slice(0, take).combine_chunks().to_batches()[0]
            rest = table.slice(take)
            pending, held = rest.to_batches(), rest.num_rows


def has_report_extra() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None  # report needs none


def scan_inputs(con: duckdb.DuckDBPyConnection) -> None:
    """One scan of the inputs: count(*) and sum of every column of every input table."""
    for rel, cols in COLUMNS.items():
        con.execute(f"SELECT count(*), {', '.join(f'sum({c})' for c in cols)} FROM {rel}")
        con.fetchall()
