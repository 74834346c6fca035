"""Small snapshots of each engine and FlashInfer's CSR arrays, shared by the engine tests."""

from __future__ import annotations

import numpy as np

from .helpers import BLOCK


def csr_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([0, 2, 3], np.int32),
        np.array([5, 7, 2], np.int32),
        np.array([3, BLOCK], np.int32),
    )
