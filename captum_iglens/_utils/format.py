"""Small formatting helpers shared by the result objects, plots and summaries.

A leaf: it imports nothing of the package and torch only where a tensor is handled, so the
torch-free summary of a results file can use it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence

from captum_iglens.settings import DEFAULT_GRANULARITY

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["as_cpu", "fmt", "layer_names", "num", "readout_name", "readout_words", "shorten",
           "total_symbol"]


def layer_names(layer_indices: Sequence[int], granularity: str = DEFAULT_GRANULARITY) -> list[str]:
    """``"emb"`` for hidden-state index 0, ``"L<l>"`` for the output of block ``l``.

    With ``granularity="sublayer"`` the indices are sub-layer node indices (0: ``"emb"``;
    ``2l - 1``: ``"L<l>.attn"``, the residual after block ``l``'s attention; ``2l``:
    ``"L<l>.mlp"``, the block's output ``h_l``).
    """
    if granularity == "sublayer":
        return ["emb" if i == 0 else f"L{(i + 1) // 2}.{'attn' if i % 2 else 'mlp'}"
                for i in layer_indices]
    return ["emb" if i == 0 else f"L{i}" for i in layer_indices]


def as_cpu(x: Tensor) -> Tensor:
    """Detached CPU copy in float32 (float64 stays float64)."""
    import torch

    return x.detach().to("cpu", torch.float32 if x.dtype != torch.float64 else torch.float64)


def num(x: float) -> Optional[float]:
    """``x`` as a float, ``None`` for NaN (JSON has no NaN)."""
    return None if isinstance(x, float) and math.isnan(x) else float(x)


def fmt(x: Optional[float], spec: str) -> str:
    """``format(x, spec)``, ``"-"`` for ``None`` or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def readout_words(units: str, contrastive: bool) -> str:
    """What a result's values are, in words, for legends and axis labels.

    ``"probability"``, ``"log-probability, nats"``, or for contrastive results
    ``"p(y) - p(foil), probability"`` / ``"log p(y) - log p(foil), nats"``.
    """
    if units == "probability":
        return "p(y) - p(foil), probability" if contrastive else "probability"
    return "log p(y) - log p(foil), nats" if contrastive else "log-probability, nats"


def total_symbol(units: str, contrastive: bool) -> str:
    """The symbol of what a result's credits add up to, for tables, legends and captions.

    ``"Δp"`` (probability), ``"Δlog p"`` (log-probability, nats), or ``"ΔF"`` for
    contrastive results, whose ``F`` is ``p(y) - p(foil)`` or its log-ratio.
    """
    if contrastive:
        return "ΔF"
    return "Δp" if units == "probability" else "Δlog p"


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def readout_name(result: Any) -> str:
    """The levels' readout in words: ``"logit-lens"``, or a per-layer lens's kind.

    ``"<kind> lens"`` (``kind``: ``"tuned"``, ``"jacobian"``, ``"custom <class name>"``)
    for a per-layer lens, whose readout is ``g_L``.
    """
    if getattr(result, "lens_change", None) is None:
        return "logit-lens"
    found = getattr(result, "lens", None) or {}
    kind = str(found.get("kind") or "per-layer")
    if kind == "custom" and found.get("name"):
        kind += f" {found['name']}"
    return f"{kind} lens"
