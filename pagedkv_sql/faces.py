"""Each serving engine's face: its name and every part pagedkv-sql has for it, named once.

A part is an import path (``"module"`` or ``"module:attribute"``), never an import, so that
this module costs nothing at start-up (standard library only) and sits below every
capability: the registries that list engines (``engines.registry.ENGINES``, the engines
``export`` writes, the event layouts ``kv-events`` reads, the CLI's engine names, the fuzzed
engines of the docs' tables) are derived from ``ENGINES`` here. ``part(path)`` imports a
part when it is wanted. A new engine is one ``Engine`` below and the modules it names
(docs/architecture.md, "A new engine")."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Engine:
    """One serving engine and its parts; a part it does not have is None."""

    name: str  # as the CLI, a snapshot's metadata and the step log spell it
    title: str  # as people write it
    state: str  # the state reader: `to_state(snapshot)`, the snapshot's arrays as relations
    capture: str  # a snapshot of what the engine holds: its live objects, or the arrays its
    # kernels are handed (attributes only, no engine import)
    schema: str  # the metadata schema: engines/meta.py's SCHEMAS, under `name`
    exporter: str | None = None  # the stored relations as the engine's own arrays (`export`)
    recorder: str | None = None  # the step-log recorder of a running engine (`replay`)
    fuzz: str | None = None  # the fuzz driver over its real KV manager (`fuzz ENGINE`)
    event_layout: bool = False  # its tagged-array KV events have a field order of their own


SCHEMAS = "pagedkv_sql.engines.meta:SCHEMAS"

ENGINES: tuple[Engine, ...] = (
    Engine(
        name="vllm",
        title="vLLM",
        state="pagedkv_sql.engines.vllm",
        capture="pagedkv_sql.engines.vllm:capture",
        schema=SCHEMAS,
        exporter="pagedkv_sql.engines.export:vllm",
        recorder="pagedkv_sql.replay.record_vllm",
        fuzz="pagedkv_sql.fuzz.vllm",
        event_layout=True,
    ),
    Engine(
        name="sglang",
        title="SGLang",
        state="pagedkv_sql.engines.sglang",
        capture="pagedkv_sql.engines.sglang:capture",
        schema=SCHEMAS,
        recorder="pagedkv_sql.replay.record_sglang",
        fuzz="pagedkv_sql.fuzz.sglang",
        event_layout=True,
    ),
    Engine(
        name="flashinfer",
        title="FlashInfer",
        state="pagedkv_sql.engines.flashinfer",
        capture="pagedkv_sql.engines.flashinfer:capture",
        schema=SCHEMAS,
        exporter="pagedkv_sql.engines.export:flashinfer",
    ),
    Engine(
        name="trtllm",
        title="TensorRT-LLM",
        state="pagedkv_sql.engines.trtllm",
        capture="pagedkv_sql.engines.trtllm:snapshot",
        schema=SCHEMAS,
    ),
)
BY_NAME: dict[str, Engine] = {e.name: e for e in ENGINES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
EXPORTS: tuple[str, ...] = tuple(sorted(e.name for e in ENGINES if e.exporter))  # as `export`
FUZZED: tuple[str, ...] = tuple(e.name for e in ENGINES if e.fuzz)
EVENT_LAYOUTS: tuple[str, ...] = tuple(e.name for e in ENGINES if e.event_layout)


def part(path: str) -> Any:
    """The module or attribute an import path names, imported now."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded
