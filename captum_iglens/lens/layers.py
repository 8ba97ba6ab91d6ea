"""The chosen layers, resolved to hidden-state indices.

Captum-style layer arguments: decoder blocks, the input embedding, ints, ``"all"``.
"""

from __future__ import annotations

import warnings
from typing import Optional

from torch import nn

from captum_iglens._utils.typing import LayerSpec, is_int

__all__ = ["resolve_layer_indices"]


def _layer_index(layer: object, blocks: nn.ModuleList, embedding: Optional[nn.Module]) -> int:
    n = len(blocks)
    if isinstance(layer, nn.Module):
        matches = [i for i, block in enumerate(blocks) if block is layer]
        if matches:
            return matches[0] + 1
        if embedding is not None and layer is embedding:
            return 0
        raise ValueError(
            f"Layer {type(layer).__name__} is not one of the model's {n} decoder blocks nor "
            "its input embedding; pass decoder blocks (e.g. model.model.layers[i]) or "
            f"hidden-state indices 0..{n}."
        )
    if not is_int(layer):
        raise TypeError(
            f"A layer must be an int hidden-state index or an nn.Module, got {layer!r}; "
            "use layers=None (or 'all') for every decoder block."
        )
    index = int(layer) + n + 1 if int(layer) < 0 else int(layer)
    if not 0 <= index <= n:
        raise ValueError(
            f"Layer index {layer} is out of range: this model has {n} decoder blocks, so "
            f"hidden-state indices run from 0 (embedding output) to {n} (last block), or "
            f"-{n + 1}..-1 from the end."
        )
    return index


def resolve_layer_indices(
    layers: LayerSpec, blocks: nn.ModuleList, embedding: Optional[nn.Module]
) -> tuple[int, ...]:
    """Sorted hidden-state indices ``L_1 < ... < L_k = n`` of a layer specification.

    Args:
        layers: ``None`` or ``"all"`` (every block), a decoder block or the input embedding
            (Captum style), a hidden-state index (negative counts from ``n + 1``), or a
            sequence of them. The last block ``n`` is always added.
        blocks (nn.ModuleList): The ``n`` decoder blocks.
        embedding (nn.Module, optional): The input embedding (index 0).

    Warns:
        UserWarning: when the input embedding module is the only layer given (the layer
            Captum's LLM tutorial hands to LayerIntegratedGradients): the split is then
            ``emb`` + last block.

    Raises:
        ValueError: empty, out of range, given twice, or a module that is not a block.
        TypeError: anything else.
    """
    n = len(blocks)
    if layers is None or (isinstance(layers, str) and layers == "all"):
        return tuple(range(1, n + 1))
    if isinstance(layers, str):
        raise TypeError(f"layers={layers!r}: use 'all' (or None) for every decoder block, or "
                        "hidden-state indices such as [0, 10, 20].")
    single = isinstance(layers, nn.Module) or is_int(layers)
    items = [layers] if single else list(layers)  # type: ignore[arg-type]
    if not items:
        raise ValueError("layers is empty: give decoder blocks or hidden-state indices, "
                         "or None for all blocks.")
    indices: list[int] = []
    for layer in items:
        index = _layer_index(layer, blocks, embedding)
        if index in indices:
            raise ValueError(f"Layer {index} is given twice; each layer may appear once.")
        indices.append(index)
    if indices == [0] and n > 1 and embedding is not None and items[0] is embedding:
        warnings.warn(
            "Only the input embedding was given as layer: IG-Lens adds the last block and "
            "splits the probability into two columns ('emb', last block). Pass layers=None "
            "for every decoder block, or a list of blocks / hidden-state indices.",
            stacklevel=3,
        )
    if n not in indices:
        indices.append(n)
    return tuple(sorted(indices))
