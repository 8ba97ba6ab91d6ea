"""IGLensResult: the token x layer map of one explained answer, with its export."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import torch
from torch import Tensor

from captum_iglens._utils.format import layer_names
from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_METHOD,
    DEFAULT_N_STEPS,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    DEFAULT_SCOPE,
    DEFAULT_UNITS,
)

__all__ = ["IGLensResult"]

_TENSORS = ("attributions", "lens_probs", "p_final", "p_baseline", "convergence_delta")


@dataclass(frozen=True)
class IGLensResult:
    """IG-Lens over every answer token of one prompt (``T`` tokens, ``k`` chosen layers).

    Probabilities and credits are in the readout's units (``units``: probability by default,
    or log-probability in nats), float32 CPU tensors. A contrastive result (``contrast_ids``
    set, :attr:`contrastive`) decomposes ``F = p(token) - p(foil)`` per token (log units:
    ``log p(token) - log p(foil)``, nats): ``attributions``, ``lens_probs``, ``p_final``,
    ``p_baseline`` and the delta then hold values and changes of ``F``.

    Attributes:
        prompt (str): The user's prompt, before any chat template.
        answer (str): The explained answer, special tokens removed.
        prompt_length (int): Number of prompt tokens (after the chat template).
        input_ids (list[int]): Prompt + answer token ids, the teacher-forced sequence.
        tokens (list[str]): The ``T`` answer tokens, readable (partial UTF-8 pieces named).
        token_ids (list[int]): Their ids (the targets).
        positions (list[int]): Position in ``input_ids`` whose next-token prediction is each
            answer token (``prompt_length - 1 + t``).
        layer_indices (list[int]): The ``k`` hidden-state indices (0 = embedding output,
            ``n`` = last decoder block).
        attributions (Tensor): ``[T, k]`` IG-Lens credit per layer.
        lens_probs (Tensor): ``[T, k]`` logit-lens readout of the token at each layer.
        p_final (Tensor): ``[T]`` the model's probability of the token.
        p_baseline (Tensor): ``[T]`` the readout at the baseline. These three, the credits
            and the delta are in ``units`` (log-probabilities in nats for
            ``"log-probability"``, in the JSON too); ``top_k_probs`` are always probabilities.
        convergence_delta (Tensor): ``[T]`` ``attributions.sum(-1) - delta_p``.
        onset_layers (list): Onset layer per token (hidden-state index, int); None for
            ``effect="atp"`` (its estimates do not add up: no onset; JSON null).
        method, baseline, n_steps, onset_frac, onset_rule: the settings used.
        model_name (str): The model's name (never a local path).
        chat_template_used (bool): Whether the tokenizer's chat template wrapped the prompt.
        rendered_prompt (str): The exact prompt text the model saw (template applied).
        template_uses_clock (bool): The chat template writes today's date (unless pinned).
        baseline_description (str): What the baseline is, in words.
        is_argmax (list[bool]): Per token, whether it is the argmax of the explained forward.
        generated (bool): The answer was generated (greedy), not given.
        truncated (bool): Generation stopped at ``max_new_tokens`` before an end token.
        max_new_tokens (int, optional): The generation limit.
        units (str): ``"probability"`` or ``"log-probability"`` (nats).
        top_k_ids (Tensor, optional): ``[T, k, K]`` the levels' readout's top tokens per layer.
        top_k_probs (Tensor, optional): ``[T, k, K]`` their probabilities.
        top_k_tokens (list, optional): ``T x k x K`` readable top tokens.
        contrast_ids (list[int], optional): One foil token id per answer token; ``None``
            when the result is not contrastive.
        contrast_tokens (list[str], optional): The foils, readable (one per answer token).
        granularity (str): ``"block"`` or ``"sublayer"``: then ``layer_indices`` (and
            ``onset_layers``) are sub-layer node indices, ``2l - 1`` for ``"L<l>.attn"``
            and ``2l`` for ``"L<l>.mlp"`` (:attr:`layer_names`; the JSON's
            ``"layer_names"``).
        head_credits (Tensor, optional): ``[T, A, H]`` per-head credits of the attention
            segments (``heads=True``); ``head_rest`` ``[T, A]`` what the heads do not hold.
        effect (str): ``"readout"`` (IG-Lens's readout credits), ``"total"`` (total-effect
            credits: each block's exact share of ``p_final - p_baseline``, ``p_baseline``
            the probability with every chosen update at its reference) or ``"atp"``
            (attribution patching's estimates: not a decomposition; ``convergence_delta``
            is their gap to ``delta_p``).
        lens_change (Tensor, optional): ``[T, k]`` with a per-layer readout (``lens=`` of
            :class:`~captum_iglens.IGLens`): the lens terms ``g_{L_j}(h_{L_{j-1}}) -
            g_{L_{j-1}}(h_{L_{j-1}})``; credits plus lens terms add up to ``delta_p``
            (JSON: ``"lens_change"`` per token). None for the logit lens.
        lens (dict, optional): Which per-layer readout (JSON: top-level ``"lens"``; ``kind``
            ``"tuned"``, ``"jacobian"`` or ``"custom"``, and a fitted lens's ``digest``,
            ``model_digest``, ``settings_key``, ``source``:
            :func:`~captum_iglens.lens.layer_readout.lens_identity`). None for the logit lens.
        scope (str): Where a total-effect or AtP lens's gates acted: ``"position"`` or
            ``"sequence"``. grad_drop (bool): AtP* (GradDrop; ``method`` ``"atp*"``). The
            JSON holds each only away from its default, as ``effect`` and ``granularity``.

    Raises:
        ValueError: on construction, if the shapes do not agree.
    """

    prompt: str
    answer: str
    prompt_length: int
    input_ids: list[int]
    tokens: list[str]
    token_ids: list[int]
    positions: list[int]
    layer_indices: list[int]
    attributions: Tensor
    lens_probs: Tensor
    p_final: Tensor
    p_baseline: Tensor
    convergence_delta: Tensor
    onset_layers: list[Optional[int]]
    method: str = DEFAULT_METHOD
    baseline: str = DEFAULT_BASELINE
    n_steps: int = DEFAULT_N_STEPS
    onset_frac: float = DEFAULT_ONSET_FRAC
    model_name: str = ""
    chat_template_used: bool = False
    extras: dict[str, Any] = field(default_factory=dict)
    onset_rule: str = DEFAULT_ONSET_RULE
    rendered_prompt: str = ""
    template_uses_clock: bool = False
    baseline_description: str = ""
    is_argmax: list[bool] = field(default_factory=list)
    generated: bool = False
    truncated: bool = False
    max_new_tokens: Optional[int] = None
    units: str = DEFAULT_UNITS
    top_k_ids: Optional[Tensor] = None
    top_k_probs: Optional[Tensor] = None
    top_k_tokens: Optional[list] = None
    contrast_ids: Optional[list[int]] = None
    contrast_tokens: Optional[list[str]] = None
    granularity: str = DEFAULT_GRANULARITY
    head_credits: Optional[Tensor] = None
    head_rest: Optional[Tensor] = None
    effect: str = DEFAULT_EFFECT
    lens_change: Optional[Tensor] = None
    lens: Optional[dict[str, Any]] = None
    scope: str = DEFAULT_SCOPE
    grad_drop: bool = False

    def __post_init__(self) -> None:
        """Check that the per-token tensors and lists agree with ``T`` and ``k``."""
        n_tok, k = len(self.tokens), len(self.layer_indices)
        if self.effect == "atp":  # its estimates do not add up: no onset (older files too)
            object.__setattr__(self, "onset_layers", [None] * len(self.onset_layers))
        for name in ("attributions", "lens_probs"):
            if tuple(getattr(self, name).shape) != (n_tok, k):
                raise ValueError(f"IGLensResult.{name} has shape "
                                 f"{tuple(getattr(self, name).shape)}, expected {(n_tok, k)}.")
        for name in ("p_final", "p_baseline", "convergence_delta"):
            if tuple(getattr(self, name).shape) != (n_tok,):
                raise ValueError(f"IGLensResult.{name} has shape "
                                 f"{tuple(getattr(self, name).shape)}, expected ({n_tok},).")
        for name in ("token_ids", "positions", "onset_layers", "contrast_ids",
                     "contrast_tokens"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n_tok:
                raise ValueError(f"IGLensResult.{name} has {len(getattr(self, name))} entries "
                                 f"for {n_tok} tokens.")

    @property
    def delta_p(self) -> Tensor:
        """``[T]`` ``p_final - p_baseline``: what each token's credits add up to."""
        return self.p_final - self.p_baseline

    @property
    def contrastive(self) -> bool:
        """Whether the values are ``p(token) - p(foil)`` (``contrast_ids`` set)."""
        return self.contrast_ids is not None

    @property
    def completeness_error(self) -> float:
        """``max_t |sum_j IGL_tj - delta_p_t|`` (Invariant C), in the readout's units."""
        return float(self.convergence_delta.abs().max()) if self.tokens else 0.0

    @property
    def layer_names(self) -> list[str]:
        """``"emb"`` for index 0, ``"L<l>"`` for block ``l`` (sub-layer: ``"L<l>.attn"``)."""
        return layer_names(self.layer_indices, self.granularity)

    def _token_dict(self, t: int) -> dict[str, Any]:
        onset = self.onset_layers[t]
        entry = {
            "token": self.tokens[t],
            "token_id": int(self.token_ids[t]),
            "position": int(self.positions[t]),
            "attributions": [float(x) for x in self.attributions[t]],
            "lens_probs": [float(x) for x in self.lens_probs[t]],
            "p_final": float(self.p_final[t]),
            "p_baseline": float(self.p_baseline[t]),
            "delta_p": float(self.delta_p[t]),
            "sum_attributions": float(self.attributions[t].sum()),
            "convergence_delta": float(self.convergence_delta[t]),
            "onset_layer": None if onset is None else int(onset),  # null: AtP
            "is_argmax": bool(self.is_argmax[t]) if self.is_argmax else None,
        }
        if self.contrast_ids is not None:
            entry["contrast_id"] = int(self.contrast_ids[t])
            entry["contrast_token"] = (self.contrast_tokens[t] if self.contrast_tokens
                                       is not None else None)
        if self.lens_change is not None:
            entry["lens_change"] = self.lens_change[t].tolist()
        if self.head_credits is not None and self.head_rest is not None:
            entry["head_credits"] = self.head_credits[t].tolist()
            entry["head_rest"] = self.head_rest[t].tolist()
        if self.top_k_ids is not None and self.top_k_probs is not None:
            entry["top_k"] = [
                [{"token_id": int(i), "p": float(p)}
                 | ({"token": self.top_k_tokens[t][j][r]} if self.top_k_tokens else {})
                 for r, (i, p) in enumerate(zip(self.top_k_ids[t, j], self.top_k_probs[t, j],
                                                strict=True))]
                for j in range(len(self.layer_indices))
            ]
        return entry

    @property
    def delta_meaning(self) -> str:
        """What ``convergence_delta`` is: a completeness error, or AtP's gap to ``delta_p``."""
        if self.effect == "atp":
            return ("sum of first-order estimates - delta_p: attribution patching is an "
                    "estimate, not a decomposition; this gap is not an error")
        return "sum of credits - delta_p (completeness error)"

    def _effect_fields(self) -> dict[str, Any]:
        """``effect``, ``delta_meaning``, ``scope``, ``grad_drop`` for JSON (defaults: none)."""
        gates = {**({} if self.scope == DEFAULT_SCOPE else {"scope": self.scope}),
                 **({"grad_drop": True} if self.grad_drop else {})}
        if self.effect == DEFAULT_EFFECT:
            return gates
        return {"effect": self.effect, "delta_meaning": self.delta_meaning, **gates}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: settings, ``input_ids``, and one entry per answer token.

        ``"contrastive"`` (top level) says whether the values are ``p(token) - p(foil)``;
        contrastive tokens carry ``"contrast_id"`` and ``"contrast_token"``.
        """
        return {
            "model": self.model_name,
            "prompt": self.prompt,
            "rendered_prompt": self.rendered_prompt,
            "template_uses_clock": self.template_uses_clock,
            "answer": self.answer,
            "generated": self.generated,
            "truncated": self.truncated,
            "max_new_tokens": self.max_new_tokens,
            "chat_template_used": self.chat_template_used,
            "prompt_length": int(self.prompt_length),
            "input_ids": [int(i) for i in self.input_ids],
            "layers": [int(i) for i in self.layer_indices],
            "units": self.units,
            "contrastive": self.contrastive,
            "method": self.method,
            "baseline": self.baseline,
            "baseline_description": self.baseline_description,
            "n_steps": int(self.n_steps),
            "onset_frac": float(self.onset_frac),
            "onset_rule": self.onset_rule,
            "tokens": [self._token_dict(t) for t in range(len(self.tokens))],
            "completeness_max_abs_error": self.completeness_error,
            **({} if self.granularity == "block" else
               {"granularity": self.granularity, "layer_names": self.layer_names}),
            **self._effect_fields(),
            **({} if self.lens is None else {"lens": self.lens}),
            **self.extras,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IGLensResult:
        """Rebuild a result from :meth:`to_dict` output (not top-k lists, head credits).

        Raises:
            KeyError: a required field is missing.
        """
        tokens = data["tokens"]
        per_token = {
            "tokens": [t["token"] for t in tokens],
            "token_ids": [t["token_id"] for t in tokens],
            "positions": [t["position"] for t in tokens],
            "onset_layers": [t["onset_layer"] for t in tokens],
            "is_argmax": [bool(t["is_argmax"]) for t in tokens
                          if t.get("is_argmax") is not None],
            **_contrast_fields(data),
        }
        k = len(data["layers"])
        tensors = {
            "attributions": torch.tensor([t["attributions"] for t in tokens]).reshape(-1, k),
            "lens_probs": torch.tensor([t["lens_probs"] for t in tokens]).reshape(-1, k),
            "p_final": torch.tensor([t["p_final"] for t in tokens]),
            "p_baseline": torch.tensor([t["p_baseline"] for t in tokens]),
            "convergence_delta": torch.tensor([t["convergence_delta"] for t in tokens]),
            **({"lens_change": torch.tensor([t["lens_change"] for t in tokens]).reshape(-1, k)}
               if tokens and "lens_change" in tokens[0] else {}),
        }
        names = {f.name for f in fields(cls)} - set(per_token) - set(tensors)
        plain = {key: data[key] for key in names if key in data}
        plain["model_name"] = data.get("model", "")
        plain["layer_indices"] = data["layers"]
        return cls(**plain, **per_token, **tensors)  # type: ignore[arg-type]  # fields by name

    def to_json(self, path: Optional[str] = None, indent: int = 2) -> str:
        """Serialise :meth:`to_dict` to a JSON string, and write it to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        return text

    def format_table(self, tokens_per_block: int = 4) -> str:
        """The layer x token table as text, at most 100 columns wide, with a legend.

        Per token the IG credit and the logit-lens readout at each layer, then the sum,
        ``delta_p``, ``p`` and the onset layer (see
        :func:`captum_iglens.results.table.format_explanation`).
        """
        from captum_iglens.results.table import format_explanation

        return format_explanation(self, tokens_per_block)

    def to_captum(self) -> Any:
        """This result as Captum's ``LLMAttributionResult`` (an ``IGLensLLMAttributionResult``).

        Layer names are the input tokens, answer tokens the output tokens, ``token_attr`` the
        ``[T, k]`` credits with the baseline's readout ``-f(b)`` set apart in
        ``baseline_attr``, ``seq_attr`` their ``[k]`` sum over tokens; ``plot_token_attr()``
        draws the labelled token x layer heatmap. See
        :func:`captum_iglens.plot.credits.result_to_captum`.
        """
        from captum_iglens.results.captum_view import IGLensLLMAttributionResult

        return IGLensLLMAttributionResult.from_result(self)

    def to_visualization_records(self, normalize: bool = True) -> list[Any]:
        """One Captum ``VisualizationDataRecord`` per answer token, for ``visualize_text``.

        The "words" are the layers (``b→emb``, ``L1``, ...), coloured by the token's credits
        (each row scaled to its largest ``|credit|`` with ``normalize``, default); the
        record's score is the row's sum (``Δp``), its probability ``p_final``, its
        convergence score the completeness error. See
        :func:`~captum_iglens._utils.display.visualization_records`.

        Examples::

            >>> from captum.attr.visualization import visualize_text
            >>> visualize_text(result.to_visualization_records())
        """
        from captum_iglens._utils.display import layer_labels, visualization_records

        return visualization_records(self.attributions,
                                     layer_labels(self.layer_indices, self.granularity),
                                     self.tokens, self.p_final, self.convergence_delta,
                                     normalize)

    def plot_top_k(self, path: Optional[str] = None, **kwargs: Any) -> Any:
        """The logit lens's top-K tokens at every layer (needs ``explain(..., top_k=K)``).

        Returns the matplotlib ``Figure`` and saves it to ``path`` if given. See
        :func:`captum_iglens.plot.top_k.plot_top_k` for the keyword arguments.
        """
        from captum_iglens.plot.top_k import plot_top_k

        fig = plot_top_k(self, **kwargs)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig

    def plot(self, path: Optional[str] = None, **kwargs: Any) -> Any:
        """Token x layer heatmap and the logit-lens trajectory per token.

        The heatmap is diverging, centred at 0, with the onset marked; ``display="row"`` or
        ``"log-probability"`` keeps unlikely tokens visible. Returns the matplotlib
        ``Figure`` and saves it to ``path`` if given. See
        :func:`captum_iglens.plot.credits.plot_result`.
        """
        from captum_iglens.plot.credits import plot_result

        fig = plot_result(self, **kwargs)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig

    def __str__(self) -> str:
        """The answer and the table."""
        return f"answer: {self.answer!r}\n" + self.format_table()


def _contrast_fields(data: dict[str, Any]) -> dict[str, Any]:
    """``contrast_ids`` / ``contrast_tokens`` of a :meth:`IGLensResult.to_dict` dict."""
    tokens = data["tokens"]
    if not data.get("contrastive") and not any("contrast_id" in t for t in tokens):
        return {}
    names = [t.get("contrast_token") for t in tokens]
    return {"contrast_ids": [int(t["contrast_id"]) for t in tokens],
            "contrast_tokens": names if all(n is not None for n in names) else None}
