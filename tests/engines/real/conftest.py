"""The real-engine tier: vLLM 0.32.0 and SGLang 0.5.21 driven on the CPU
(`make test-engines`, requirements/engines.txt, docs/engines.md).

Every test here is marked ``engines``. Outside the tier's venv the engines are missing and
the tests skip; inside it (``PAGEDKV_ENGINES_TIER=1``, set by the make target) a missing
engine is an error, so the tier can never pass by skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ENGINE_CODE = r"(torch|vllm|sglang|transformers|triton)\b"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.engines)
            # the engines' own deprecations (torch.jit, ...) are theirs, not ours
            item.add_marker(pytest.mark.filterwarnings(f"ignore::DeprecationWarning:{ENGINE_CODE}"))
            item.add_marker(pytest.mark.filterwarnings(f"ignore::FutureWarning:{ENGINE_CODE}"))
