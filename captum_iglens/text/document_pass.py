"""Document mode in one pass: the text fed in chunks, each with the KV cache of the earlier ones.

Re-running the model over the whole text for every chunk of explained positions costs the
text's forward once per chunk: quadratic in the text. Here each chunk of ``chunk`` text
positions runs once, attending to the earlier ones through the model's own KV cache (as
``generate`` does with a long prompt), and its pass records what IG-Lens needs at the
chunk's explained positions only: the chosen layers' residuals and the model's own logits.
The causal ``"mean"`` baseline needs ``h_1`` at every position before the explained one: a
float64 running sum and count are carried from chunk to chunk instead, so nothing of the
earlier chunks is kept but the cache and that sum. The numbers are those of one forward over
the whole text up to kernel rounding (attention over a cache instead of the whole sequence).

Families whose cache cannot serve a chunked pass (:func:`cache_refusal`) are explained by
re-running the model per chunk, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.baselines import MEAN_BASELINE_LAYER, is_reference_ids
from captum_iglens._core.entry import layers_to_record
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.architectures import model_type, unwrap_model
from captum_iglens.lens.families import UNCACHED_DOCUMENTS, family_row
from captum_iglens.lens.hooks import capture_residual_stream, check_finite_residuals
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.state import (
    dynamic_rope_prefixes,
    forward_parameters,
    model_state_preserved,
)
from captum_iglens.settings import DEFAULT_BASELINE

if TYPE_CHECKING:
    from captum_iglens.ig_lens import IGLens

__all__ = ["UNCACHED_DOCUMENTS", "DocumentChunk", "cache_refusal", "document_chunks"]


#: Names of the forward's KV-cache argument (transformers 5, then 4).
_CACHE_ARGUMENTS = ("cache", "past_key_values")


def _dynamic_rope_limit(model: nn.Module) -> Optional[int]:
    """The trained length of a dynamic NTK RoPE (``None``: none in the model)."""
    for module in model.modules():
        if dynamic_rope_prefixes(module):
            return int(getattr(module, "original_max_seq_len", 0))
    return None


def cache_refusal(model: nn.Module, n_tokens: int,
                  baselines: BaselineSpec = DEFAULT_BASELINE) -> Optional[str]:
    """Why a text of ``n_tokens`` cannot be explained in one cached pass, or ``None``.

    A forward without a KV cache argument, the families of :data:`UNCACHED_DOCUMENTS`,
    KV-shared layers (Gemma-4), a dynamic NTK RoPE past its trained length (its frequencies
    would follow each chunk's end instead of the whole text) and reference-id baselines (a
    second forward of their own) are refused.
    """
    params = forward_parameters(model)
    if not any(name in params for name in _CACHE_ARGUMENTS):
        return "its forward takes no KV cache"
    kind = model_type(model)
    row = family_row(kind)
    if row is not None and row.uncached:
        return f"{kind}: {row.uncached}"
    config = getattr(unwrap_model(model), "config", None)
    config = getattr(config, "text_config", None) or config
    shared = getattr(config, "num_kv_shared_layers", 0)
    if isinstance(shared, int) and shared > 0:
        return f"{shared} KV-shared layers"
    limit = _dynamic_rope_limit(model)
    if limit is not None and n_tokens > limit:
        return (f"dynamic RoPE beyond its trained {limit} positions rescales with the "
                "length of each pass")
    if is_reference_ids(baselines):
        return "reference-id baselines need a forward of their own"
    return None


@dataclass
class DocumentChunk:
    """What one cached pass recorded at its explained positions.

    Attributes:
        index (slice): Which of the document's explained positions these are.
        positions (list[int]): The ``P`` explained positions (columns of the text).
        states (dict[int, Tensor]): ``{l: h_l}``, ``[1, P, d]`` for every recorded index.
        dist (ModelDistribution, optional): The model's own distribution ``[1, P, V]``
            there (``None`` once :meth:`take` handed it over).
        mean (Tensor, optional): ``[1, P, d]`` the causal mean of ``h_1`` there (model
            dtype), for the ``"mean"`` baseline.
    """

    index: slice
    positions: list[int]
    states: dict[int, Tensor]
    dist: Optional[ModelDistribution]
    mean: Optional[Tensor] = None

    def take(self) -> tuple[dict[int, Tensor], ModelDistribution, Optional[Tensor]]:
        """Hand over ``(states, dist, mean)`` and keep none of them.

        The reader's paths then hold the pass's tensors alone, so the ``[1, P, V]``
        distribution is freed as soon as the readout check is done with it.

        Raises:
            RuntimeError: taken twice.
        """
        if self.dist is None:
            raise RuntimeError("This document chunk was already taken.")
        out = (self.states, self.dist, self.mean)
        self.states, self.dist, self.mean = {}, None, None
        return out


class _RunningMean:
    """The causal mean of ``h_1`` across chunks: a float64 running sum and count."""

    def __init__(self) -> None:
        self.total: Optional[Tensor] = None  # [1, 1, d] float64: sum of h_1 so far
        self.count = 0

    def update(self, first: Tensor, rel: list[int]) -> Tensor:
        """Add the chunk's ``first [1, n, d]``; the means at its columns ``rel``: ``[1, P, d]``.

        The sum runs on from the last chunk's, in the order of
        :func:`~captum_iglens._core.baselines.causal_mean`'s ``cumsum`` over the whole text.
        """
        wide = first.double()
        if self.total is not None:
            wide = torch.cat([self.total.to(wide.device), wide], dim=1)
        sums = wide.cumsum(dim=1)[:, 0 if self.total is None else 1:]
        counts = torch.arange(self.count + 1, self.count + 1 + first.shape[1],
                              dtype=torch.float64, device=first.device)
        self.total, self.count = sums[:, -1:], self.count + first.shape[1]
        return (sums[:, rel] / counts[rel][:, None]).to(first.dtype)


def _cache_of(output: Any) -> Any:
    """The KV cache a forward handed back."""
    for name in _CACHE_ARGUMENTS:
        cache = getattr(output, name, None)
        if cache is not None:
            return cache
    raise RuntimeError("The model's forward handed back no KV cache: this document cannot "
                       "be explained in one pass.")


def _pass_kwargs(params: Any, cache: Any, start: int, end: int, rel: list[int],
                 device: torch.device) -> dict[str, Any]:
    """The forward's keyword arguments for text columns ``start..end - 1``."""
    name = next(n for n in _CACHE_ARGUMENTS if n in params)
    kwargs: dict[str, Any] = {name: cache}
    if "use_cache" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs["use_cache"] = True  # GraniteMoE takes it through **kwargs
    if "position_ids" in params:
        kwargs["position_ids"] = torch.arange(start, end, device=device)[None]
    if "logits_to_keep" in params:  # the unembedding at the explained columns only
        kwargs["logits_to_keep"] = torch.tensor(rel, device=device) if rel else 1
    return kwargs


def _cached_pass(lens: IGLens, ids: Tensor, cache: Any, start: int, rel: list[int],
                 whole: set[int], needed: set[int]) -> tuple[dict[int, Tensor], Tensor, Any]:
    """One chunk's forward: ``(states, logits [1, P, V], cache)``.

    ``states`` holds ``[1, P, d]`` at the columns ``rel`` of the chunk, ``[1, n, d]`` for
    the indices in ``whole``.

    Raises:
        FloatingPointError: NaN or inf in a residual (the first such block named).
        ResidualShapeError: a block's output is not ``[1, n, d]``.
    """
    model, blocks = lens.model, lens.decoder_blocks
    device = lens.spec.readout_device
    kwargs = _pass_kwargs(forward_parameters(model), cache, start, start + ids.shape[1], rel,
                          ids.device)
    finite: dict[int, Tensor] = {}
    with model_state_preserved(model), torch.no_grad(), capture_residual_stream(
            blocks, needed, device, finite=finite, shape=tuple(ids.shape), positions=rel,
            whole=whole) as states:
        output = model(ids, **kwargs)
    check_finite_residuals(model, blocks, finite)
    logits = output.logits if hasattr(output, "logits") else output[0]
    if logits.shape[1] == ids.shape[1]:
        logits = logits[:, rel]
    return dict(states), logits if device is None else logits.to(device), _cache_of(output)


def document_chunks(lens: IGLens, sequence: Tensor, chosen: Sequence[int], chunk: int,
                    baselines: BaselineSpec) -> Generator[DocumentChunk, None, None]:
    """The text's cached passes, ``chunk`` columns each, up to the last explained position.

    Args:
        lens (IGLens): The lens (model, decoder blocks, chosen layers, readout).
        sequence (Tensor): ``[1, S]`` int64 token ids of the text.
        chosen (sequence of int): The sorted explained positions.
        chunk (int): Text columns per pass.
        baselines: The baseline (``"mean"`` makes the running mean of ``h_1``).

    Yields:
        DocumentChunk: per pass with explained positions, in order (passes without one
        only feed the cache and the running mean).

    Raises:
        FloatingPointError, ResidualShapeError: as :func:`_cached_pass`.
        RuntimeError: the forward handed back no cache.
    """
    needed, whole = layers_to_record(lens.spec, baselines)
    running = _RunningMean() if MEAN_BASELINE_LAYER in whole else None
    cache, begin = None, 0
    for start in range(0, chosen[-1] + 1, chunk):
        end = min(start + chunk, chosen[-1] + 1)
        stop = begin
        while stop < len(chosen) and chosen[stop] < end:
            stop += 1
        rel = [p - start for p in chosen[begin:stop]]
        states, logits, cache = _cached_pass(lens, sequence[:, start:end], cache, start, rel,
                                             whole, needed)
        mean = running.update(states[MEAN_BASELINE_LAYER], rel) if running else None
        if not rel:
            continue
        piece = DocumentChunk(slice(begin, stop), list(chosen[begin:stop]),
                              {i: s[:, rel] if i in whole else s for i, s in states.items()},
                              ModelDistribution.from_logits(logits), mean)
        del states, logits, mean  # the chunk alone holds the pass's tensors: the reader
        begin = stop  # empties it (DocumentChunk.take) while this frame waits
        yield piece
