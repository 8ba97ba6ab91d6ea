"""Every import of a Captum-private name, in one place.

Captum's approximation rules (step sizes and alphas of ``riemann_*`` and ``gausslegendre``),
its LLM token prettifier and its interpretable-input base class are not part of Captum's
public API; if a Captum release moves them, this is the one module to change.
"""

from __future__ import annotations

from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens
from captum.attr._utils.approximation_methods import (
    SUPPORTED_METHODS as CAPTUM_APPROXIMATION_METHODS,
)
from captum.attr._utils.approximation_methods import approximation_parameters
from captum.attr._utils.interpretable_input import InterpretableInput

__all__ = [
    "CAPTUM_APPROXIMATION_METHODS",
    "InterpretableInput",
    "approximation_parameters",
    "convert_ids_to_pretty_tokens",
]

convert_ids_to_pretty_tokens = _convert_ids_to_pretty_tokens
