"""The report tier: real matplotlib and plotly, and a real headless Chromium (Debian's
`chromium`, driven by Playwright without a browser download of its own). `make test-report`
installs them all; every test here carries the `report` marker and runs there."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick suite deselects this tier (-m "not report"); it need not even import it,
    so that it runs without the report extra installed."""
    if re.search(r"\bnot\s+report\b", config.getoption("markexpr") or ""):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.report)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield b
        b.close()
