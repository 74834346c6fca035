"""The catalogue of the KV cache's invariants: each idea named once, with its check in every
model that has one.

A model is one way the project looks at a cache:

- ``spec``: the validation views of sql/constraints.sql over the spec's four relations
  (``spec_*`` are the spec's own constraints, errors; ``diag_*`` are diagnostics, warnings);
- ``engine``: the ``diag_engine_*`` views of sql/engines.sql over an engine import;
- ``fastcheck``: the same engine invariants in numpy (engines/fastcheck_rules.py), no database;
- ``replay``: the ``replay_check_*`` queries of sql/replay.sql over a step log, at every step;
- ``live``: the prefix-cache event checks of live/checker.py, as events arrive;
- ``fleet``: the ``fleet_check_*`` queries of sql/fleet.sql over a fleet directory (each
  replica's events against its step log, each router's index against the events).

Every check of every model names its idea here (tests/test_invariants.py reads the models'
sources), the ``synth-log`` faults and the ``fuzz`` plants are the ones listed here, and the
docs' tables of checks are generated from it (``make docs``). ``rank`` orders the findings
of one step: a cause before its consequences (a double free before the stale tokens it
leaves). Standard library only: the CLI's help and the docs read it without DuckDB.

A new invariant: a line here first, then its check in each model that can see it, a plant
(a ``synth-log`` fault or a ``fuzz`` plant) and the conformance scenario that plants it once
(tests/test_invariants.py); docs/architecture.md, "A new invariant".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SPEC, ENGINE, FASTCHECK, REPLAY, LIVE = "spec", "engine", "fastcheck", "replay", "live"
FLEET = "fleet"
MODELS = (SPEC, ENGINE, FASTCHECK, REPLAY, LIVE, FLEET)


@dataclass(frozen=True)
class Invariant:
    """One idea: what must hold, how bad a break is, and its check in each model."""

    name: str
    title: str  # one line: what a break means
    rank: int  # the order of findings at one step: causes (low) before consequences
    checks: Mapping[str, tuple[str, ...]]  # model -> its checks' names
    severity: str = "warning"  # "error": the spec's constraints (data refused)
    faults: Mapping[str, str] = field(default_factory=dict)  # `synth-log --fault`: what it does
    plants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # fuzz: engine -> plant
    causes: tuple[str, ...] = ()  # ideas whose finding can explain this one's
    upstream: tuple[str, ...] = ()  # public reports of it (engines' issue numbers)
    observed: tuple[str, ...] = ()  # its faults that falsify what the engine reports of itself

    def models(self) -> tuple[str, ...]:
        """The models that check it, in MODELS' order."""
        return tuple(m for m in MODELS if self.checks.get(m))


def _inv(
    name: str,
    title: str,
    rank: int,
    *,
    spec: tuple[str, ...] = (),
    engine: tuple[str, ...] = (),
    fastcheck: tuple[str, ...] = (),
    replay: tuple[str, ...] = (),
    live: tuple[str, ...] = (),
    fleet: tuple[str, ...] = (),
    severity: str = "warning",
    faults: Mapping[str, str] | None = None,
    plants: Mapping[str, Mapping[str, str]] | None = None,
    causes: tuple[str, ...] = (),
    upstream: tuple[str, ...] = (),
    observed: tuple[str, ...] = (),
) -> Invariant:
    checks = {
        SPEC: spec,
        ENGINE: engine,
        FASTCHECK: fastcheck,
        REPLAY: replay,
        LIVE: live,
        FLEET: fleet,
    }
    return Invariant(
        name,
        title,
        rank,
        MappingProxyType({m: c for m, c in checks.items() if c}),
        severity,
        MappingProxyType(dict(faults or {})),
        MappingProxyType({e: MappingProxyType(dict(p)) for e, p in (plants or {}).items()}),
        causes,
        upstream,
        observed,
    )


CATALOGUE: tuple[Invariant, ...] = (
    # -- the spec's own constraints: data that breaks one is refused ---------------------------
    _inv(
        "unaligned_base",
        "a block's physical base is not 256-byte aligned",
        0,
        spec=("spec_unaligned_base",),
        severity="error",
    ),
    _inv(
        "offset_out_of_block",
        "a token's offset in its block is outside [0, 255]",
        0,
        spec=("spec_offset_out_of_block",),
        severity="error",
    ),
    _inv(
        "negative_refcount",
        "a block's refcount is negative",
        0,
        spec=("spec_negative_refcount",),
        severity="error",
    ),
    # -- ownership: who holds a block, and how often it was given back -------------------------
    _inv(
        "outside_pool",
        "a block id outside the pool, or a reserved block (vLLM's null block) handed out",
        10,
        engine=("diag_engine_outside_pool",),
        fastcheck=("outside_pool",),
        replay=("outside_pool",),
        faults={"outside_pool": "a block id past the pool is handed out"},
        plants={
            "vllm": {
                "null_block_handed": "`free_blocks` frees the null block as a real block, "
                "into the free queue (from where it is handed out)"
            }
        },
    ),
    _inv(
        "double_free",
        "a block released more often than it was acquired: by a request that does not "
        "hold it, or twice into the free list",
        20,
        engine=("diag_engine_free_list_duplicate",),
        fastcheck=("free_list_duplicate",),
        replay=("double_free", "free_list_duplicate"),
        faults={
            "double_free": "a request releases a block it does not hold",
            "free_list_duplicate": "the engine's free list holds a free block twice",
        },
        observed=("free_list_duplicate",),
        plants={
            "vllm": {"double_free": "`free_blocks` frees the last block twice"},
            "sglang": {"double_free": "`free` hands the last page back twice"},
        },
        upstream=("vLLM #42571",),
    ),
    _inv(
        "leak",
        "a block no entry holds that never returns to the free list, or a block table no "
        "sequence points to",
        25,
        spec=("diag_orphan_block_table", "diag_orphan_swapped_block"),
        engine=("diag_engine_leak",),
        fastcheck=("leak",),
        replay=("leak",),
        faults={"leak": "a request's free keeps its last block back from the pool"},
        plants={"sglang": {"leak_page": "`free` drops the last page"}},
        upstream=("SGLang #11970",),
    ),
    _inv(
        "use_after_free",
        "a block an entry still holds is free at the same time: in the free list, handed out "
        "fresh to another request, or evicted",
        30,
        engine=("diag_engine_held_free_block", "diag_engine_tree_page_free"),
        fastcheck=("held_free_block", "tree_page_free"),
        replay=("fresh_while_held", "evict_held", "held_free_block"),
        faults={
            "fresh_while_held": "a block held by one request is allocated fresh to another",
            "evict_held": "a held block is evicted from the prefix cache",
            "held_free_block": "the engine's free list holds a block a request holds",
        },
        observed=("held_free_block",),
        plants={
            "vllm": {
                "touch_keeps_queued": "a prefix hit's `touch` leaves the block in the free queue"
            }
        },
        causes=("double_free",),
        upstream=("vLLM #37076",),
    ),
    _inv(
        "free_list",
        "the free list and the reference counts disagree: a block with no reference outside "
        "the free list, or one with references in it",
        32,
        engine=("diag_engine_free_queue_ref_cnt",),
        fastcheck=("free_queue_ref_cnt",),
        causes=("double_free", "use_after_free", "leak"),
    ),
    _inv(
        "prefix_hash",
        "a prefix-cache hit hands back a block whose content hash is not the one asked for "
        "(another prefix's KV, or the right blocks in the wrong order)",
        35,
        engine=("diag_engine_prefix_hash",),
        fastcheck=("prefix_hash",),
        replay=("prefix_hash",),
        faults={"prefix_hash": "a prefix hit asks another hash than its block's"},
        plants={
            "vllm": {
                "reversed_hit": "`get_computed_blocks` hands a hit's blocks back reversed",
                "stale_hash_entry": "an evicted block keeps its prefix-cache entry: later "
                "hits get the block, holding other content",
            }
        },
    ),
    _inv(
        "duplicate_block",
        "one block twice in one request's block table",
        40,
        engine=("diag_engine_duplicate_block",),
        fastcheck=("duplicate_block",),
        replay=("duplicate_block",),
        faults={"duplicate_block": "a request shares a block it already holds"},
        upstream=("vLLM #42571",),
    ),
    _inv(
        "freed_request_referenced",
        "an operation names a request after it was freed",
        55,
        replay=("freed_request_referenced",),
        faults={"freed_request_referenced": "tokens appended to a finished request"},
    ),
    # -- counts the engine keeps of itself -----------------------------------------------------
    _inv(
        "ref_count",
        "a block's reference count (vLLM's ref_cnt, SGLang's lock_ref) is not the number of "
        "entries holding it",
        60,
        spec=("diag_refcount_mismatch",),
        engine=("diag_engine_refcount_mismatch", "diag_engine_lock_ref"),
        fastcheck=("refcount_mismatch", "lock_ref"),
        replay=("refcount_mismatch",),
        faults={"refcount_mismatch": "the engine reports a wrong ref_cnt for a block"},
        observed=("refcount_mismatch",),
        plants={
            "vllm": {"skip_decrement": "`free_blocks` skips one shared block's decrement"},
            "sglang": {
                "lock_once": "`inc_lock_ref` leaves a second lock on a locked node uncounted"
            },
        },
        causes=("double_free", "leak", "use_after_free", "duplicate_block"),
    ),
    _inv(
        "free_count",
        "the allocator's count of free blocks is not the pool less the blocks in use",
        65,
        engine=("diag_engine_free_count",),
        fastcheck=("free_count",),
        replay=("free_count",),
        faults={"free_count": "the engine reports a wrong free-block count"},
        observed=("free_count",),
        causes=("double_free", "leak", "use_after_free"),
        upstream=("TensorRT-LLM #11879",),
    ),
    # -- addresses ----------------------------------------------------------------------------
    _inv(
        "unaligned_cpu_address",
        "a block swapped out to a CPU address that is not 256-byte aligned",
        70,
        spec=("diag_unaligned_cpu_address",),
        replay=("unaligned_cpu_address",),
        faults={"unaligned_cpu_address": "a block swapped out to an unaligned CPU address"},
    ),
    _inv(
        "overlapping_blocks",
        "two block addresses of one tier less than a block apart",
        72,
        spec=("diag_overlapping_blocks",),
    ),
    _inv(
        "conflicting_location",
        "a logical block in two places at once (two GPU bases, two CPU addresses, or "
        "resident and swapped)",
        74,
        spec=("diag_conflicting_location",),
    ),
    _inv(
        "conflicting_root",
        "a sequence with more than one block table",
        74,
        spec=("diag_conflicting_root",),
    ),
    _inv(
        "disk_block",
        "a block a request holds in a disk pool (TensorRT-LLM's tertiary pool), where no spec "
        "tier reaches it",
        76,
        engine=("diag_engine_disk_block",),
        fastcheck=("disk_block",),
    ),
    # -- tokens: consequences of the above, or of the engine's own bookkeeping ----------------
    _inv(
        "stale_token",
        "a token resolves to a block that changed hands since the token was written",
        80,
        replay=("stale_token",),
        causes=("use_after_free", "double_free", "prefix_hash"),
    ),
    _inv(
        "unresolved_token",
        "a token with no block: a page fault (a token inside its group's window without one)",
        85,
        spec=("diag_unresolved_token",),
        engine=("diag_engine_unresolved_token",),
        fastcheck=("unresolved_token",),
        replay=("unresolved_token",),
        faults={"unresolved_token": "tokens appended past the request's last block"},
        plants={
            "vllm": {
                "window_free_inside": "a sliding window's `remove_skipped_blocks` frees a "
                "block still inside the window (`--kind sliding`)"
            },
            "sglang": {
                "swa_free_inside_window": "`free_swa_out_of_window_slots` measures the "
                "window a page short and frees an SWA page still inside it (`--kind swa`, "
                "`pure_swa`)"
            },
        },
        causes=("double_free", "leak", "use_after_free", "outside_pool"),
    ),
    _inv(
        "hit_length_mismatch",
        "a prefix hit whose length differs between the KV-cache groups of one lookup (a "
        "hybrid model's groups must reuse the same tokens)",
        86,
        replay=("hit_length_mismatch",),
    ),
    _inv(
        "token_decomposition",
        "a token whose (block index, offset) does not give back its position, or has two",
        88,
        spec=("diag_token_decomposition",),
    ),
    _inv(
        "slot_page_offset",
        "a token's flat KV slot is not at its position's offset in its page (SGLang)",
        88,
        engine=("diag_engine_slot_page_offset",),
        fastcheck=("slot_page_offset",),
    ),
    _inv(
        "csr_row",
        "a CSR page table row that goes backwards, or a last page length outside the page "
        "(FlashInfer)",
        88,
        engine=("diag_engine_csr_row",),
        fastcheck=("csr_row",),
    ),
    # -- prefix-cache events (hash level: no block ids) ---------------------------------------
    _inv(
        "unknown_removal",
        "a removal event (BlockRemoved, or an update) names a hash that is not stored",
        90,
        live=("unknown_removal",),
        causes=("sequence_gap",),
    ),
    _inv(
        "unknown_parent",
        "a stored chain (BlockStored) names a parent hash that is not stored",
        90,
        live=("unknown_parent",),
        causes=("sequence_gap",),
    ),
    _inv(
        "sequence_gap",
        "the sequence numbers of an event stream skip or step back: events were lost",
        5,
        live=("sequence_gap",),
    ),
    _inv(
        "after_clear",
        "an event names a hash that an AllBlocksCleared dropped",
        90,
        live=("after_clear",),
    ),
    # -- a fleet: what a router's index (or a replica's events) claims against the truth -----
    _inv(
        "false_residency",
        "a replica's events, or a router's index, claim a block past the replica dropping "
        "it, longer than the lag tolerance (a lost removal, a restart without a clear, a "
        "clear ignored)",
        92,
        fleet=("false_residency",),
        upstream=("llm-d-router #2853", "TensorRT-LLM #16335"),
    ),
    _inv(
        "missed_residency",
        "a replica holds a block that its events, or a router's index, do not claim, longer "
        "than the lag tolerance (a lost store, a duplicate copy's removal)",
        92,
        fleet=("missed_residency",),
        upstream=("vLLM #55092", "llm-d-kv-cache #372"),
    ),
    _inv(
        "prefix_false_hit",
        "a router predicted a longer prefix on the replica it chose than a lookup there hits "
        "(the prediction cut to num_tokens - 1 as vLLM cuts a full hit)",
        94,
        fleet=("prefix_false_hit",),
        causes=("false_residency", "missed_residency"),
        upstream=("llm-d-router #2362", "Dynamo #8751"),
    ),
    _inv(
        "misroute",
        "a router chose, by prefix, a replica whose true hit is shorter than another's",
        95,
        fleet=("misroute",),
        causes=("false_residency", "missed_residency"),
        upstream=("smg #2394", "Dynamo #14103"),
    ),
)

BY_NAME: Mapping[str, Invariant] = MappingProxyType({i.name: i for i in CATALOGUE})


def _by_check() -> dict[tuple[str, str], Invariant]:
    out: dict[tuple[str, str], Invariant] = {}
    for inv in CATALOGUE:
        for model, names in inv.checks.items():
            for name in names:
                out[(model, name)] = inv
    return out


_BY_CHECK = _by_check()


def idea_of(model: str, check: str) -> Invariant:
    """The idea a model's check checks; a KeyError for a check the catalogue does not
    name (tests/test_invariants.py holds every check of every model to a line here)."""
    return _BY_CHECK[(model, check)]


def rank_of(model: str, check: str) -> int:
    """The order of a check's findings at one step (unknown checks last)."""
    inv = _BY_CHECK.get((model, check))
    return 1000 if inv is None else inv.rank


def checks(model: str) -> Iterator[tuple[str, Invariant]]:
    """Every check of ``model`` with its idea, in the catalogue's order."""
    for inv in CATALOGUE:
        for name in inv.checks.get(model, ()):
            yield name, inv


def faults() -> dict[str, str]:
    """Every ``synth-log`` fault and what it plants, in the catalogue's order."""
    return {f: what for inv in CATALOGUE for f, what in inv.faults.items()}


def plants(engine: str) -> dict[str, str]:
    """Every ``fuzz`` plant of ``engine`` and what it does, in the catalogue's order."""
    return {p: what for inv in CATALOGUE for p, what in inv.plants.get(engine, {}).items()}


def planted_by(kind: str, name: str, engine: str = "") -> Invariant:
    """The idea a ``synth-log`` fault (``kind`` "fault") or a ``fuzz`` plant of ``engine``
    (``kind`` "plant") plants."""
    for inv in CATALOGUE:
        found = inv.faults if kind == "fault" else inv.plants.get(engine, {})
        if name in found:
            return inv
    raise KeyError(name)


def observed_faults() -> tuple[str, ...]:
    """The ``synth-log`` faults that falsify what the engine reports of itself (its ref_cnt,
    its free count, its free list): planted in the step's observation, after it is taken."""
    return tuple(f for inv in CATALOGUE for f in inv.observed)


def name_of(model: str, check: str) -> str:
    """How a check is printed everywhere: its idea, then the model's check when that has
    another name (``leak (diag_engine_leak)``; ``double_free``); a check the catalogue does
    not know (an engine newer than this package) by its own name."""
    inv = _BY_CHECK.get((model, check))
    if inv is None or inv.name == check:
        return check
    return f"{inv.name} ({check})"


# -- the one check type ------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One check of one model: a view of sql/constraints.sql or sql/engines.sql (``check``),
    a query of sql/replay.sql (``replay``); its idea is ``idea_of(model, name)``."""

    name: str
    severity: str  # "error" (the spec's constraints) or "warning"
    description: str
    relation: str | None = None  # the relation a spec constraint is about
    model: str = SPEC

    @property
    def invariant(self) -> str:
        """The catalogue's name of the idea it checks (its own name when unknown)."""
        inv = _BY_CHECK.get((self.model, self.name))
        return self.name if inv is None else inv.name


# -- the names checks and faults had before each took its idea's one word ----------------------
# Kept for one release: the old views stay as views over the new (users query them from the
# DuckDB shell; `check` does not run them twice), and `synth-log --fault` takes the old names.
RENAMED_VIEWS: Mapping[str, str] = MappingProxyType(
    {
        "diag_engine_slot_outside_pool": "diag_engine_outside_pool",
        "diag_engine_free_queue_duplicate": "diag_engine_free_list_duplicate",
        "diag_engine_page_conservation": "diag_engine_leak",
        "diag_engine_block_hash_mismatch": "diag_engine_prefix_hash",
        "diag_engine_ref_cnt_mismatch": "diag_engine_refcount_mismatch",
        "diag_engine_group_token_missing": "diag_engine_unresolved_token",
    }
)
RENAMED_FAULTS: Mapping[str, str] = MappingProxyType(
    {
        "block_outside_pool": "outside_pool",
        "prefix_hash_mismatch": "prefix_hash",
        "duplicate_in_request": "duplicate_block",
        "ref_cnt_mismatch": "refcount_mismatch",
        "free_count_mismatch": "free_count",
    }
)
