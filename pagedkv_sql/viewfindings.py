"""A check's view row as the house's finding: which requests and blocks each view of
sql/constraints.sql and sql/engines.sql names, declared once per view (``VIEW_IDS``), and the
row read through that declaration (``view_finding``). Standard library only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .invariants import Check

# Which requests and blocks each view's row names: (request columns, block columns), declared
# once per view of sql/constraints.sql and sql/engines.sql (tests/test_check.py holds every view
# to a line here, each column to the view's). A request column is ``request_id`` (one id),
# ``request_ids`` (ids separated by spaces), ``seq_id`` or ``block_table_id`` (a sequence, named
# by its request where a capability labels it: ``pagedkv_request_label``) or ``held_by``
# (``block_table_id:block_index`` holders, by spaces); a block column is ``block_id`` (a block or
# page of its pool) or ``physical_block_base`` (the spec's block: a base is 256-byte aligned
# and a block 256 slots wide, so the block is base // 256).
VIEW_IDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "spec_unaligned_base": (("block_table_id",), ()),
    "spec_offset_out_of_block": (("seq_id",), ()),
    "spec_negative_refcount": (("block_table_id",), ("physical_block_base",)),
    "diag_refcount_mismatch": (("held_by",), ("physical_block_base",)),
    "diag_conflicting_location": (("block_table_id",), ()),
    "diag_conflicting_root": (("seq_id",), ()),
    "diag_orphan_block_table": (("block_table_id",), ()),
    "diag_orphan_swapped_block": (("block_table_id",), ()),
    "diag_overlapping_blocks": ((), ()),
    "diag_token_decomposition": (("seq_id",), ()),
    "diag_unaligned_cpu_address": (("block_table_id",), ()),
    "diag_unresolved_token": (("seq_id",), ()),
    "diag_engine_refcount_mismatch": (("request_ids",), ("block_id",)),
    "diag_engine_free_queue_ref_cnt": ((), ("block_id",)),
    "diag_engine_held_free_block": (("request_id",), ("block_id",)),
    "diag_engine_duplicate_block": (("request_id",), ("block_id",)),
    "diag_engine_free_list_duplicate": ((), ("block_id",)),
    "diag_engine_free_count": ((), ()),
    "diag_engine_disk_block": (("request_id",), ("block_id",)),
    "diag_engine_outside_pool": (("request_id",), ("block_id",)),
    "diag_engine_slot_page_offset": (("request_id",), ()),
    "diag_engine_csr_row": (("request_id",), ()),
    "diag_engine_prefix_hash": (("request_id",), ("block_id",)),
    "diag_engine_leak": (("request_ids",), ("block_id",)),
    "diag_engine_tree_page_free": ((), ("block_id",)),
    "diag_engine_lock_ref": (("request_ids",), ("block_id",)),
    "diag_engine_unresolved_token": (("request_id",), ()),
}
SEQUENCE_COLUMNS = ("seq_id", "block_table_id", "held_by")


@dataclass(frozen=True)
class ViewFinding:
    """One row of a check's view as the house's finding (``findings.Finding``): the requests
    and blocks its view declares (``VIEW_IDS``), its reason the message, the row's other
    columns its own fields."""

    check: str
    model: str
    message: str
    request_ids: tuple[str, ...]
    block_ids: tuple[int, ...]
    row: Mapping[str, Any]
    where: str = ""  # a state: no step
    cause: str | None = None

    def extra(self) -> dict[str, Any]:
        return dict(self.row)


def sequences(view: str, row: Mapping[str, Any]) -> list[int]:
    """The sequences (seq_id or block_table_id) a row names in its declared columns."""
    out: list[int] = []
    for column in VIEW_IDS.get(view, ((), ()))[0]:
        value = row.get(column)
        if column == "held_by" and isinstance(value, str):
            out += [int(h.partition(":")[0]) for h in value.split() if h.partition(":")[0]]
        elif column in SEQUENCE_COLUMNS and isinstance(value, int):
            out.append(value)
    return out


def view_finding(
    check: Check, row: Mapping[str, Any], labels: Mapping[int, str] | None = None
) -> ViewFinding:
    """A view's row as a finding: its requests and blocks from the columns ``VIEW_IDS``
    declares for the view (none for a view it does not declare), a sequence named by its
    request where ``labels`` (seq_id -> request id) has one."""
    requests_from, blocks_from = VIEW_IDS.get(check.name, ((), ()))
    requests: list[str] = []
    for column in requests_from:
        value = row.get(column)
        if column == "request_id" and value is not None:
            requests.append(str(value))
        elif column == "request_ids" and isinstance(value, str):
            requests += value.split()
    requests += [labels[s] for s in sequences(check.name, row) if labels and s in labels]
    blocks: list[int] = []
    for column in blocks_from:
        value = row.get(column)
        if isinstance(value, int):
            blocks.append(value // 256 if column == "physical_block_base" else value)
    fields = {k: v for k, v in row.items() if k != "reason"}
    return ViewFinding(
        check.name,
        check.model,
        str(row.get("reason", "")),
        tuple(dict.fromkeys(requests)),
        tuple(dict.fromkeys(blocks)),
        fields,
    )
