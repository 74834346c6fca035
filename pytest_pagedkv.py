"""pagedkv-sql's pytest plugin for engines' own test suites (entry point ``pytest11``,
loaded by every pytest run wherever pagedkv-sql is installed): the fixture
``kv_consistency`` checks every KV-cache manager a test registered with it once the test is
done, with ``assert_consistent`` (docs/engines.md, "assert_consistent").

A module of its own beside the package, so that loading the plugin imports nothing of
pagedkv-sql (the package pulls in DuckDB and pyarrow) until a test checks a manager.
``-p no:pagedkv_sql`` (the entry point's name) or ``-p no:pytest_pagedkv`` (the module's)
disables it.

    def test_preemption(kv_consistency):
        manager = make_manager()
        kv_consistency.vllm(manager, scheduler.requests)
        ...  # the test drives the manager; its state is checked at teardown
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def _now(value: Any) -> Any:
    """An argument given as a callable is read when the check runs."""
    return value() if callable(value) else value


class KVConsistency:
    """The managers one test registered; ``check()`` checks them all now (and the fixture
    does at teardown)."""

    def __init__(self) -> None:
        self._checks: list[Callable[[], None]] = []

    def vllm(self, kv_cache_manager: Any, requests: Any = None) -> None:
        """Check this vLLM ``KVCacheManager`` after the test. ``requests``: the
        scheduler's ``requests`` dict (or a list of ``Request``s, or a callable giving
        either), read at check time."""

        def check() -> None:
            from pagedkv_sql.engines import vllm

            vllm.assert_consistent(kv_cache_manager, _now(requests))

        self._checks.append(check)

    def sglang(
        self,
        req_to_token_pool: Any,
        allocator: Any,
        tree_cache: Any = None,
        *,
        reqs: Any = None,
        seq_lens: Any = None,
        request_ids: Any = None,
    ) -> None:
        """Check SGLang's pools after the test: ``reqs`` (``Req`` objects) or ``seq_lens``
        ({row: tokens}) with ``request_ids``, each possibly a callable, read at check
        time; give ``tree_cache`` to account for every page."""

        def check() -> None:
            from pagedkv_sql.engines import sglang

            sglang.assert_consistent(
                req_to_token_pool,
                allocator,
                tree_cache,
                reqs=_now(reqs),
                seq_lens=_now(seq_lens),
                request_ids=_now(request_ids),
            )

        self._checks.append(check)

    def check(self) -> None:
        """Check every registered manager now (an ``AssertionError`` names what is wrong)."""
        for check in self._checks:
            check()


class Plugin:
    """What the plugin gives a pytest run: the fixture ``kv_consistency``, held apart from
    the module so that it is registered only when neither of the plugin's names is blocked
    (pytest blocks an entry point by its own name only)."""

    @pytest.fixture
    def kv_consistency(self) -> Iterator[KVConsistency]:
        """Register KV-cache managers; each is checked with ``assert_consistent`` when the
        test is done (a failure there is reported as an error at teardown)."""
        checker = KVConsistency()
        yield checker
        checker.check()


NAMES = ("pagedkv_sql", "pytest_pagedkv")  # the entry point's name, the module's


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """The first hook a plugin gets, as it is registered: the fixture, unless ``-p
    no:pagedkv_sql`` or ``-p no:pytest_pagedkv`` blocked the plugin."""
    if any(pluginmanager.is_blocked(name) for name in NAMES):
        return
    if pluginmanager.get_plugin(NAMES[1]) is not None:
        # `-p pytest_pagedkv` registered this module by its own name: the entry point
        # would register it a second time (pluggy refuses a plugin twice)
        pluginmanager.set_blocked(NAMES[0])
    pluginmanager.register(Plugin(), f"{NAMES[1]}.fixtures")
