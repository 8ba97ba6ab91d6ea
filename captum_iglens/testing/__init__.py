"""Test helpers for IG-Lens: assertions, tiny offline models and a pytest plugin.

A comparison test of IG-Lens against Captum's layer methods, on every tiny family, in a
few lines (``pytest --iglens-families llama,gpt2,gemma2`` picks the families)::

    import torch

    from captum_iglens import IGLens
    from captum_iglens.testing import (assert_complete, assert_readout_exact,
                                       assert_telescopes_like_captum)

    def test_iglens_adds_up_where_captum_does_not(iglens_tiny_model):
        model, tokenizer = iglens_tiny_model
        ids = tokenizer("w1 w2 w3 w4 w5 w6", return_tensors="pt").input_ids
        assert_readout_exact(model, ids)                       # Invariant R
        assert_complete(IGLens(model).attribute_details(ids))  # Proposition 1
        check = assert_telescopes_like_captum(
            model, ids, layers=[0, 1, 2], reference_ids=torch.full_like(ids, 3), n_steps=8)
        assert (check["layer_integrated_gradients"] > 0.5 * check.total.abs()).all()

Every tolerance is derived from floating-point rounding of the quantities compared, not a
constant (arXiv:2606.29693, Proposition 1 and Invariant R; Higham 2002, section 4.2).

- :func:`assert_complete`: credits add up to ``delta_p``.
- :func:`assert_readout_exact`: the lens readout of ``h_n`` is the model's distribution.
- :func:`assert_telescopes_like_captum`: IG-Lens's total is each Captum layer run's own
  ``F(x) - F(x')``; returns every method's completeness gap.
- :func:`tiny_causal_lm` / :data:`FAMILIES`: tiny perturbed-norm models of every verified
  family with an in-memory word-level tokenizer, offline.
- The pytest plugin (:mod:`captum_iglens.testing.plugin`, registered under ``pytest11``):
  fixtures ``iglens_tiny_model``, ``iglens_smollm2`` and the ``--iglens-families`` option.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> its module, imported on first use (PEP 562): the pytest plugin loads with
#: pytest itself, in every session, and must not import torch there.
_EXPORTS = {
    "TelescopeCheck": "captum_iglens.testing._captum",
    "assert_telescopes_like_captum": "captum_iglens.testing._captum",
    "assert_complete": "captum_iglens.testing._complete",
    "assert_readout_exact": "captum_iglens.testing._readout",
    "word_tokenizer": "captum_iglens.testing._tokenizer",
    "FAMILIES": "captum_iglens.testing.tiny",
    "make_family": "captum_iglens.testing.tiny",
    "perturb_norms": "captum_iglens.testing.tiny",
}

if TYPE_CHECKING:  # the names as a type checker sees them
    from torch import nn

    from captum_iglens.testing._captum import TelescopeCheck, assert_telescopes_like_captum
    from captum_iglens.testing._complete import assert_complete
    from captum_iglens.testing._readout import assert_readout_exact
    from captum_iglens.testing._tokenizer import word_tokenizer
    from captum_iglens.testing.tiny import FAMILIES, make_family, perturb_norms

__all__ = [
    "FAMILIES",
    "TelescopeCheck",
    "assert_complete",
    "assert_readout_exact",
    "assert_telescopes_like_captum",
    "make_family",
    "perturb_norms",
    "tiny_causal_lm",
    "word_tokenizer",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, with the module's own."""
    return sorted(set(globals()) | set(__all__))


def tiny_causal_lm(
    family: str = "llama",
    *,
    n_layers: int = 2,
    hidden: int = 64,
    vocab: int = 128,
    seed: int = 0,
    perturb_norms: bool = True,
) -> tuple[nn.Module, Any]:
    """A tiny random causal LM of ``family`` and a word-level tokenizer, built offline.

    The model has perturbed norms (weights ``1 + 0.5 N(0, 1)``, biases ``+ 0.3 N(0, 1)``),
    a perturbed head bias where there is one, and non-trivial soft-cap / logit-scale /
    multiplier values where the family has them, so that a readout missing any of them
    fails :func:`assert_readout_exact`. The tokenizer (built in memory, no files) maps
    ``<pad> <bos> <eos> <unk>`` to ids 0-3 and ``w0, w1, ...`` to ids 4, 5, ...; text is
    split on whitespace (``"w1 w2"``).

    Args:
        family (str, optional): One of :data:`FAMILIES`. Default: ``"llama"``.
        n_layers (int, optional): Keyword-only. Decoder blocks. Default: 2.
        hidden (int, optional): Keyword-only. Hidden size, a multiple of 16. Default: 64.
        vocab (int, optional): Keyword-only. Vocabulary size (>= 16). Default: 128.
        seed (int, optional): Keyword-only. Seeds the weights. Default: 0.
        perturb_norms (bool, optional): Keyword-only. Perturb the norms and head bias.
            Default: True (False leaves random-init norms, which hide a missing norm).

    Returns:
        tuple: ``(model, tokenizer)``, the ``*ForCausalLM`` in eval mode (float32, CPU) and
        its ``PreTrainedTokenizerFast``.

    Raises:
        ValueError: an unknown family or sizes out of range.
        ImportError: this transformers version lacks the family.
    """
    from captum_iglens.testing._tokenizer import word_tokenizer
    from captum_iglens.testing.tiny import make_family

    model = make_family(family, seed=seed, n_blocks=n_layers, hidden=hidden, vocab=vocab,
                        perturb=perturb_norms)
    return model.eval(), word_tokenizer(vocab)
