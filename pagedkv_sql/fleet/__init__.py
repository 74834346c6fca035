"""A fleet behind a KV-aware router, checked (docs/fleet.md): ``check(db, directory,
lag=...)`` reads a fleet directory into the tables of sql/fleet.sql and finds where each
replica's events disagree with what it held, and where a router's index disagrees with the
events; the ``FleetReport`` it returns holds the summary a router and the findings."""

from __future__ import annotations

from .check import DEFAULT_LAG, FleetFinding, FleetReport, check

__all__ = ["DEFAULT_LAG", "FleetFinding", "FleetReport", "check"]
