"""What the plots draw: credit displays that keep every token visible, Captum's records.

A leaf module (torch only), so that both the result objects and the plots can use it.

A token the model finds unlikely has credits of the size of its probability: on a colour
scale shared with likely tokens its row is blank. Two displays keep it visible:

- ``"row"``: each row divided by its own largest ``|credit|`` (the shape of each token's
  build-up, not its size);
- ``"log-probability"``: the change of ``log f`` over each segment, in nats, from the
  logit-lens levels (the exact IG-Lens credits of ``log p`` along the same path): a token
  that goes from ``1e-6`` to ``1e-3`` shows ``+6.9`` nats.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._utils.format import layer_names
from captum_iglens._utils.views import ResultView
from captum_iglens.settings import DEFAULT_GRANULARITY

__all__ = ["CREDIT_COLOURS", "DISPLAYS", "START_GREY", "credit_colormap", "display_attributions",
           "layer_labels", "row_normalised", "spanned_labels", "spans_blocks", "start_apart",
           "visualization_records"]

#: The displays of credits the plots take (``display=``).
DISPLAYS = ("credit", "row", "log-probability")
_TINY = 1e-30  # a floor for log f of a level that rounds to 0
#: The credit colours, negative to positive: Captum's convention (``plot_token_attr``'s
#: "RdWhGn" map and ``visualize_text``'s hues): red for a negative credit, green for a
#: positive one, white at 0.
CREDIT_COLOURS = ("red", "white", "green")


#: The colour of a cell drawn off the colour scale (the start column in log units).
START_GREY = "0.82"


def start_apart(units: str, display: str, k: int) -> bool:
    """Whether the first of ``k`` columns is drawn as the start, off the colour scale.

    True for log-probability values (``units="log-probability"`` or
    ``display="log-probability"``) with more than one column: there the first column holds
    the logit lens's level at the first chosen layer (less the baseline's), unbounded below
    and at an early layer tens of nats below any later rise.
    """
    return k > 1 and (units == "log-probability" or display == "log-probability")


def credit_colormap() -> Any:
    """The diverging ``matplotlib`` colour map of credits (:data:`CREDIT_COLOURS`).

    The plots of :mod:`captum_iglens.plot` and Captum's ``plot_token_attr`` of the same
    result draw a credit in the same colour; centre it at 0 with symmetric limits.
    """
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list("iglens_RdWhGn", list(CREDIT_COLOURS))


def row_normalised(attributions: Tensor) -> Tensor:
    """``[T, k]`` each row divided by its largest ``|value|`` (rows of zeros stay zero)."""
    scale = attributions.abs().amax(-1, keepdim=True)
    return torch.where(scale > 0, attributions / scale.clamp_min(1e-300),
                       torch.zeros_like(attributions))


def display_attributions(result: ResultView, display: str) -> tuple[Tensor, str]:
    """The ``[T, k]`` values drawn for ``display`` and their colour-bar label.

    Raises:
        ValueError: an unknown display, or ``"log-probability"`` for a result already in log
            units or contrastive (its levels are not probabilities).
    """
    attr = result.attributions.detach().float().cpu()
    if display == "credit":
        return attr, ""
    if display == "row":
        if start_apart(result.units, display, attr.shape[-1]):  # scaled by the rises alone
            scale = attr[:, 1:].abs().amax(-1, keepdim=True)
            shown = torch.where(scale > 0, attr / scale.clamp_min(1e-300), torch.zeros_like(attr))
            return shown, "credit / the token's largest |rise| (first: the start)"
        return row_normalised(attr), "credit / the token's largest |credit|"
    if display != "log-probability":
        raise ValueError(f"display={display!r}: use one of {DISPLAYS}.")
    if result.units != "probability" or result.contrastive:
        raise ValueError("display='log-probability' needs a non-contrastive result in "
                         "probability units (explain(..., units='log-probability') gives "
                         "log credits directly).")
    levels = torch.cat([result.p_baseline[:, None], result.lens_probs], -1).double()
    log_levels = levels.clamp_min(_TINY).log()
    return log_levels.diff(dim=-1).float(), "change of log p over the segment (nats)"


def layer_labels(layer_indices: Sequence[int], granularity: str = DEFAULT_GRANULARITY) -> list[str]:
    """Display names of the layer columns: ``"b→emb"`` for index 0, ``"L<l>"`` otherwise.

    Index 0 (the embedding output) is always the first chosen layer: its credit
    ``f(h_0) - f(b)`` is the move from the baseline to the embedding, which no decoder
    block made; the label says so. Sub-layer columns (``granularity="sublayer"``) are
    ``"L<l>.attn"`` and ``"L<l>.mlp"`` (:func:`~captum_iglens._utils.format.layer_names`),
    an attention column that also spans skipped blocks named with them
    (:func:`spanned_labels`: ``"L1-24+L25.attn"``).
    """
    names = spanned_labels(layer_names(layer_indices, granularity))
    return ["b→emb" if i == 0 else name for i, name in zip(layer_indices, names, strict=True)]


def _block(name: str) -> Optional[int]:
    """The block a node name ends at: 0 for ``emb``, ``l`` for ``L<l>.mlp``; else None."""
    if name in ("emb", "b→emb"):
        return 0
    if name.startswith("L") and name.endswith(".mlp") and name[1:-4].isdigit():
        return int(name[1:-4])
    return None


def spanned_labels(names: Sequence[str]) -> list[str]:
    """Sub-layer node names with the blocks an attention segment spans written out.

    With a subset of layers at sub-layer granularity, the segment ending at ``L<l>.attn``
    starts at the previous chosen node, ``h_m`` (``L<m>.mlp`` or ``emb``): it holds the
    whole blocks ``m+1 .. l-1`` as well as block ``l``'s attention. Its name then says so:
    ``"L1-24+L25.attn"`` after ``emb`` with blocks 1 to 24 skipped, ``"L24+L25.attn"`` for
    one skipped block. Other names (and the first segment, from the baseline) are kept.

    Args:
        names (sequence of str): Node names (``"emb"``, ``"L<l>.attn"``, ``"L<l>.mlp"``,
            or block names ``"L<l>"``, which are kept).

    Returns:
        list[str]: the labels, one per name.
    """
    out = list(names)
    for j in range(1, len(names)):
        name, before = names[j], _block(names[j - 1])
        if before is None or not (name.startswith("L") and name.endswith(".attn")):
            continue
        block = int(name[1:-5])
        first, last = before + 1, block - 1
        if last > first:
            out[j] = f"L{first}-{last}+{name}"
        elif last == first:
            out[j] = f"L{first}+{name}"
    return out


def spans_blocks(labels: Sequence[str]) -> bool:
    """Whether any of ``labels`` (:func:`spanned_labels`) spans skipped blocks."""
    return any("+" in label for label in labels)


def visualization_records(
    attributions: Tensor,
    layers: Sequence[str],
    tokens: Sequence[str],
    probs: Optional[Tensor],
    convergence_delta: Optional[Tensor],
    normalize: bool = True,
    baseline_attr: Optional[Tensor] = None,
) -> list[Any]:
    """Captum ``VisualizationDataRecord`` per answer token: its credits over the layers.

    ``visualize_text`` colours each "word" (here a layer name) by its attribution, clipped
    to ``[-1, 1]`` (red negative, green positive): with ``normalize`` (default) each row is
    divided by its largest ``|credit|`` so every token's layers are coloured; the record's
    ``attr_score`` is what the credits add up to, ``Δp = f(x) - f(b)`` (the row's
    un-normalised sum plus ``baseline_attr``, the baseline's readout ``-f(b)`` that an
    :class:`IGLensLLMAttributionResult` keeps out of its rows), ``pred_prob`` the model's
    probability, ``convergence_score`` the completeness error.

    Args:
        attributions (Tensor): ``[T, k]`` credits.
        layers (sequence of str): The ``k`` layer names (the record's ``raw_input_ids``).
        tokens (sequence of str): The ``T`` answer tokens (the predicted class).
        probs (Tensor, optional): ``[T]`` the model's probability of each token.
        convergence_delta (Tensor, optional): ``[T]`` completeness errors.
        normalize (bool, optional): Scale each row to ``[-1, 1]``. Default: True.
        baseline_attr (Tensor, optional): ``[T]`` what was kept out of each row (``-f(b)``),
            added back into the score. Default: None (the rows hold all of ``Δp``).

    Returns:
        list[captum.attr.visualization.VisualizationDataRecord]
    """
    from captum.attr import visualization

    record = visualization.VisualizationDataRecord

    attr = attributions.detach().float().cpu()
    shown = row_normalised(attr) if normalize else attr
    records = []
    kept_out = (torch.zeros(len(tokens), dtype=torch.float64) if baseline_attr is None
                else baseline_attr.detach().cpu().double())
    for t, token in enumerate(tokens):
        score = float(attr[t].double().sum() + kept_out[t])  # Δp, not f(x)
        records.append(record(
            shown[t], float(probs[t]) if probs is not None else float("nan"), token, token,
            token, score, list(layers),
            float(convergence_delta[t]) if convergence_delta is not None else None))
    return records
