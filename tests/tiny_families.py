"""The suite's tiny model factory: a thin re-export of :mod:`captum_iglens.testing.tiny`.

Hidden size 64, 2 blocks, vocabulary 128, perturbed norm weights and biases and, where the
family has them, non-trivial soft-cap / scale / multiplier values, so that a readout that
skips one of them fails Invariant R. One copy lives in the package (``tiny_causal_lm``).
"""

from __future__ import annotations

from captum_iglens.testing.tiny import (  # noqa: F401
    FAMILY_NAMES,
    N_BLOCKS,
    SPECS,
    _llama_like,
    make_family,
)
