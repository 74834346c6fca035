"""The GPU tier's scenario on the CPU (tests/gpu/attention.py): every layout and page size
imported, exported as FlashInfer's arrays, and attention over those arrays with
FlashInfer's semantics (torch, in place of the kernel) equal to attention over the bytes at
the project's addresses; a planted page swap caught for exactly its two requests. The
kernel call itself runs in tests/gpu (`make test-gpu`)."""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def scenario() -> Any:
    """The scenario module: it needs torch (the engines tier's venv; there, torch missing is
    an error, not a skip)."""
    if os.environ.get("PAGEDKV_ENGINES_TIER") != "1":
        pytest.importorskip("torch")
    from ..gpu import attention

    return attention


@pytest.mark.parametrize("page_size", [1, 16, 32])
@pytest.mark.parametrize(
    "layout",
    ["flashinfer NHD", "flashinfer HND", "K, V pair NHD", "K, V pair HND", "vllm", "sglang"],
)
def test_flashinfer_semantics_read_every_token_at_its_address(
    scenario: Any, layout: str, page_size: int
) -> None:
    assert (layout, page_size) in [(x, p) for x in scenario.LAYOUTS for p in scenario.PAGE_SIZES]
    state = scenario.build(layout, page_size, scenario.Shape(), "cpu")
    figures = scenario.run(state, scenario.TorchKernel())
    assert figures.vectors == 2 * 2 * figures.tokens * state.shape.kv_heads  # 2 layers, K and V
    assert figures.decode_error <= scenario.ATOL < figures.caught


def test_a_wrong_address_is_caught_before_any_attention(scenario: Any, monkeypatch: Any) -> None:
    """The reference reads only the bytes at the project's addresses: an address off by one
    slot makes the bit-for-bit comparison with the tensor's own indexing fail."""
    state = scenario.build("flashinfer HND", 16, scenario.Shape(requests=3), "cpu")
    real = scenario.Memory.read

    def shifted(self: Any, addresses: Any, size: int) -> Any:
        return real(self, addresses + state.shape.head_dim * 2, size)

    monkeypatch.setattr(scenario.Memory, "read", shifted)
    with pytest.raises(AssertionError, match="flashinfer HND"):
        scenario.run(state, scenario.TorchKernel())
