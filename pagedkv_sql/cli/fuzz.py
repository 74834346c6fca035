"""Fuzz an engine's real KV manager (pagedkv_sql/fuzz: the fuzz extra and the engine, both
imported only when a run starts): `fuzz vllm|sglang` drives it with random schedules,
checks every state, shrinks a failure to the shortest schedule and writes it as a step log
that `replay` reads."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import typer

from .. import invariants
from . import common
from .common import guard
from .help import examples

FUZZ_HELP = (
    "Drive an engine's real KV manager with random schedules, check every state, shrink a "
    "failure to the shortest schedule."
)
# the planted bugs of each engine's machine, from the catalogue (standard library only:
# --help imports no fuzz module)
VLLMBug = Enum(  # type: ignore[misc]  # the functional API
    "VLLMBug", {b: b for b in invariants.plants("vllm")}, type=str
)
SGLangBug = Enum(  # type: ignore[misc]
    "SGLangBug", {b: b for b in invariants.plants("sglang")}, type=str
)


def _examples(engine: str, plant: str) -> str:
    return examples(
        f"pagedkv-sql fuzz {engine} --time 60",
        f"pagedkv-sql fuzz {engine} --plant {plant} --seed 1 -o failure.jsonl",
        "pagedkv-sql replay failure.jsonl  # the shrunk failure, step by step",
    )


FUZZ_DB_HINT = (
    "drop --db: fuzz drives the engine's own manager; a failure's step log (-o FILE) is "
    "stored with `pagedkv-sql replay FILE --db DB`"
)


def register(app: typer.Typer) -> None:
    fuzz = common.group(app, "fuzz", help=FUZZ_HELP, epilog=_examples("vllm", "skip_decrement"))
    fuzz.command("vllm", epilog=_examples("vllm", "skip_decrement"))(fuzz_vllm)
    fuzz.command("sglang", epilog=_examples("sglang", "leak_page"))(fuzz_sglang)


Examples = typer.Option(
    None,
    "--examples",
    metavar="N",
    min=1,
    help="Schedules to try, at most (default: as many as --time allows).",
)
Steps = typer.Option(30, "--steps", metavar="N", min=1, help="Steps a schedule, at most.")
Seconds = typer.Option(
    60.0,
    "--time",
    metavar="S",
    min=0,
    help="End the run after S seconds, shrinking included (a failure not fully shrunk by "
    "then is reported as shrunk so far).",
)
Seed = typer.Option(0, "--seed", metavar="N", help="Random seed: the same seed, the same run.")
PoolBlocks = typer.Option(
    16,
    "--pool-blocks",
    metavar="N",
    min=2,
    help="Blocks (SGLang: pages) in the pool (at most 2^20, and 2^29 token slots).",
)
BlockSize = common.block_size_option("Tokens a block (SGLang: a page), 1..256.", 4)
Chunk = typer.Option(
    0, "--chunk", metavar="N", min=0, help="Prefill at most N tokens a step (0: whole prompts)."
)
Lookahead = typer.Option(
    0, "--lookahead", metavar="N", min=0, help="Slots allocated ahead of the tokens a step."
)


# the KV-cache kinds fuzz vllm builds (fuzz/vllm.py's KINDS, standard library only)
class VLLMKind(str, Enum):
    full = "full"
    sliding = "sliding"
    hybrid = "hybrid"
    chunked = "chunked"
    mamba = "mamba"


# the KV-cache kinds fuzz sglang builds (fuzz/sglang_kinds.py's KINDS)
class SGLangKind(str, Enum):
    full = "full"
    swa = "swa"
    mamba = "mamba"
    pure_swa = "pure_swa"


def _log_option(engine: str) -> Any:
    return common.output_option(
        "Where a failure's shrunk schedule is written as a step log (for `replay`).",
        f"fuzz-{engine}.jsonl",
    )


def fuzz_vllm(
    examples: int | None = Examples,
    steps: int = Steps,
    seconds: float = Seconds,
    plant: VLLMBug | None = typer.Option(
        None, "--plant", help="Plant this bug in vLLM first (finding it tests the checks)."
    ),
    kind: VLLMKind = typer.Option(
        VLLMKind.full,
        "--kind",
        help="The KV-cache groups, under vLLM's own coordinator: full attention, sliding "
        "window, hybrid (sliding window + full), chunked (local attention), mamba (Mamba + "
        "full).",
    ),
    seed: int = Seed,
    pool_blocks: int = PoolBlocks,
    block_size: int = BlockSize,
    chunk: int = Chunk,
    lookahead: int = Lookahead,
    out: Path = _log_option("vllm"),
    db: str | None = common.unused_db_option(),
) -> None:
    """Fuzz vLLM's KVCacheManager (its BlockPool, prefix cache and free queue) in its
    scheduler's step order. Exit 0 with the coverage counters when every state checked
    clean; 1 with the shrunk schedule, its kind (engine assertion, refused capture: a bug
    of pagedkv-sql, or finding) and the step log. Needs pagedkv-sql[fuzz] and vLLM."""
    _fuzz("vllm", examples, steps, seconds, plant, seed, pool_blocks, block_size, chunk,
          lookahead, out, db, kind.value)  # fmt: skip


def fuzz_sglang(
    examples: int | None = Examples,
    steps: int = Steps,
    seconds: float = Seconds,
    plant: SGLangBug | None = typer.Option(
        None, "--plant", help="Plant this bug in SGLang first (finding it tests the checks)."
    ),
    kind: SGLangKind = typer.Option(
        SGLangKind.full,
        "--kind",
        help="The cache: full (the paged allocator and RadixCache), swa (the "
        "sliding-window allocator's two pools and UnifiedRadixCache), pure_swa (the "
        "all-sliding-window allocator and PureSWARadixCache, --block-size 1) or mamba (Mamba "
        "state slots and UnifiedRadixCache, --block-size 1); all but full are driven through "
        "SGLang's ScheduleBatch: whole prompts, no --chunk or --lookahead.",
    ),
    seed: int = Seed,
    pool_blocks: int = PoolBlocks,
    block_size: int = BlockSize,
    chunk: int = Chunk,
    lookahead: int = Lookahead,
    out: Path = _log_option("sglang"),
    db: str | None = common.unused_db_option(),
) -> None:
    """Fuzz SGLang's page allocator, ReqToTokenPool and RadixCache as its scheduler drives
    them. Exit 0 with the coverage counters when every state checked clean; 1 with the
    shrunk schedule, its kind (engine assertion, refused capture: a bug of pagedkv-sql, or
    finding) and the step log. Needs pagedkv-sql[fuzz] and SGLang."""
    _fuzz("sglang", examples, steps, seconds, plant, seed, pool_blocks, block_size, chunk,
          lookahead, out, db, kind.value)  # fmt: skip


def _fuzz(
    engine: str,
    examples: int | None,
    steps: int,
    seconds: float,
    plant: Enum | None,
    seed: int,
    pool_blocks: int,
    block_size: int,
    chunk: int,
    lookahead: int,
    out: Path,
    db: str | None = None,
    kind: str | None = None,
) -> None:
    import importlib

    with guard():
        from .. import paths

        common.refuse_db(db, "fuzz", FUZZ_DB_HINT)
        # before the run: a failure found and shrunk is never lost to its log's path
        paths.protect_output(out)  # never over a database (`-o pagedkv.duckdb`)
        paths.check_writable(out)
        from ..fuzz.core import check_knobs

        check_knobs(pool_blocks, block_size)
        module = importlib.import_module(f"pagedkv_sql.fuzz.{engine}")
        outcome = module.fuzz(
            examples,
            steps,
            seconds,
            seed,
            plant=plant.value if plant is not None else None,
            num_blocks=pool_blocks,
            block_size=block_size,
            chunk=chunk,
            lookahead=lookahead,
            log=out,
            **({} if kind is None else {"kind": kind}),
        )
    bug = f" with {plant.value} planted" if plant is not None else ""
    on = f" ({kind})" if kind not in (None, "full") else ""
    common.err(f"fuzz {engine}{on}{bug}: {outcome.stats.line()}")
    if outcome.kind is None and not outcome.stats.examples:  # "no failure" of nothing run
        common.err(
            f"Error: no example ran within --time {seconds:g} (the engine's set-up took it): "
            "nothing was checked"
        )
        common.err("Fix: give --time more seconds (an engine's set-up takes a few)")
        raise typer.Exit(2)
    if outcome.kind is None:
        if outcome.stopped == "examples":  # the user's --examples ended it, not --time
            common.err(
                f"no failure: the {examples} examples of --examples ran before --time "
                f"{seconds:g} was spent"
            )
        else:
            common.err(f"no failure: examples ran until --time {seconds:g} was spent")
        return
    shrunk = (
        f"cut short by --time {seconds:g} with {len(outcome.calls)} step(s), not fully shrunk"
        if outcome.cut_short
        else f"shrunk to {len(outcome.calls)} step(s)"
    )
    how = " (by a stored schedule this plant needs)" if outcome.stored else ""
    common.err(f"FAILED: {outcome.kind}{how}, {shrunk}:")
    for i, call in enumerate(outcome.calls):
        common.err(f"  {i}. {call.text}")
    for line in outcome.message.splitlines():
        common.err(f"  {line}")
    where = f"step log: {out} (the failure at its step {outcome.log_step})"
    found = outcome.replayed
    if outcome.unreplayable is not None:
        common.err(
            f"no step log written: `pagedkv-sql replay` cannot replay this engine's log: "
            f"{outcome.unreplayable}"
        )
    elif found is not None:
        agree = (
            "the in-memory check's step and idea"
            if outcome.same_step and outcome.same_idea
            else f"the in-memory check failed at step {outcome.log_step} on "
            f"{', '.join(outcome.ideas) or outcome.kind}"
        )
        common.err(
            f"{where}; `pagedkv-sql replay` finds {found.check} ({found.idea}) at step "
            f"{found.step}: {agree}"
        )
    else:
        common.err(
            f"{where}; `pagedkv-sql replay` finds nothing in it: the step log does not "
            "carry what this check reads"
        )
    raise typer.Exit(1)
