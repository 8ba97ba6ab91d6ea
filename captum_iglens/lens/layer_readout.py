"""The readout seam: ``readout(h, layer)``, one readout per hidden-state index.

IG-Lens reads every path node through a readout ``g``. By default ``g`` is the model's own
final norm and unembedding at every layer (the logit lens, :class:`LogitLens`: the layer is
ignored, and the computation is the one of a spec without a seam, bit for bit). A per-layer
readout (a tuned-lens translator, a Jacobian lens) is any object with
``__call__(hidden, layer) -> logits`` (:class:`LayerReadout`), passed as
``IGLens(model, lens=...)``; it must be the model's own readout at the last layer ``n``
(Invariant R is checked there).

With a readout ``g_L`` per layer the path ``g_0(b) -> g_{L_1}(h_{L_1}) -> ... -> g_n(h_n)``
telescopes into a block term per segment, ``g_{L_j}(h_{L_j}) - g_{L_j}(h_{L_{j-1}})`` (what
the estimators credit: the segment read through one readout), and a lens term per segment,
``g_{L_j}(h_{L_{j-1}}) - g_{L_{j-1}}(h_{L_{j-1}})`` (the change of readout at a fixed
residual; the baseline is read at layer 0): block terms plus lens terms add up to
``f(h_n) - g_0(b)`` (:func:`~captum_iglens._core.lens_terms.estimate_with_lens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

from torch import Tensor

from captum_iglens._utils.typing import Readout

__all__ = ["LayerReadout", "LogitLens", "at_layer", "is_per_layer", "lens_identity", "lens_key",
           "lens_name"]


@runtime_checkable
class LayerReadout(Protocol):
    """A readout per hidden-state index: ``(hidden [..., d], layer) -> logits [..., V]``.

    ``layer`` is the hidden-state index ``L`` (0: the embedding stream, ``n``: the last
    block's output) of the residual ``hidden``; at ``L = n`` it must be the model's own
    readout (pre-final-norm residual to logits).
    """

    def __call__(self, hidden: Tensor, layer: int) -> Tensor:
        """Logits ``[..., V]`` of ``hidden`` ``[..., d]`` read at ``layer``."""
        ...


@dataclass(frozen=True)
class LogitLens:
    """The default readout: the model's own ``readout`` at every layer (``layer`` ignored).

    Attributes:
        readout (callable): Pre-final-norm residual ``[..., d]`` -> logits ``[..., V]``.
    """

    readout: Readout

    def __call__(self, hidden: Tensor, layer: int) -> Tensor:
        """``readout(hidden)``: logits ``[..., V]`` in the readout's dtype."""
        return self.readout(hidden)


def is_per_layer(lens: object) -> bool:
    """Whether ``lens`` reads layers differently (anything but :class:`LogitLens`)."""
    return not isinstance(lens, LogitLens)


def lens_name(lens: object) -> str:
    """The name a run records for a readout.

    ``"logit"``, a fitted lens's ``kind`` (``"tuned"``, ``"jacobian"``), else the readout's
    class name.
    """
    if isinstance(lens, LogitLens) or lens is None:
        return "logit"
    return str(getattr(lens, "kind", "") or type(lens).__name__)


def lens_identity(lens: object) -> Optional[dict[str, Any]]:
    """Which per-layer readout ``lens`` is, for JSON (``"lens"``) and a run's fingerprint.

    Returns:
        dict or None: None for the logit lens (results stay as they were); a fitted lens's
        :meth:`~captum_iglens.lens.translators.FittedLens.identity` (``kind`` ``"tuned"``
        or ``"jacobian"``, ``digest`` of its tensors, ``model_digest``, ``settings_key``,
        ``source``); for any other readout ``{"kind": "custom", "name": <class name>}``,
        plus what its own ``identity()`` returns, if it has one (a custom readout without
        one cannot be told from another of its class).
    """
    if isinstance(lens, LogitLens) or lens is None:
        return None
    own = getattr(lens, "identity", None)
    found = dict(own()) if callable(own) else {}
    if found.get("kind") in ("tuned", "jacobian"):
        return found
    return {"kind": "custom", "name": type(lens).__name__, **found}


def lens_key(lens: object) -> Optional[str]:
    """What tells two readouts of one kind apart in a fingerprint (None: the logit lens).

    A fitted lens's tensor ``digest``; a custom readout's class name and its identity's
    ``digest``, when it has one.
    """
    found = lens_identity(lens)
    if found is None:
        return None
    if found["kind"] == "custom":
        return ":".join(str(v) for v in (found["name"], found.get("digest")) if v)
    return str(found["digest"])


@dataclass(frozen=True)
class _AtLayer:
    """``lens`` bound to one layer: a plain readout ``hidden -> logits``."""

    lens: LayerReadout
    layer: int
    vocab: Optional[int] = None

    def __call__(self, hidden: Tensor) -> Tensor:
        logits = self.lens(hidden, self.layer)
        shaped = isinstance(logits, Tensor) and logits.shape[:-1] == hidden.shape[:-1]
        if not shaped or (self.vocab is not None and logits.shape[-1] != self.vocab):
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise TypeError(f"lens(hidden, {self.layer}) must return logits shaped "
                            f"{tuple(hidden.shape[:-1])} + [{self.vocab or 'V'}] (the "
                            f"vocabulary), got {got}.")
        return logits


def at_layer(lens: LayerReadout, layer: int, vocab: Optional[int] = None) -> Readout:
    """``hidden -> lens(hidden, layer)``: the readout of one layer, for the estimators.

    A per-layer readout's logits are checked: ``hidden``'s leading shape and ``vocab``
    entries (``TypeError`` otherwise, never a softmax over something else).
    """
    if isinstance(lens, LogitLens):
        return lens.readout
    return _AtLayer(lens, int(layer), vocab)
