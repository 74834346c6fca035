"""A fleet of replicas behind KV-aware routers (docs/fleet.md). ``sim`` runs N real vLLM
KVCacheManagers behind Dynamo's RadixTree and a built-in approximate router and writes the
fleet directory (``trace``: the workload; ``routers``; ``replica``: one replica's manager
and scheduling; ``plants``: the faults it can put in); vLLM and Dynamo load when a run
starts, nothing here imports them. ``check(db, directory, lag=...)`` reads a fleet directory
into the tables of sql/fleet.sql and finds where each replica's events disagree with what it
held, and where a router's index disagrees with the events; the ``FleetReport`` it returns
holds the summary a router and the findings."""

from __future__ import annotations

import importlib
from typing import Any

_CHECK = ("DEFAULT_LAG", "FleetFinding", "FleetReport", "check")


def __getattr__(name: str) -> Any:
    # the checker (DuckDB, pyarrow) loads on first use: `fleet --help` and `fleet sim`'s
    # option list import this package for the plants' names only. The submodule is named
    # `checker`, not `check`, so that importing it can never bind the package's `check`.
    if name not in _CHECK:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(".checker", __name__)
    for n in _CHECK:
        globals()[n] = getattr(module, n)
    return globals()[name]


__all__ = list(_CHECK)
