"""The faults ``fleet sim --plant`` puts into a fleet (docs/fleet.md, "Plants"), each from
an open report, each recorded in fleet.json's ``plant_detail`` (the replica, step and
sequence number it struck) so a check can be held to finding exactly it:

- ``dropped_batch``: one event batch of a replica never reaches the routers nor its
  events file (a sequence gap);
- ``restart_without_replay``: a replica restarts (its requests preempted, its prefix cache
  emptied) and no AllBlocksCleared is published;
- ``clear_ignored``: a replica clears its prefix cache, publishes AllBlocksCleared, and the
  routers drop it;
- ``duplicate_copy_removal``: exact retries of block-aligned prompts, so vLLM computes a
  second physical copy of a prompt's last block and, evicting the older one, publishes
  BlockRemoved while the other copy stays (vllm #55092);
- ``hash_wrong_end``: every replica's events carry hashes folded from the digest's FIRST 8
  bytes instead of vLLM's published last 8;
- ``sliding_window_as_prefix`` (a kind with a sliding-window group): the window group's
  events are indexed as a prefix beside the full-attention group's.

- ``dp_ranks_merged``: the replicas are paired as two data-parallel ranks of one worker
  (r0, r1: worker 0 ranks 0, 1; ...), and the routers are fed both ranks' events as rank 0.

``attention_mamba_collision`` is named and refused: not built (a Mamba group's step log
cannot be replayed, so the fleet has no truth to hold it to)."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..hashes import first8

PLANTS = (
    "dropped_batch",
    "restart_without_replay",
    "clear_ignored",
    "duplicate_copy_removal",
    "dp_ranks_merged",
    "sliding_window_as_prefix",
    "attention_mamba_collision",
    "hash_wrong_end",
)
NOT_BUILT = ("attention_mamba_collision",)
# the plants that fault what a router is fed: without an event-fed router they show nothing
NEEDS_DYNAMO = (
    "dropped_batch",
    "restart_without_replay",
    "clear_ignored",
    "sliding_window_as_prefix",
    "hash_wrong_end",
    "dp_ranks_merged",
)
RETRIES = 12  # duplicate_copy_removal: the exact retries it sends


def refuse(plant: str | None, kind: str, windowed: bool) -> None:
    """A UsageError for a plant this run cannot carry (nothing is run)."""
    if plant is None:
        return
    if plant not in PLANTS:
        raise UsageError(f"no plant {plant!r}", hint=f"one of {', '.join(PLANTS)}")
    if plant in NOT_BUILT:
        raise UsageError(
            f"--plant {plant} is not built yet: nothing was run",
            hint=f"one of {', '.join(p for p in PLANTS if p not in NOT_BUILT)}",
        )
    if plant == "sliding_window_as_prefix" and not windowed:
        raise UsageError(
            f"--plant {plant} indexes a sliding-window group, which --kind {kind} does not have",
            hint="--kind hybrid or --kind sliding",
        )


class Plant:
    """One plant's state over a run: ``start`` is the step from which it may strike (the
    arrival of the workload's third part); ``detail`` what it did."""

    def __init__(self, name: str | None, start: int, target: str) -> None:
        self.name = name
        self.start = start
        self.target = target  # the replica it strikes
        self.detail: dict[str, Any] | None = None
        self.retries_left = RETRIES if name == "duplicate_copy_removal" else 0

    @property
    def done(self) -> bool:
        return self.detail is not None

    def restarts(self, n: int, replica: str) -> bool:
        """Whether the target replica restarts (or clears) before its step ``n``."""
        return (
            self.name in ("restart_without_replay", "clear_ignored")
            and not self.done
            and replica == self.target
            and n >= self.start
        )

    def published(
        self, n: int, replica: str, events: list[Any], seq: int, restarted: bool
    ) -> tuple[list[Any], list[Any], bool]:
        """What of a replica's events is written to its file and what reaches the routers
        (as the plant lets them), and whether the batch keeps its sequence number."""
        kind = self.name
        strikes = kind == "dropped_batch" and not self.done and replica == self.target
        if strikes and n >= self.start and any(type(e).__name__ == "BlockStored" for e in events):
            self.detail = {"replica": replica, "step": n, "seq": seq}
            return [], [], True
        if restarted:
            cleared = [e for e in events if type(e).__name__ == "AllBlocksCleared"]
            rest = [e for e in events if type(e).__name__ != "AllBlocksCleared"]
            self.detail = {"replica": replica, "step": n, "seq": seq if cleared else None}
            if kind == "restart_without_replay":
                self.detail["seq"] = seq if rest else None
                return rest, rest, bool(rest)
            return events, rest, True
        return events, events, bool(events)

    def wrong_end(self, events: list[Any], digests: dict[int, bytes]) -> None:
        """hash_wrong_end: each event's hashes folded from the digest's first 8 bytes."""

        def fold(h: Any) -> Any:
            digest = digests.get(h) if isinstance(h, int) else None
            return h if digest is None else first8(digest)

        for e in events:
            if hasattr(e, "block_hashes"):
                e.block_hashes = [fold(h) for h in e.block_hashes]
            if getattr(e, "parent_block_hash", None) is not None:
                e.parent_block_hash = fold(e.parent_block_hash)

    def duplicate_removed(self, n: int, replica: str, seq: int, removed: list[int]) -> None:
        """duplicate_copy_removal: the first removal of a hash the replica still holds."""
        if self.name == "duplicate_copy_removal" and not self.done and n >= self.start and removed:
            self.detail = {"replica": replica, "step": n, "seq": seq, "hash": removed[0]}


def duplicate_removals(events: list[Any], held: set[int]) -> list[int]:
    """The hashes a batch's BlockRemoved events remove while the replica still holds them
    (another physical copy: vllm #55092) and does not store again in the same batch."""
    out: list[int] = []
    for i, e in enumerate(events):
        if type(e).__name__ != "BlockRemoved":
            continue
        later = {
            h for s in events[i + 1 :] if type(s).__name__ == "BlockStored" for h in s.block_hashes
        }
        out.extend(h for h in e.block_hashes if h in held and h not in later)
    return out
