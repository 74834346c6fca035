"""A fleet directory (docs/fleet.md, "Layout") read into the tables of sql/fleet.sql.

``load(cur, directory)`` fills them on a cursor it is handed: fleet.json, each replica's
events and step log (DuckDB's JSON reader; the log's header by replay's validator, its
``cache`` and ``evict`` ops; a bad line named), each
router's index dumps, the decisions and the outcomes. Every hash is stored as vLLM's
published integer folded to signed BIGINT. Bad input is a ``FindingsInputError`` (exit 2)
naming the file and line, with a ``Fix:`` line."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import duckdb
import pyarrow as pa

from ..errors import FindingsInputError, Problem
from ..replay.header import HEADER_KEY, LogLineError, header_from
from ..sqlfiles import statements_in
from .dynamo_dump import dump_elements, dump_rows

FLEET_SQL = ("fleet_load.sql", "fleet.sql")
LAYOUT_HINT = "see docs/fleet.md, 'Layout': DIR/fleet.json, DIR/replica=NAME/, DIR/router=NAME/"
APPROXIMATE_KINDS = ("approx", "approx_lru")  # routers fed no events: a baseline


def sql() -> dict[str, str]:
    """sql/fleet_load.sql's and sql/fleet.sql's statements by name."""
    return {s.name: s.sql for file in FLEET_SQL for s in statements_in(file)}


def bad(path: Path | str, line: int | None, message: str, hint: str = LAYOUT_HINT) -> NoReturn:
    raise FindingsInputError(
        f"{path}: {message}" if line is None else f"{path}, line {line}: {message}",
        [Problem(str(path), line, None, message)],
        hint=hint,
    )


def to_signed(value: Any, path: Path, line: int, what: str) -> int:
    """A hash as the files write it (vLLM's unsigned 64-bit integer) as signed BIGINT."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < 1 << 64:
        bad(path, line, f"{what} must be a 64-bit integer hash, not {json.dumps(value)[:40]}")
    return int(value - (1 << 64) if value >= 1 << 63 else value)


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each line of a JSON Lines file as an object, with its number (blank lines skipped)."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                bad(path, number, f"not JSON: {e}")
            if not isinstance(obj, dict):
                bad(path, number, "a line must be a JSON object")
            yield number, obj


def meta(directory: Path) -> dict[str, Any]:
    """fleet.json, checked."""
    path = directory / "fleet.json"
    if not directory.is_dir():
        bad(directory, None, "no such directory", "give a directory `fleet sim` wrote")
    if not path.is_file():
        bad(path, None, "missing: a fleet directory starts with its fleet.json", LAYOUT_HINT)
    try:
        obj = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        bad(path, None, f"not JSON: {e}")
    if not isinstance(obj, dict) or obj.get("pagedkv_fleet") != 1:
        bad(path, None, 'not a fleet description: it needs "pagedkv_fleet": 1')
    for key, kind in (("step_seconds", (int, float)), ("block_size", int), ("replicas", list)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            bad(path, None, f"'{key}' is missing or not a {kind}")
    if obj["block_size"] <= 0 or obj["step_seconds"] <= 0:
        bad(path, None, "'block_size' and 'step_seconds' must be positive")
    for i, r in enumerate(obj["replicas"]):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            bad(path, None, f"replicas[{i}] needs a 'name'")
    for i, r in enumerate(obj.get("routers", [])):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str):
            bad(path, None, f"routers[{i}] needs a 'name'")
    return dict(obj)


def insert(cur: duckdb.DuckDBPyConnection, table: str, rows: Mapping[str, list[Any]]) -> None:
    data = pa.table(dict(rows))
    cur.register("_pagedkv_fleet_rows", data)
    try:
        cur.execute(f"INSERT INTO {table} SELECT * FROM _pagedkv_fleet_rows")
    finally:
        cur.unregister("_pagedkv_fleet_rows")


def load(cur: duckdb.DuckDBPyConnection, directory: Path) -> dict[str, Any]:
    """Every file of the fleet directory into the tables (created anew); fleet.json back."""
    info = meta(directory)
    statements = sql()
    cur.execute(statements["fleet_tables"])
    replicas = info["replicas"]
    workers = {(r.get("worker_id", i), r.get("dp_rank")): r["name"] for i, r in enumerate(replicas)}
    by_worker = {w: name for (w, _), name in workers.items()}
    insert(
        cur,
        "fleet_replica",
        {
            "replica": [r["name"] for r in replicas],
            "worker_id": [r.get("worker_id", i) for i, r in enumerate(replicas)],
            "dp_rank": [r.get("dp_rank", 0) for r in replicas],
            "num_gpu_blocks": [r.get("num_gpu_blocks") for r in replicas],
        },
    )
    routers = info.get("routers", [])
    for r in routers:  # a router directory fleet.json does not name is refused below
        r.setdefault("kind", "")
    named = {r["name"] for r in routers}
    for sub in sorted(directory.glob("router=*")):
        name = sub.name.removeprefix("router=")
        if name not in named:
            routers.append({"name": name, "kind": "", "routed": False})
    insert(
        cur,
        "fleet_router",
        {
            "router": [r["name"] for r in routers],
            "kind": [r["kind"] for r in routers],
            "routed": [bool(r.get("routed", False)) for r in routers],
            "approximate": [r["kind"] in APPROXIMATE_KINDS for r in routers],
        },
    )
    groups = [g for g in info.get("groups", []) if isinstance(g, dict)]
    insert(
        cur,
        "fleet_group",
        {
            "grp": pa.array([g.get("group", i) for i, g in enumerate(groups)], pa.int64()),
            "kind": pa.array([str(g.get("kind", "")) for g in groups], pa.string()),
        },
    )
    t_last = 0.0
    for r in replicas:
        t_last = max(t_last, _events(cur, statements, directory, r["name"]))
        t_last = max(t_last, _steps(cur, statements, directory, r["name"], info["step_seconds"]))
    for r in routers:
        t_last = max(t_last, _index(cur, directory, r["name"], workers, by_worker, t_last))
    t_last = max(t_last, _decisions(cur, directory), _outcomes(cur, directory))
    t_end = round(t_last + info["step_seconds"], 9)  # one step past the last thing observed
    every = info.get("index_every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        bad(
            directory / "fleet.json",
            None,
            f"'index_every' must be a step count >= 1, not {every!r}",
        )
    sample = every * info["step_seconds"] if every > 1 else 0.0
    cur.execute(
        "INSERT INTO fleet_meta VALUES (?, ?, ?, ?, ?)",
        [info["step_seconds"], info["block_size"], info.get("hash", "vllm_last8"), t_end, sample],
    )
    return info


def _events(
    cur: duckdb.DuckDBPyConnection, sql: dict[str, str], directory: Path, name: str
) -> float:
    path = directory / f"replica={name}" / "events.jsonl"
    if not path.is_file():
        bad(path, None, f"missing: replica {name}'s KV events (one KVEventBatch a line)")
    try:
        cur.execute(sql["fleet_event_lines"], {"file": str(path)})
    except duckdb.Error as e:
        for _ in json_lines(path):  # names the first line that is not a JSON object
            pass
        bad(path, None, f"cannot read its events: {str(e).splitlines()[0]}")
    try:  # the shapes checked only when something is off: the check costs a second unnest
        cur.execute(sql["fleet_event_batches"], {"replica": name})
        cur.execute(sql["fleet_event_rows"], {"replica": name})
        ((odd,),) = cur.execute(sql["fleet_event_odd"], {"replica": name}).fetchall()
    except duckdb.Error as e:
        _name_problem(cur, sql["fleet_event_problem"], path)
        for number, obj in json_lines(path):
            for event in obj["events"]:
                tag = event.get("type") if isinstance(event, dict) else event[0]
                if tag in ("BlockStored", "BlockRemoved"):
                    hashes = event["block_hashes"] if isinstance(event, dict) else event[1]
                    for h in hashes:
                        to_signed(h, path, number, f"{tag}'s hash")
        bad(path, None, f"cannot read its events: {str(e).splitlines()[0]}")
    if odd:
        _name_problem(cur, sql["fleet_event_problem"], path)
    (last,) = cur.execute("SELECT max(ts) FROM fleet_batch WHERE replica = ?", [name]).fetchall()[0]
    return 0.0 if last is None else float(last)


def _name_problem(
    cur: duckdb.DuckDBPyConnection, query: str, path: Path, hint: str = LAYOUT_HINT
) -> None:
    """The first line of fleet_json_lines that ``query`` finds wrong, as a bad line."""
    for line, problem in cur.execute(query).fetchall():
        bad(path, int(line), str(problem), hint)


def _steps(
    cur: duckdb.DuckDBPyConnection, sql: dict[str, str], directory: Path, name: str, step: float
) -> float:
    """The step log's header checked by replay's own validator, its cache and evict ops
    read by DuckDB (replay's reader builds every op's rows in Python: too slow for a
    fleet's logs; docs/fleet.md, "Decisions")."""
    path = directory / f"replica={name}" / "steps.jsonl"
    if not path.is_file():
        bad(path, None, f"missing: replica {name}'s step log (its truth)")
    with path.open("rb") as f:
        first = f.readline()
    try:
        head = json.loads(first)
        if not isinstance(head, dict) or HEADER_KEY not in head:
            raise LogLineError(f"the first line must be the step log's header ({HEADER_KEY})")
        fold = head.pop("hash", "first8")  # how the log folds its hashes; absent: an old log
        if fold not in ("vllm_last8", "first8"):
            raise LogLineError(f"header 'hash' must be vllm_last8 or first8, not {fold!r}")
        header_from(head)
    except (ValueError, UnicodeDecodeError, LogLineError) as e:
        bad(path, 1, f"the step log's header: {e}", "see docs/replay.md, 'The header'")
    try:
        cur.execute(sql["fleet_event_lines"], {"file": str(path)})
    except duckdb.Error as e:
        for _ in json_lines(path):  # names the first line that is not a JSON object
            pass
        bad(path, None, f"cannot read its steps: {str(e).splitlines()[0]}")
    try:
        cur.execute(sql["fleet_step_ops"], {"replica": name})
        ((odd,),) = cur.execute(sql["fleet_step_odd"], {"replica": name}).fetchall()
    except duckdb.Error as e:
        _name_problem(cur, sql["fleet_step_problem"], path, "see docs/replay.md, 'Operations'")
        bad(path, None, f"cannot read its steps: {str(e).splitlines()[0]}")
    if odd:
        _name_problem(cur, sql["fleet_step_problem"], path, "see docs/replay.md, 'Operations'")
    (last,) = cur.execute(
        "SELECT max((j->>'$.step')::BIGINT) FROM fleet_json_lines WHERE line > 1"
    ).fetchall()[0]
    return 0.0 if last is None else last * step


def _index(
    cur: duckdb.DuckDBPyConnection,
    directory: Path,
    name: str,
    workers: Mapping[tuple[Any, Any], str],
    by_worker: Mapping[Any, str],
    t_at: float,
) -> float:
    folder = directory / f"router={name}"
    lines: list[tuple[Path, int, Any, Any]] = []
    if (folder / "index.jsonl").is_file():
        path = folder / "index.jsonl"
        for number, obj in json_lines(path):
            t = obj.get("t")
            if isinstance(t, bool) or not isinstance(t, int | float):
                bad(path, number, "an index dump needs its time 't' (seconds)")
            lines.append((path, number, round(float(t), 9), obj.get("dump")))
    elif (folder / "index.json").is_file():  # one dump, e.g. the standalone indexer's GET /dump
        path = folder / "index.json"
        try:
            lines.append((path, 1, None, json.loads(path.read_bytes())))
        except (ValueError, UnicodeDecodeError) as e:
            bad(path, None, f"not JSON: {e}")
    rows: dict[str, list[Any]] = {
        k: [] for k in ("router", "t", "replica", "dp_rank", "tier", "hash")
    }
    times: list[float | None] = []
    for path, number, t, dump in lines:
        times.append(t)
        try:
            found = list(dump_rows(dump_elements(dump), workers, by_worker))
        except ValueError as e:
            bad(path, number, str(e))
        for replica, rank, tier, h in found:
            rows["router"].append(name)
            rows["t"].append(t)
            rows["replica"].append(replica)
            rows["dp_rank"].append(rank)
            rows["tier"].append(tier)
            rows["hash"].append(to_signed(h, path, number, "block_hash"))
    if None in times:  # a single dump without a time: the index at the end of the run
        rows["t"] = [t_at if t is None else t for t in rows["t"]]
        times = [t_at if t is None else t for t in times]
    insert(
        cur,
        "fleet_dump",
        {
            **rows,
            "t": pa.array(rows["t"], pa.float64()),
            "dp_rank": pa.array(rows["dp_rank"], pa.int64()),
            "hash": pa.array(rows["hash"], pa.int64()),
        },
    )
    insert(
        cur, "fleet_dump_time", {"router": [name] * len(times), "t": pa.array(times, pa.float64())}
    )
    return max((t for t in times if t is not None), default=0.0)


def _field(obj: Mapping[str, Any], key: str, kind: Any, path: Path, number: int) -> Any:
    value = obj.get(key)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        bad(path, number, f"'{key}' is missing or of the wrong type")
    return value


def _decisions(cur: duckdb.DuckDBPyConnection, directory: Path) -> float:
    path = directory / "decisions.jsonl"
    dec: dict[str, list[Any]] = {
        k: [] for k in ("request", "router", "t", "chosen", "reason", "routed", "prompt_tokens")
    }
    pred: dict[str, list[Any]] = {k: [] for k in ("request", "router", "replica", "blocks")}
    hashes: dict[str, list[Any]] = {k: [] for k in ("request", "pos", "hash")}
    seen: set[str] = set()
    if path.is_file():
        for number, obj in json_lines(path):
            request = _field(obj, "request", str, path, number)
            dec["request"].append(request)
            dec["router"].append(_field(obj, "router", str, path, number))
            dec["t"].append(round(float(_field(obj, "t", int | float, path, number)), 9))
            dec["chosen"].append(_field(obj, "chosen", str, path, number))
            dec["reason"].append(str(obj.get("reason", "prefix")))
            dec["routed"].append(bool(obj.get("routed", True)))
            dec["prompt_tokens"].append(_field(obj, "prompt_tokens", int, path, number))
            for replica, blocks in _field(obj, "predicted", dict, path, number).items():
                pred["request"].append(request)
                pred["router"].append(obj["router"])
                pred["replica"].append(replica)
                pred["blocks"].append(blocks)
            if "hashes" in obj and request not in seen:
                seen.add(request)
                for pos, h in enumerate(_field(obj, "hashes", list, path, number)):
                    hashes["request"].append(request)
                    hashes["pos"].append(pos)
                    hashes["hash"].append(to_signed(h, path, number, "hashes"))
    insert(
        cur,
        "fleet_decision",
        {
            **dec,
            "t": pa.array(dec["t"], pa.float64()),
            "prompt_tokens": pa.array(dec["prompt_tokens"], pa.int64()),
        },
    )
    insert(cur, "fleet_prediction", {**pred, "blocks": pa.array(pred["blocks"], pa.int64())})
    insert(
        cur,
        "fleet_request_hash",
        {
            **hashes,
            "pos": pa.array(hashes["pos"], pa.int64()),
            "hash": pa.array(hashes["hash"], pa.int64()),
        },
    )
    return max(dec["t"], default=0.0)


def _outcomes(cur: duckdb.DuckDBPyConnection, directory: Path) -> float:
    path = directory / "outcomes.jsonl"
    out: dict[str, list[Any]] = {
        k: [] for k in ("request", "replica", "t", "prompt_tokens", "cached_tokens")
    }
    if path.is_file():
        for number, obj in json_lines(path):
            out["request"].append(_field(obj, "request", str, path, number))
            out["replica"].append(_field(obj, "replica", str, path, number))
            out["t"].append(round(float(_field(obj, "t", int | float, path, number)), 9))
            out["prompt_tokens"].append(_field(obj, "prompt_tokens", int, path, number))
            out["cached_tokens"].append(_field(obj, "cached_tokens", int, path, number))
    insert(
        cur,
        "fleet_outcome",
        {
            **out,
            "t": pa.array(out["t"], pa.float64()),
            "prompt_tokens": pa.array(out["prompt_tokens"], pa.int64()),
            "cached_tokens": pa.array(out["cached_tokens"], pa.int64()),
        },
    )
    return max(out["t"], default=0.0)
