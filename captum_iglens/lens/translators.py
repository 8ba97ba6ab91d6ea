"""Fitted per-layer readouts: the tuned lens and the Jacobian lens (both :class:`LayerReadout`).

Both map a residual ``h`` ``[..., d]`` at hidden-state index ``L`` (0: the embedding stream,
``n``: the last block's output) to logits through a map ``T_L`` followed by the model's own
final norm and unembedding: ``g_L(h) = readout(T_L(h))``, with ``T_n`` the identity (so
``g_n`` is the model and Invariant R holds).

- :class:`TunedLens` (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers
  with the Tuned Lens", Sec. 3; the ``tuned-lens`` package): an affine translator
  ``T_L(h) = h + A_L h + b_L``, identity-initialised (``A_L = 0``, ``b_L = 0``: the logit
  lens before fitting), fitted by :func:`~captum_iglens.lens.fit.fit_tuned_lens`.
- :class:`JacobianLens` (Gurnee et al. 2026, "Verbalizable Representations Form a Global
  Workspace in Language Models"; TransformerLens ``transformer_lens/tools/analysis/
  jacobian_lens.py``, PR #1507, after ``anthropics/jacobian-lens``): a linear transport
  ``T_L(h) = J_L h`` with ``J_L = E_{prompt, t, t' >= t}[d h_{n,t'} / d h_{L,t}]``, the
  average Jacobian of the last block's output (pre final norm) with respect to ``h_L``
  (summed over later target positions ``t'``, averaged over source positions ``t`` and
  prompts); ``J_L = I`` is the logit lens. Fitted by
  :func:`~captum_iglens.lens.fit.fit_jacobian_lens` (an average, no optimisation).

A fitted lens carries the weights digest of its model
(:func:`~captum_iglens.lens.weights.weights_digest`) and its fit settings; :func:`load_lens`
refuses a file whose digest is not the model's (:class:`LensDigestError`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from captum_iglens._utils.typing import Readout
from captum_iglens.lens.readout import resolve_readout
from captum_iglens.lens.weights import weights_digest

__all__ = ["FittedLens", "JacobianLens", "LensDigestError", "TunedLens", "load_lens",
           "settings_key"]

#: The format tag written into every saved lens file.
_FORMAT = "captum_iglens.fitted_lens.v1"


def settings_key(settings: dict[str, Any]) -> str:
    """12 hex digits over a fit's settings (the ``<kind>-<key>.pt`` name in the cache)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


class LensDigestError(ValueError):
    """A saved lens was fitted on another model (its weights digest differs)."""


class FittedLens(nn.Module):
    """Common part of the fitted lenses: ``g_L(h) = readout(T_L(h))``, ``T_n`` the identity.

    Args:
        readout (callable): The model's own readout, pre-final-norm residual ``[..., d]`` ->
            logits ``[..., V]`` (:func:`~captum_iglens.lens.readout.resolve_readout`).
        num_layers (int): ``n``, the number of decoder blocks.
        hidden_size (int): ``d``.
        digest (str, optional): The weights digest of the model it belongs to.
        settings (dict, optional): The fit settings (recorded in saved files).

    The translator's parameters are float32; ``h`` is translated in float32 and cast back to
    its own dtype before the readout.
    """

    kind = ""

    def __init__(self, readout: Readout, num_layers: int, hidden_size: int,
                 digest: str = "", settings: Optional[dict[str, Any]] = None) -> None:
        """Hold the readout and the facts (see the class docstring)."""
        super().__init__()
        self._readout = (readout,)  # a tuple: not registered, not in the state dict
        self.num_layers, self.hidden_size = int(num_layers), int(hidden_size)
        self.digest = digest
        self.settings: dict[str, Any] = dict(settings or {})
        self.source = ""  # the file or folder it was loaded from ("": built in this process)

    @property
    def readout(self) -> Readout:
        """The model's own readout (``g_n``)."""
        return self._readout[0]

    @classmethod
    def for_model(cls, model: nn.Module, settings: Optional[dict[str, Any]] = None) -> Any:
        """An identity-initialised lens of ``model`` (its readout, ``n``, ``d``, digest)."""
        config: Any = model.config
        return cls(resolve_readout(model), config.num_hidden_layers, config.hidden_size,
                   weights_digest(model), settings)

    def translate(self, hidden: Tensor, layer: int) -> Tensor:
        """``T_L(h)`` in float32, ``[..., d]`` (``layer`` in ``0..n-1``)."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """Which fitted lens this is, for JSON (``"lens"``) and a run's fingerprint.

        Returns:
            dict: ``kind``; ``digest``, 16 hex digits over the translators' tensors (two
            lenses with other weights never share it); ``model_digest``, the weights digest
            of the model it was fitted on; ``settings_key``, the hash of its fit settings
            (its cache file's name); ``source``, the file or folder it was loaded from
            (``""`` when built in this process).
        """
        content = hashlib.blake2b(digest_size=8)
        for name, tensor in sorted(self.state_dict().items()):
            data = tensor.detach().float().cpu().contiguous()
            content.update(name.encode())
            content.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        return {"kind": self.kind, "digest": content.hexdigest(), "model_digest": self.digest,
                "settings_key": settings_key(self.settings), "source": self.source}

    def forward(self, hidden: Tensor, layer: int) -> Tensor:
        """Logits ``[..., V]`` of ``hidden`` ``[..., d]`` read at hidden-state index ``layer``.

        Raises:
            ValueError: ``layer`` outside ``0..n``.
        """
        layer = int(layer)
        if not 0 <= layer <= self.num_layers:
            raise ValueError(f"layer={layer}: a {self.kind} lens of a {self.num_layers}-block "
                             f"model reads hidden-state indices 0..{self.num_layers}.")
        if layer == self.num_layers:
            return self.readout(hidden)
        return self.readout(self.translate(hidden.float(), layer).to(hidden.dtype))

    def save(self, path: Union[str, Path]) -> Path:
        """Write the lens (tensors, kind, digest, settings) to ``path`` (``torch.save``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": _FORMAT, "kind": self.kind, "digest": self.digest,
                   "num_layers": self.num_layers, "hidden_size": self.hidden_size,
                   "settings": self.settings,
                   "state": {k: v.detach().cpu() for k, v in self.state_dict().items()}}
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(path)
        return path


class TunedLens(FittedLens):
    """The tuned lens: ``T_L(h) = h + A_L h + b_L`` for ``L < n`` (Belrose et al. 2023, Sec. 3).

    ``translators[L]`` is an ``nn.Linear(d, d)`` holding ``A_L`` (``weight``) and ``b_L``
    (``bias``), zero at construction (the logit lens), as the ``tuned-lens`` package's
    ``layer_translators.{L}``. Arguments are those of :class:`FittedLens`.
    """

    kind = "tuned"

    def __init__(self, readout: Readout, num_layers: int, hidden_size: int,
                 digest: str = "", settings: Optional[dict[str, Any]] = None) -> None:
        """Identity-initialised translators (see the class docstring)."""
        super().__init__(readout, num_layers, hidden_size, digest, settings)
        self.translators = nn.ModuleList(
            nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        with torch.no_grad():
            for parameter in self.translators.parameters():
                parameter.zero_()

    def translate(self, hidden: Tensor, layer: int) -> Tensor:
        """``h + A_L h + b_L`` (float32)."""
        return hidden + self.translators[layer](hidden)


class JacobianLens(FittedLens):
    """The Jacobian lens: ``T_L(h) = J_L h`` for ``L < n`` (TransformerLens ``JacobianLens``).

    ``jacobians`` ``[n, d, d]`` (float32 buffer) holds ``J_L`` for ``L = 0..n-1``, the
    identity at construction (the logit lens). ``J_L = E[d h_n / d h_L]`` as defined in the
    module docstring. Arguments are those of :class:`FittedLens`.
    """

    kind = "jacobian"

    def __init__(self, readout: Readout, num_layers: int, hidden_size: int,
                 digest: str = "", settings: Optional[dict[str, Any]] = None) -> None:
        """Identity-initialised translators (see the class docstring)."""
        super().__init__(readout, num_layers, hidden_size, digest, settings)
        eye = torch.eye(hidden_size).expand(num_layers, hidden_size, hidden_size)
        self.register_buffer("jacobians", eye.clone())

    def translate(self, hidden: Tensor, layer: int) -> Tensor:
        """``J_L h`` (float32)."""
        jacobian: Tensor = self.jacobians[layer]  # type: ignore[index]
        return hidden @ jacobian.to(hidden.device).T


_KINDS: dict[str, type[FittedLens]] = {"tuned": TunedLens, "jacobian": JacobianLens}


def load_lens(path: Union[str, Path], model: nn.Module,
              digest: Optional[str] = None) -> FittedLens:
    """Load a lens saved by :meth:`FittedLens.save` for ``model``.

    Args:
        path (str or Path): The saved file.
        model (nn.Module): The model it is applied to (its readout is used).
        digest (str, optional): ``model``'s weights digest, if already computed.

    Raises:
        ValueError: not a saved lens file, or its shapes do not fit the model.
        LensDigestError: the lens was fitted on another model (the digests differ).
    """
    path = Path(path)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a lens saved by captum_iglens (no {_FORMAT!r} tag); "
                         "fit one with `iglens fit-lens` or load a tuned-lens folder with "
                         "captum_iglens.lens.fit.load_tuned_lens_folder.")
    digest = weights_digest(model) if digest is None else digest
    if payload["digest"] != digest:
        raise LensDigestError(
            f"The {payload['kind']} lens in {path} was fitted on a model with weights digest "
            f"{payload['digest']}, not on this model ({digest}): fit one for this model with "
            f"`iglens fit-lens --kind {payload['kind']}`.")
    config: Any = model.config
    if (payload["num_layers"], payload["hidden_size"]) != (config.num_hidden_layers,
                                                           config.hidden_size):
        raise ValueError(f"{path}: a lens of {payload['num_layers']} blocks of width "
                         f"{payload['hidden_size']} does not fit this model.")
    lens = _KINDS[payload["kind"]](resolve_readout(model), payload["num_layers"],
                                   payload["hidden_size"], digest, payload["settings"])
    lens.load_state_dict(payload["state"])
    lens.source = str(path)
    return lens.requires_grad_(False)
