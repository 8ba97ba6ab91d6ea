"""IG-Lens: exact additive probability attribution across decoder layers.

D. A. Nguyen, "IG-Lens: Exact Additive Probability Attribution Across Transformer Layers
via Telescoping Integrated Gradients", arXiv:2606.29693 (2026). DESIGN.md section 1.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from captum.attr import GradientAttribution
from captum.attr._utils.approximation_methods import (
    SUPPORTED_METHODS as CAPTUM_APPROXIMATION_METHODS,
)
from captum.attr._utils.approximation_methods import approximation_parameters
from captum.log import log_usage
from torch import Tensor, nn

from captum_iglens.onset import onset_layer_indices
from captum_iglens.readout import resolve_decoder_blocks, resolve_readout
from captum_iglens.residual import (
    capture_residual_stream,
    execution_device,
    model_state_preserved,
)

__all__ = ["IGLens", "IGLensOutput", "ReadoutMismatchError", "METHODS"]

#: Estimator names accepted by :meth:`IGLens.attribute`.
METHODS: tuple[str, ...] = ("prediction_aware", *CAPTUM_APPROXIMATION_METHODS)
BASELINES: tuple[str, ...] = ("mean", "zero", "embedding")

LayerSpec = Union[None, int, nn.Module, Sequence[Union[int, nn.Module]]]
BaselineSpec = Union[str, Tensor]
TargetSpec = Union[None, int, Sequence[int], Tensor]
PositionSpec = Union[int, Sequence[int]]


class ReadoutMismatchError(RuntimeError):
    """Invariant R failed: the lens readout of ``h_n`` is not the model's own probability."""


@dataclass
class IGLensOutput:
    """Everything one IG-Lens pass computes, for ``B`` inputs, ``P`` positions, ``k`` layers.

    All probabilities are in probability units (not logits), float32 (float64 for a float64
    model), on the readout's device.

    Attributes:
        attributions (Tensor): ``[B, P, k]`` IG-Lens credit per chosen layer.
        convergence_delta (Tensor): ``[B, P]`` ``attributions.sum(-1) - delta_p``.
        lens_probs (Tensor): ``[B, P, k]`` logit-lens probability ``f(h_L)`` per chosen layer.
        p_final (Tensor): ``[B, P]`` ``f(h_n)``, the model's own probability (Invariant R).
        p_baseline (Tensor): ``[B, P]`` ``f(b)``.
        target (Tensor): ``[B, P]`` int64 target token ids.
        positions (list[int]): the ``P`` explained positions (non-negative).
        layer_indices (tuple[int, ...]): the ``k`` hidden-state indices ``L_1..L_k``.
    """

    attributions: Tensor
    convergence_delta: Tensor
    lens_probs: Tensor
    p_final: Tensor
    p_baseline: Tensor
    target: Tensor
    positions: list[int]
    layer_indices: tuple[int, ...]

    @property
    def delta_p(self) -> Tensor:
        """``[B, P]`` ``p_final - p_baseline``, the total change the credits add up to."""
        return self.p_final - self.p_baseline


@dataclass
class _Capture:
    hidden: Tensor  # [B, P, k, d] residuals at the chosen layers, model dtype
    baseline: Tensor  # [B, P, d]
    target: Tensor  # [B, P] int64
    model_probs: Tensor  # [B, P] float32, softmax(model logits)[target]
    positions: list[int]


def _is_int(value: object) -> bool:
    """An int (numpy ints included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


#: Readout chunks are padded to at least this many rows: BLAS takes a different matrix kernel
#: for 1-3 rows, whose rounding would make results depend on ``internal_batch_size``.
_MIN_CHUNK_ROWS = 8


def _pad_rows(points: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Pad ``points [N, d]`` and ``targets [N]`` to ``_MIN_CHUNK_ROWS`` rows by repeating the
    last row (a new leaf tensor; the caller keeps the first ``N`` results)."""
    short = _MIN_CHUNK_ROWS - points.shape[0]
    if short <= 0:
        return points.detach(), targets
    return (torch.cat([points, points[-1:].expand(short, -1)]).detach(),
            torch.cat([targets, targets[-1:].expand(short)]))


class IGLens(GradientAttribution):
    r"""IG-Lens attributes the probability of a predicted token to the decoder layers.

    For chosen hidden-state indices ``0 <= L_1 < ... < L_k = n`` and a baseline ``b`` in
    residual space, IG-Lens integrates the gradient of the lens readout
    ``f_y(h) = softmax(unembed(final_norm(h)))[y]`` along the single piecewise-linear path
    ``b -> h_{L_1} -> ... -> h_{L_k}`` and credits layer ``L_j`` with its segment. By the
    gradient theorem the credits telescope (Proposition 1 of the paper)::

        sum_j IGL_j = f_y(h_n) - f_y(b) = delta_p

    so the per-layer credits add up to the change of the target token's *probability*.
    Captum's LayerIntegratedGradients gives every layer its own baseline; its per-layer
    totals do not add up this way.

    What IG-Lens measures is a conditional marginal: the extra probability that the final
    norm and unembedding can read out of ``h_L`` beyond the previous chosen layer. It is not
    the total causal effect of block ``L`` through the blocks above it (see
    :mod:`captum_iglens.ablation`, when present, for that).

    The default estimator, ``"prediction_aware"`` (IDGI-style), credits each grid step its
    observed change in ``f``; the interior points cancel exactly, so each credit is the
    endpoint difference of its segment and the whole token x layer map costs
    ``T * (k + 1)`` readouts and no backward pass, at any ``n_steps``. The gradient
    estimators (Captum's ``riemann_*`` and ``gausslegendre``) are the paper's reference
    variant; their convergence delta is the discretisation error.

    Args:
        model (nn.Module): A Hugging Face causal LM (``*ForCausalLM``) or any model whose
            decoder blocks and readout are given explicitly.
        layers (int, nn.Module or sequence of them, optional): The chosen layers. Modules
            are decoder blocks (Captum style; block ``i`` of ``model.model.layers`` is
            hidden-state index ``i + 1``) or the input embedding (index 0); ints are
            hidden-state indices ``0..n`` (negative ints count from ``n + 1``). The last
            block ``n`` is always included. ``None`` (default) takes all ``n`` blocks.
        readout (callable, optional): Maps a pre-final-norm residual ``[..., d]`` to the
            model's logits ``[..., V]``. Default: :func:`~captum_iglens.readout.resolve_readout`.
        decoder_blocks (nn.ModuleList, optional): The decoder blocks, for models that
            :func:`~captum_iglens.readout.resolve_layout` does not know.
        check_readout (bool, optional): Verify Invariant R on every call (default True).

    Precision and placement: float16 / bfloat16 models run the final norm and head in their
    own dtype (so ``p_final`` is the model's own probability) and the log-softmax, credits
    and delta in float32; completeness holds to 1e-6 against those float32 probabilities.
    Models dispatched with accelerate (``device_map``, CPU / disk offload, parameters on
    ``meta``) work: residuals are moved to the readout's execution device. The model runs in
    eval mode and is handed back with its modes, ``requires_grad`` flags and ``.grad``
    untouched (DESIGN.md section 3, items 4 and 6).

    Raises:
        UnknownArchitectureError: if the decoder blocks or final norm cannot be located.
        ValueError: if a layer is out of range, given twice, or not a decoder block.

    Examples::

        >>> from captum_iglens import IGLens
        >>> lens = IGLens(model)                    # all decoder blocks
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> attr, delta = lens.attribute(ids, return_convergence_delta=True)
        >>> attr.shape                              # [B, k]: one credit per layer
        >>> lens.onset_layers(attr)                 # earliest layer holding half the mass
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerSpec = None,
        readout: Optional[Callable[[Tensor], Tensor]] = None,
        decoder_blocks: Optional[nn.ModuleList] = None,
        check_readout: bool = True,
    ) -> None:
        GradientAttribution.__init__(self, model)
        self.model = model
        self.decoder_blocks = (
            decoder_blocks if decoder_blocks is not None else resolve_decoder_blocks(model)
        )
        self.readout = readout if readout is not None else resolve_readout(model)
        self.layer_indices = self._resolve_layers(layers)
        self.check_readout = check_readout

    # ------------------------------------------------------------------ set-up helpers
    @property
    def num_layers(self) -> int:
        """``n``, the number of decoder blocks."""
        return len(self.decoder_blocks)

    def _resolve_layers(self, layers: LayerSpec) -> tuple[int, ...]:
        n = self.num_layers
        if layers is None:
            return tuple(range(1, n + 1))
        if isinstance(layers, (int, nn.Module)):
            layers = [layers]
        layers = list(layers)
        if not layers:
            raise ValueError("layers is empty: give decoder blocks or hidden-state indices, "
                             "or None for all blocks.")
        get_in = getattr(self.model, "get_input_embeddings", None)
        embedding = get_in() if callable(get_in) else None
        indices: list[int] = []
        for layer in layers:
            if isinstance(layer, nn.Module):
                matches = [i for i, block in enumerate(self.decoder_blocks) if block is layer]
                if matches:
                    index = matches[0] + 1
                elif embedding is not None and layer is embedding:
                    index = 0
                else:
                    raise ValueError(
                        f"Layer {type(layer).__name__} is not one of the model's {n} decoder "
                        "blocks nor its input embedding; pass decoder blocks (e.g. "
                        f"model.model.layers[i]) or hidden-state indices 0..{n}."
                    )
            elif _is_int(layer):
                layer = int(layer)
                index = layer + n + 1 if layer < 0 else layer
                if not 0 <= index <= n:
                    raise ValueError(
                        f"Layer index {layer} is out of range: this model has {n} decoder "
                        f"blocks, so hidden-state indices run from 0 (embedding output) to "
                        f"{n} (last block), or -{n + 1}..-1 from the end."
                    )
            else:
                raise TypeError(f"A layer must be an int or an nn.Module, got {layer!r}")
            if index in indices:
                raise ValueError(f"Layer {index} is given twice; each layer may appear once.")
            indices.append(index)
        if n not in indices:
            indices.append(n)
        return tuple(sorted(indices))

    def _readout_device(self) -> Optional[torch.device]:
        """Where the readout computes (its accelerate execution device when dispatched with
        offloading, whose parameters sit on ``meta``); ``None`` if unknown."""
        readout = self.readout
        if isinstance(readout, nn.Module):
            return execution_device(readout)
        return None

    def _vocab_size(self) -> Optional[int]:
        """Size of the input vocabulary (from the embedding's shape, valid on ``meta`` too)."""
        get_in = getattr(self.model, "get_input_embeddings", None)
        emb = get_in() if callable(get_in) else None
        size = getattr(emb, "num_embeddings", None)
        if size is None:
            size = getattr(getattr(self.model, "config", None), "vocab_size", None)
        return int(size) if size is not None else None

    # ------------------------------------------------------------------ input handling
    def _forward_params(self) -> Mapping[str, inspect.Parameter]:
        return inspect.signature(self.model.forward).parameters

    def _forward_kwargs(
        self, input_ids: Tensor, additional_forward_args: Any
    ) -> tuple[dict[str, Any], Optional[Tensor]]:
        params = self._forward_params()
        kwargs: dict[str, Any] = {}
        if additional_forward_args is None:
            pass
        elif isinstance(additional_forward_args, Tensor):
            kwargs["attention_mask"] = additional_forward_args
        elif isinstance(additional_forward_args, dict):
            kwargs.update(additional_forward_args)
        elif isinstance(additional_forward_args, (tuple, list)):
            names = [p for p in params if p not in ("input_ids", "self")]
            for name, value in zip(names, additional_forward_args, strict=False):
                if value is not None:
                    kwargs[name] = value
        else:
            raise TypeError(
                "additional_forward_args must be an attention mask tensor, a tuple of "
                "positional arguments or a dict of keyword arguments, got "
                f"{type(additional_forward_args)}"
            )
        mask = kwargs.get("attention_mask")
        if mask is not None:
            if mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask has shape {tuple(mask.shape)}, expected "
                    f"{tuple(input_ids.shape)} (the shape of inputs)."
                )
            if "position_ids" in params and "position_ids" not in kwargs:
                position_ids = mask.long().cumsum(-1) - 1
                kwargs["position_ids"] = position_ids.clamp(min=0)
        if "use_cache" in params:
            kwargs["use_cache"] = False
        return kwargs, mask

    def _check_inputs(self, inputs: Tensor) -> Tensor:
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a tensor of token ids [B, S], got {type(inputs)}")
        if inputs.dim() != 2:
            raise ValueError(
                f"inputs must be token ids of shape [B, S], got shape {tuple(inputs.shape)}; "
                "use inputs.unsqueeze(0) for a single sequence."
            )
        if inputs.dtype.is_floating_point or inputs.dtype == torch.bool:
            raise TypeError(f"inputs must be integer token ids, got dtype {inputs.dtype}")
        if inputs.shape[1] == 0 or inputs.shape[0] == 0:
            raise ValueError(
                f"inputs is empty (shape {tuple(inputs.shape)}): give at least one token."
            )
        vocab = self._vocab_size()
        if vocab is not None and (inputs.min() < 0 or inputs.max() >= vocab):
            bad = inputs[(inputs < 0) | (inputs >= vocab)].unique().tolist()
            raise ValueError(
                f"Token ids {bad[:5]} are outside the vocabulary (ids 0..{vocab - 1}); was "
                "the input tokenised with this model's tokenizer?"
            )
        return inputs

    @staticmethod
    def _normalise_positions(positions: PositionSpec, seq_len: int) -> tuple[list[int], bool]:
        if isinstance(positions, Tensor):
            if positions.is_floating_point() or positions.dtype == torch.bool:
                raise TypeError(f"positions must be integers, got a {positions.dtype} tensor.")
            positions = positions.item() if positions.dim() == 0 else positions.tolist()
        if isinstance(positions, np.ndarray):
            positions = positions.tolist()
        single = _is_int(positions)
        if not single and not isinstance(positions, (list, tuple, range)):
            raise TypeError(f"positions must be an int or a sequence of ints, got {positions!r}.")
        raw = [positions] if single else list(positions)  # type: ignore[arg-type]
        if not raw:
            raise ValueError("positions is empty: give at least one position.")
        out = []
        for pos in raw:
            if not _is_int(pos):
                raise TypeError(f"Positions must be integers, got {pos!r}.")
            pos = int(pos)
            index = pos + seq_len if pos < 0 else pos
            if not 0 <= index < seq_len:
                raise ValueError(
                    f"Position {pos} is outside the sequence of length {seq_len} "
                    f"(valid: {-seq_len}..{seq_len - 1})."
                )
            out.append(index)
        return out, single

    @staticmethod
    def _normalise_target(
        target: TargetSpec, batch: int, n_pos: int, default: Tensor, vocab: int
    ) -> Tensor:
        if target is None:
            return default
        tgt = torch.as_tensor(target, device=default.device)
        if tgt.is_floating_point() or tgt.is_complex() or tgt.dtype == torch.bool:
            raise TypeError(
                f"target must be integer token ids, got {tgt.dtype}; for text use "
                "captum_iglens.text.target_token_id(tokenizer, text)."
            )
        tgt = tgt.long()
        if tgt.dim() == 0:
            tgt = tgt.expand(batch, n_pos)
        elif tgt.dim() == 1:
            if tgt.shape[0] != batch:
                raise ValueError(
                    f"target has {tgt.shape[0]} entries but there are {batch} inputs; give "
                    "target of shape [B] or [B, P]."
                )
            tgt = tgt[:, None].expand(batch, n_pos)
        elif tuple(tgt.shape) != (batch, n_pos):
            raise ValueError(
                f"target has shape {tuple(tgt.shape)}, expected [B]={batch} or "
                f"[B, P]=[{batch}, {n_pos}]."
            )
        if tgt.min() < 0 or tgt.max() >= vocab:
            bad = tgt[(tgt < 0) | (tgt >= vocab)].unique().tolist()
            raise ValueError(
                f"Target token ids {bad[:5]} are outside the vocabulary (ids 0..{vocab - 1})."
            )
        return tgt.contiguous()

    def _baseline(
        self,
        baselines: BaselineSpec,
        states: dict[int, Tensor],
        positions: list[int],
        mask: Optional[Tensor],
        hidden: Tensor,
    ) -> Tensor:
        batch, n_pos, _, d = hidden.shape
        if isinstance(baselines, str):
            if baselines == "zero":
                return torch.zeros_like(hidden[:, :, 0])
            if baselines == "embedding":
                return states[0][:, positions]
            if baselines == "mean":
                first = states[self.layer_indices[0]]
                if mask is None:
                    mean = first.mean(dim=1)
                else:
                    weights = mask.to(device=first.device, dtype=first.dtype)[..., None]
                    mean = (first * weights).sum(1) / weights.sum(1).clamp(min=1)
                return mean[:, None, :].expand(batch, n_pos, d)
            raise ValueError(
                f"Unknown baseline {baselines!r}: use one of {BASELINES} or a tensor."
            )
        if not isinstance(baselines, Tensor):
            raise TypeError(f"baselines must be a string or a tensor, got {type(baselines)}")
        seq_len = states[self.layer_indices[-1]].shape[1]
        if not bool(torch.isfinite(baselines).all()):
            raise ValueError("The baseline tensor contains NaN or inf: give finite values.")
        base = baselines.to(device=hidden.device, dtype=hidden.dtype)
        if base.dim() == 1 and base.shape[0] == d:
            return base.expand(batch, n_pos, d)
        if base.dim() == 2 and tuple(base.shape) == (batch, d):
            return base[:, None, :].expand(batch, n_pos, d)
        if base.dim() == 3 and tuple(base.shape) == (batch, n_pos, d):
            return base
        if base.dim() == 3 and tuple(base.shape) == (batch, seq_len, d):
            return base[:, positions]
        raise ValueError(
            f"A baseline tensor must have shape [d]=[{d}], [B, d]=[{batch}, {d}], "
            f"[B, P, d]=[{batch}, {n_pos}, {d}] or [B, S, d]=[{batch}, {seq_len}, {d}] in "
            f"residual space; got {tuple(base.shape)}."
        )

    # ------------------------------------------------------------------ readout
    def _chunk_rows(self, internal_batch_size: Optional[int], vocab: int) -> int:
        if internal_batch_size is None:
            return max(1, (1 << 24) // max(vocab, 1))
        if not _is_int(internal_batch_size) or internal_batch_size < 1:
            raise ValueError(
                f"internal_batch_size must be an int >= 1, got {internal_batch_size!r}"
            )
        return int(internal_batch_size)

    def _target_log_probs(self, points: Tensor, targets: Tensor) -> Tensor:
        logits = self.readout(points)
        out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        log_probs = torch.log_softmax(logits.to(out_dtype), dim=-1)
        return log_probs.gather(-1, targets[:, None].to(log_probs.device))[:, 0]

    def _readout_probs(self, points: Tensor, targets: Tensor, chunk: int) -> Tensor:
        """``f_target(points)`` for ``points`` ``[N, d]``, chunked; returns ``[N]``."""
        out = []
        with torch.no_grad():
            for start in range(0, points.shape[0], chunk):
                rows, tgt = _pad_rows(points[start:start + chunk], targets[start:start + chunk])
                n_real = min(chunk, points.shape[0] - start)
                out.append(self._target_log_probs(rows, tgt)[:n_real].exp())
        return torch.cat(out)

    # ------------------------------------------------------------------ forward pass
    def _capture(
        self,
        inputs: Tensor,
        target: TargetSpec,
        positions: PositionSpec,
        baselines: BaselineSpec,
        additional_forward_args: Any,
    ) -> tuple[_Capture, bool]:
        inputs = self._check_inputs(inputs)
        batch, seq_len = inputs.shape
        pos_list, single = self._normalise_positions(positions, seq_len)
        kwargs, mask = self._forward_kwargs(inputs, additional_forward_args)
        if mask is not None:
            padded = (mask[:, pos_list] == 0).nonzero()
            if padded.numel():
                row, col = padded[0].tolist()
                raise ValueError(
                    f"Position {pos_list[col]} of row {row} is padding (attention_mask is 0 "
                    "there): explain positions of real tokens; with left padding, negative "
                    "positions such as -1 address the last tokens of every row."
                )
        needed = set(self.layer_indices)
        if isinstance(baselines, str) and baselines == "embedding":
            needed.add(0)
        device = self._readout_device()
        # Only the explained positions need the model's own logits (for Invariant R and the
        # default target): skip the unembedding elsewhere where the model supports it.
        keep_only = len(pos_list) < seq_len and "logits_to_keep" in self._forward_params()
        if keep_only and "logits_to_keep" not in kwargs:
            kwargs["logits_to_keep"] = torch.tensor(pos_list, device=inputs.device)
        finite: dict[int, Tensor] = {}
        with model_state_preserved(self.model), torch.no_grad():
            with capture_residual_stream(
                self.decoder_blocks, needed, device, finite=finite, mask=mask
            ) as states:
                output = self.model(inputs, **kwargs)
        logits = output.logits if hasattr(output, "logits") else output[0]
        self._check_finite(finite)
        if logits.shape[1] == seq_len:
            logits = logits[:, pos_list]
        if device is not None:
            logits = logits.to(device)
        out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        log_probs = torch.log_softmax(logits.to(out_dtype), dim=-1)
        tgt = self._normalise_target(
            target, batch, len(pos_list), log_probs.argmax(-1), log_probs.shape[-1]
        )
        model_probs = log_probs.gather(-1, tgt[..., None])[..., 0].exp()
        hidden = torch.stack([states[i][:, pos_list] for i in self.layer_indices], dim=2)
        base = self._baseline(baselines, states, pos_list, mask, hidden)
        return _Capture(hidden, base, tgt, model_probs, pos_list), single

    def _block_name(self, index: int) -> str:
        """``"decoder block l (path)"`` for hidden-state index ``l``, path inside the model."""
        block = self.decoder_blocks[index - 1]
        path = next((name for name, mod in self.model.named_modules() if mod is block), "")
        return f"decoder block {index}" + (f" ({path})" if path else "")

    def _check_finite(self, finite: dict[int, Tensor]) -> None:
        """Raise naming the first hidden-state index whose residual holds NaN or inf."""
        for index in sorted(finite):
            if not bool(finite[index]):
                if index == 0:
                    where = "the embedding output, the input of decoder block 1"
                else:
                    where = f"the output of {self._block_name(index)}"
                raise FloatingPointError(
                    f"The residual stream at hidden-state index {index} ({where}) contains NaN "
                    "or inf (first such layer); the model overflows on this input (try float32 "
                    "or bfloat16 instead of float16) or that block's weights are corrupt."
                )

    def _check_readout(self, p_final: Tensor, model_probs: Tensor, node_probs: Tensor) -> None:
        if not bool(torch.isfinite(node_probs).all()):
            name = getattr(self.readout, "name", "") or type(self.model).__name__
            raise FloatingPointError(
                f"The lens readout (final norm + unembedding of {name!r}) returned NaN or inf "
                "for finite residuals; its weights are corrupt or it overflows in this dtype."
            )
        if not self.check_readout:
            return
        tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(self._model_dtype(), 2e-2)
        diff = (p_final - model_probs.to(p_final.device)).abs()
        err = float("inf") if not bool(torch.isfinite(diff).all()) else diff.max().item()
        if err > tol:
            name = getattr(self.readout, "name", "") or type(self.model).__name__
            raise ReadoutMismatchError(
                f"Invariant R failed for architecture {name!r}: the lens readout of the last "
                f"block's residual differs from the model's own probability by {err:.3g} "
                f"(tolerance {tol:g}). The resolved final norm / unembedding do not reproduce "
                "this model's logits; pass IGLens(model, readout=...) with a callable that maps "
                "a pre-final-norm residual [..., d] to the model's logits [..., V]."
            )

    def _model_dtype(self) -> torch.dtype:
        for param in self.model.parameters():
            if param.is_floating_point():
                return param.dtype
        return torch.float32

    # ------------------------------------------------------------------ estimators
    def _node_probs(self, cap: _Capture, chunk: int) -> Tensor:
        """``f`` at ``[b, h_{L_1}, ..., h_{L_k}]``: ``[B, P, k + 1]``."""
        nodes = torch.cat([cap.baseline[:, :, None], cap.hidden], dim=2)
        batch, n_pos, n_nodes, d = nodes.shape
        targets = cap.target[:, :, None].expand(batch, n_pos, n_nodes).reshape(-1)
        probs = self._readout_probs(nodes.reshape(-1, d), targets, chunk)
        return probs.view(batch, n_pos, n_nodes)

    def _gradient_credits(
        self, cap: _Capture, method: str, n_steps: int, chunk: int, out_dtype: torch.dtype
    ) -> Tensor:
        """Riemann / Gauss-Legendre IG along each segment: ``[B, P, k]``."""
        if n_steps < 2:
            raise ValueError(f"method={method!r} needs n_steps >= 2, got {n_steps}.")
        step_sizes_fn, alphas_fn = approximation_parameters(method)
        nodes = torch.cat([cap.baseline[:, :, None], cap.hidden], dim=2)
        batch, n_pos, n_nodes, d = nodes.shape
        k = n_nodes - 1
        starts = nodes[:, :, :-1].reshape(-1, d)
        diffs = (nodes[:, :, 1:] - nodes[:, :, :-1]).reshape(-1, d)
        seg_targets = cap.target[:, :, None].expand(batch, n_pos, k).reshape(-1)
        alphas = torch.tensor(alphas_fn(n_steps), dtype=nodes.dtype, device=nodes.device)
        steps = torch.tensor(step_sizes_fn(n_steps), dtype=out_dtype, device=nodes.device)
        n_rows = starts.shape[0] * n_steps
        credits = torch.zeros(starts.shape[0], dtype=out_dtype, device=nodes.device)
        with torch.enable_grad():
            for begin in range(0, n_rows, chunk):
                rows = torch.arange(begin, min(begin + chunk, n_rows), device=nodes.device)
                seg, step = rows // n_steps, rows % n_steps
                points, tgt = _pad_rows(starts[seg] + alphas[step, None] * diffs[seg],
                                        seg_targets[seg])
                points.requires_grad_(True)
                probs = self._target_log_probs(points, tgt).exp()
                (grad,) = torch.autograd.grad(probs.sum(), points)
                grad = grad[: rows.shape[0]]  # rows are independent: padding adds nothing
                contrib = (grad.to(out_dtype) * diffs[seg].to(out_dtype)).sum(-1) * steps[step]
                credits.index_add_(0, seg, contrib)
        return credits.view(batch, n_pos, k)

    def _run(
        self,
        inputs: Tensor,
        target: TargetSpec,
        positions: PositionSpec,
        baselines: BaselineSpec,
        additional_forward_args: Any,
        method: str,
        n_steps: int,
        internal_batch_size: Optional[int],
    ) -> tuple[IGLensOutput, bool]:
        if method not in METHODS:
            raise ValueError(f"Unknown method {method!r}: use one of {METHODS}.")
        if not _is_int(n_steps) or n_steps < 1:
            raise ValueError(f"n_steps must be a positive int, got {n_steps!r}.")
        if method != "prediction_aware" and torch.is_inference_mode_enabled():
            raise RuntimeError(
                f"method={method!r} integrates gradients, which torch.inference_mode() forbids: "
                "call attribute outside inference mode (torch.no_grad() is fine), or use the "
                "default method='prediction_aware', which needs no gradient."
            )
        cap, single = self._capture(inputs, target, positions, baselines, additional_forward_args)
        vocab = self._vocab_size() or 1
        chunk = self._chunk_rows(internal_batch_size, vocab)
        node_probs = self._node_probs(cap, chunk)
        p_base, p_final = node_probs[..., 0], node_probs[..., -1]
        self._check_readout(p_final, cap.model_probs, node_probs)
        if method == "prediction_aware":
            # Interior grid points cancel exactly (DESIGN.md section 1): the credit of a
            # segment is its endpoint difference; differences taken in float64 are exact.
            wide = node_probs.double()
            credits = (wide[..., 1:] - wide[..., :-1]).to(node_probs.dtype)
        else:
            credits = self._gradient_credits(cap, method, n_steps, chunk, node_probs.dtype)
        delta = self._delta(credits, p_final, p_base)
        out = IGLensOutput(
            attributions=credits,
            convergence_delta=delta,
            lens_probs=node_probs[..., 1:],
            p_final=p_final,
            p_baseline=p_base,
            target=cap.target,
            positions=cap.positions,
            layer_indices=self.layer_indices,
        )
        return out, single

    @staticmethod
    def _delta(attributions: Tensor, p_final: Tensor, p_base: Tensor) -> Tensor:
        return attributions.sum(-1) - (p_final - p_base).to(attributions.dtype)

    # ------------------------------------------------------------------ public API
    @log_usage()
    def attribute(  # type: ignore[override]
        self,
        inputs: Tensor,
        target: TargetSpec = None,
        positions: PositionSpec = -1,
        baselines: BaselineSpec = "mean",
        additional_forward_args: Any = None,
        method: str = "prediction_aware",
        n_steps: int = 50,
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: bool = False,
    ) -> Union[Tensor, tuple[Tensor, Tensor]]:
        r"""Attribute the target token's probability to the chosen decoder layers.

        Args:
            inputs (Tensor): Token ids ``[B, S]`` (int64). Left-pad batches and pass the
                attention mask in ``additional_forward_args``.
            target (int, sequence or Tensor, optional): Target token ids, ``[B]`` (same id at
                every position) or ``[B, P]``, or an int for all. ``None`` (default) takes the
                model's argmax next token at each explained position.
            positions (int or sequence of int, optional): The positions whose next-token
                prediction is explained; negative values count from the end. Default: -1.
            baselines (str or Tensor, optional): The path start ``b`` in residual space:
                ``"mean"`` (default; mean over non-padded positions of ``h_{L_1}``),
                ``"zero"``, ``"embedding"`` (``h_0`` at the same position) or a tensor of
                shape ``[d]``, ``[B, d]``, ``[B, P, d]`` or ``[B, S, d]``.
            additional_forward_args (Tensor, tuple or dict, optional): Extra forward
                arguments: an attention mask tensor ``[B, S]``, a tuple of positional
                arguments after ``input_ids`` (attention mask first) or a dict of keyword
                arguments. With an attention mask, ``position_ids`` are derived from it for
                models that take them (left padding).
            method (str, optional): ``"prediction_aware"`` (default, exact, no backward pass)
                or one of Captum's ``riemann_left``, ``riemann_right``, ``riemann_middle``,
                ``riemann_trapezoid``, ``gausslegendre``.
            n_steps (int, optional): Steps per segment for the gradient estimators (>= 2).
                The prediction-aware credits do not depend on it. Default: 50.
            internal_batch_size (int, optional): Residual vectors per readout chunk. Results
                do not depend on it. Default: ``None``, chunks of ``2**24 // V`` rows.
            return_convergence_delta (bool, optional): Also return the delta. Default: False.

        Returns:
            **attributions** or 2-element tuple of **attributions**, **delta**:
            - **attributions** (*Tensor*): ``[B, k]`` for an int ``positions``, else
              ``[B, P, k]``; probability units; float32 (float64 for a float64 model).
            - **delta** (*Tensor*): ``attributions.sum(-1) - delta_p``, ``[B]`` or ``[B, P]``
              (the same as :meth:`compute_convergence_delta`).

        Raises:
            ValueError: empty inputs, token or target ids outside the vocabulary, positions
                outside the sequence, a baseline of the wrong shape, an unknown method.
            FloatingPointError: NaN or inf in a residual (the first such hidden-state index
                and its block's module path are named) or in the readout.
            ReadoutMismatchError: Invariant R fails.

        Examples::

            >>> lens = IGLens(model, layers=[model.model.layers[i] for i in (9, 19, 29)])
            >>> attr, delta = lens.attribute(ids, positions=[-2, -1],
            ...     additional_forward_args=mask, return_convergence_delta=True)
            >>> attr.shape, delta.shape                  # [B, 2, 3], [B, 2]
        """
        out, single = self._run(
            inputs, target, positions, baselines, additional_forward_args,
            method, n_steps, internal_batch_size,
        )
        attributions, delta = out.attributions, out.convergence_delta
        if single:
            attributions, delta = attributions[:, 0], delta[:, 0]
        return (attributions, delta) if return_convergence_delta else attributions

    def attribute_details(
        self,
        inputs: Tensor,
        target: TargetSpec = None,
        positions: PositionSpec = -1,
        baselines: BaselineSpec = "mean",
        additional_forward_args: Any = None,
        method: str = "prediction_aware",
        n_steps: int = 50,
        internal_batch_size: Optional[int] = None,
    ) -> IGLensOutput:
        """Like :meth:`attribute`, returning an :class:`IGLensOutput` with the credits, the
        logit-lens probabilities, ``p_final``, ``p_baseline``, the targets and the delta, all
        with the ``P`` dimension kept. Same arguments and errors as :meth:`attribute`."""
        out, _ = self._run(
            inputs, target, positions, baselines, additional_forward_args,
            method, n_steps, internal_batch_size,
        )
        return out

    def has_convergence_delta(self) -> bool:
        return True

    @log_usage()
    def compute_convergence_delta(  # type: ignore[override]
        self,
        attributions: Tensor,
        inputs: Tensor,
        target: TargetSpec = None,
        positions: PositionSpec = -1,
        baselines: BaselineSpec = "mean",
        additional_forward_args: Any = None,
        internal_batch_size: Optional[int] = None,
    ) -> Tensor:
        """``attributions.sum(-1) - (f(h_n) - f(b))`` per explained prediction.

        Args:
            attributions (Tensor): ``[B, k]`` or ``[B, P, k]`` from :meth:`attribute`.
            inputs, target, positions, baselines, additional_forward_args,
            internal_batch_size: as passed to :meth:`attribute`.

        Returns:
            Tensor: ``[B]`` or ``[B, P]``, in probability units.
        """
        out, single = self._run(
            inputs, target, positions, baselines, additional_forward_args,
            "prediction_aware", 2, internal_batch_size,
        )
        attr = attributions[:, None] if single else attributions
        if tuple(attr.shape) != tuple(out.p_final.shape) + (len(self.layer_indices),):
            expected = ([attr.shape[0]] if single else list(out.p_final.shape)) + [
                len(self.layer_indices)]
            raise ValueError(
                f"attributions has shape {tuple(attributions.shape)}, expected {expected}: "
                f"one credit per chosen layer ({len(self.layer_indices)}) per explained position."
            )
        delta = self._delta(attr.to(out.p_final.device), out.p_final, out.p_baseline)
        return delta[:, 0] if single else delta

    def path_probabilities(
        self,
        inputs: Tensor,
        target: TargetSpec = None,
        positions: PositionSpec = -1,
        baselines: BaselineSpec = "mean",
        additional_forward_args: Any = None,
        n_steps: int = 50,
        internal_batch_size: Optional[int] = None,
    ) -> Tensor:
        """The readout ``f`` on a uniform grid of ``n_steps + 1`` points along each segment.

        The per-step profile inside segments: ``[B, P, k, n_steps + 1]`` (probabilities,
        float32), point ``s`` of segment ``j`` at ``h_{L_{j-1}} + s / n_steps *
        (h_{L_j} - h_{L_{j-1}})``. Summing the observed changes along the last dimension gives
        the prediction-aware credits; this costs ``T * k * (n_steps + 1)`` readouts, which
        :meth:`attribute` avoids.
        """
        if not _is_int(n_steps) or n_steps < 1:
            raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
        cap, _ = self._capture(inputs, target, positions, baselines, additional_forward_args)
        return self._grid_probs(cap, n_steps, self._chunk_rows(internal_batch_size,
                                                                 self._vocab_size() or 1))

    def _grid_probs(self, cap: _Capture, n_steps: int, chunk: int) -> Tensor:
        """``f`` on ``n_steps + 1`` uniform points of every segment: ``[B, P, k, n_steps + 1]``."""
        nodes = torch.cat([cap.baseline[:, :, None], cap.hidden], dim=2)
        batch, n_pos, n_nodes, d = nodes.shape
        alphas = torch.linspace(0, 1, n_steps + 1, dtype=nodes.dtype, device=nodes.device)
        start, end = nodes[:, :, :-1, None], nodes[:, :, 1:, None]
        grid = start + alphas[:, None] * (end - start)  # [B, P, k, n_steps + 1, d]
        targets = cap.target[:, :, None, None].expand(grid.shape[:-1]).reshape(-1)
        probs = self._readout_probs(grid.reshape(-1, d), targets, chunk)
        return probs.view(grid.shape[:-1])

    def onset_layers(self, attributions: Tensor, frac: float = 0.5) -> Tensor:
        """Onset layer ``L*`` per explained prediction: the earliest chosen layer at which the
        cumulative ``|IGL|`` reaches ``frac`` of the total ``|IGL|`` mass (DESIGN.md section 1).

        Args:
            attributions (Tensor): ``[..., k]`` credits from :meth:`attribute`.
            frac (float, optional): Mass fraction in ``(0, 1]``. Default: 0.5.

        Returns:
            Tensor: ``[...]`` int64 hidden-state indices (values of ``layer_indices``).
        """
        return onset_layer_indices(attributions, self.layer_indices, frac)
