"""A fleet of replicas behind KV-aware routers (pagedkv_sql/fleet): `fleet sim` runs real
vLLM KVCacheManagers behind Dynamo's RadixTree and an approximate router and writes the
fleet directory (docs/fleet.md); `fleet check DIR` compares each replica's events with what
it held, and each router's index with the events."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path

import typer

from ..fleet.plants import PLANTS
from . import common
from .common import guard
from .help import examples

FLEET_HELP = "Replicas behind a KV-aware router: what the router believed against what each held."
FleetPlant = Enum("FleetPlant", {p: p for p in PLANTS}, type=str)  # type: ignore[misc]


class FleetRouter(str, Enum):
    dynamo = "dynamo"
    approx = "approx"


class FleetKind(str, Enum):
    full = "full"
    sliding = "sliding"
    hybrid = "hybrid"
    chunked = "chunked"


_SIM_EXAMPLES = examples(
    "pagedkv-sql fleet sim fleet/ --replicas 4 --requests 1000 --seed 1",
    "pagedkv-sql fleet sim planted/ --plant dropped_batch --router approx",
    "pagedkv-sql fleet sim mc/ --trace mooncake_trace.jsonl --blocks 4096",
)
CHECK_EXAMPLES = examples(
    "pagedkv-sql fleet check run/  # the summary a router, then the findings: exit 1",
    "pagedkv-sql fleet check run/ -f json | jq '.findings[] | {invariant, cause, fault}'",
    "pagedkv-sql fleet check run/ --lag 0.5 --db fleet.duckdb  # keep the tables for `sql`",
)
_FLEET_EXAMPLES = examples(
    "pagedkv-sql fleet sim run/ --replicas 4 --requests 500 --seed 1",
    "pagedkv-sql fleet check run/  # the summary a router, then the findings",
    "pagedkv-sql fleet sim planted/ --plant dropped_batch && pagedkv-sql fleet check planted/",
)


def register(app: typer.Typer) -> None:
    fleet = common.group(app, "fleet", help=FLEET_HELP, epilog=_FLEET_EXAMPLES)
    fleet.command("sim", epilog=_SIM_EXAMPLES)(fleet_sim)
    fleet.command("check", epilog=CHECK_EXAMPLES)(fleet_check)


def fleet_sim(
    out: Path = typer.Argument(
        ..., metavar="DIR", help="The fleet directory to write (new or empty)."
    ),
    replicas: int = typer.Option(4, "--replicas", metavar="N", min=1, max=64, help="Replicas."),
    requests: int = typer.Option(
        200, "--requests", metavar="N", min=1, help="Requests (a trace's first N)."
    ),
    seed: int = typer.Option(1, "--seed", metavar="N", help="The generated workload's seed."),
    router: FleetRouter = typer.Option(
        FleetRouter.dynamo,
        "--router",
        help="The router whose choice sends the requests (the other is fed the same in shadow).",
    ),
    kind: FleetKind = typer.Option(
        FleetKind.full, "--kind", help="Each replica's KV-cache groups (as `fuzz vllm --kind`)."
    ),
    plant: FleetPlant | None = typer.Option(
        None, "--plant", help="Put this fault into the fleet; fleet.json says where it struck."
    ),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        metavar="FILE",
        help="A Mooncake or Qwen-Bailian trace (JSON Lines) instead of the generated workload.",
    ),
    blocks: int = typer.Option(128, "--blocks", metavar="N", min=8, help="Blocks per replica."),
    index_every: int = typer.Option(
        1,
        "--index-every",
        metavar="N",
        min=1,
        help="Dump each router's index every N steps "
        "where it changed (1: every step; a dump is the whole index), and at the end.",
    ),
) -> None:
    """Simulate N replicas, each a real vLLM KVCacheManager (prefix caching and KV events
    on, its step log recorded), behind Dynamo's RadixTree and an approximate router, and
    write the fleet directory: every replica's events and truth, every router's index over
    time, the decisions and the outcomes. Needs vLLM; Dynamo's router needs
    pagedkv-sql[fleet]."""
    with guard():
        from ..fleet.sim import Options, run

        o = Options(
            replicas=replicas,
            requests=requests,
            seed=seed,
            router=router.value,
            kind=kind.value,
            plant=plant.value if plant is not None else None,
            trace=trace,
            num_blocks=blocks,
            index_every=index_every,
        )
        fleet = run(out, o)
    s = fleet["stats"]
    common.err(
        f"fleet sim: {len(fleet['replicas'])} replica(s), {fleet['requests']} request(s) in "
        f"{s['steps']} step(s), {s['preempted']} preemption(s); wrote {out}"
    )
    if fleet["plant"] is not None:
        common.err(f"planted {fleet['plant']}: {fleet['plant_detail']}")


class FleetFormat(str, Enum):
    text = "text"
    json = "json"


def fleet_check(
    directory: str = typer.Argument(..., metavar="DIR", help="A fleet directory (docs/fleet.md)."),
    fmt: FleetFormat = typer.Option(FleetFormat.text, "--format", "-f", help="text or json."),
    lag: float = typer.Option(
        0.0,
        "--lag",
        metavar="SECONDS",
        min=0.0,
        help="Tolerate a residency mismatch up to this long (0: compare at the same instant, "
        "as `fleet sim` records; a live recording wants its events' delivery lag).",
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        metavar="PATH",
        help="Keep the fleet's tables and views in this database file (default: in memory).",
        show_default=False,
    ),
) -> None:
    """Check a fleet: each replica's KV events against what it held (fault `engine`), then
    each router's index against the events (fault `router`), and each routing decision
    against the truth at its time. A summary a router first, then the findings, each
    with its cause. Exit 0: clean; 1: findings; 2: the directory cannot be read."""
    from .. import fleet
    from ..fleet.output import report_json, report_text

    with guard(), common.open_to_write(db or ":memory:") as database:
        report = fleet.check(database, directory, lag=lag)
        if fmt == FleetFormat.json:
            sys.stdout.write(json.dumps(report_json(report), indent=2) + "\n")
        else:
            sys.stdout.write(report_text(report) + "\n")
    if report.findings:
        raise typer.Exit(1)
