"""Small snapshots of each engine and FlashInfer's CSR arrays, shared by the engine tests."""

from __future__ import annotations

import numpy as np

from .test_invariants import BLOCK

# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- the engine modules' import checks -----------------------------------------------------
# (from tests/engines/test_mutation_kills_engines.py)


def csr_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([0, 2, 3], np.int32),
        np.array([5, 7, 2], np.int32),
        np.array([3, BLOCK], np.int32),
    )
