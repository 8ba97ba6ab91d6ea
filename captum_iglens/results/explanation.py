"""IGLensResult: the token x layer map of one explained answer, with its export."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import Tensor

from captum_iglens.results._format import layer_names, shorten

__all__ = ["IGLensResult"]


@dataclass
class IGLensResult:
    """IG-Lens over every answer token of one prompt (``T`` tokens, ``k`` chosen layers).

    Probabilities and credits are in probability units (not logits), float32 CPU tensors.

    Attributes:
        prompt (str): The user's prompt, before any chat template.
        answer (str): The generated answer, special tokens removed.
        prompt_length (int): Number of prompt tokens (after the chat template).
        input_ids (list[int]): Prompt + answer token ids, the teacher-forced sequence.
        tokens (list[str]): The ``T`` answer tokens, each decoded on its own.
        token_ids (list[int]): Their ids (the targets).
        positions (list[int]): Position in ``input_ids`` whose next-token prediction is each
            answer token (``prompt_length - 1 + t``).
        layer_indices (list[int]): The ``k`` hidden-state indices (0 = embedding output,
            ``n`` = last decoder block).
        attributions (Tensor): ``[T, k]`` IG-Lens credit per layer.
        lens_probs (Tensor): ``[T, k]`` logit-lens probability of the token at each layer.
        p_final (Tensor): ``[T]`` the model's probability of the token (Invariant R).
        p_baseline (Tensor): ``[T]`` the readout at the baseline.
        convergence_delta (Tensor): ``[T]`` ``attributions.sum(-1) - delta_p``.
        onset_layers (list[int]): Onset layer per token (hidden-state index).
        method (str), baseline (str), n_steps (int), onset_frac (float): the settings used.
        model_name (str): What was explained.
        chat_template_used (bool): Whether the tokenizer's chat template wrapped the prompt.
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
    onset_layers: list[int]
    method: str = "prediction_aware"
    baseline: str = "mean"
    n_steps: int = 50
    onset_frac: float = 0.5
    model_name: str = ""
    chat_template_used: bool = False
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def delta_p(self) -> Tensor:
        """``[T]`` ``p_final - p_baseline``: what each token's credits add up to."""
        return self.p_final - self.p_baseline

    @property
    def completeness_error(self) -> float:
        """``max_t |sum_j IGL_tj - delta_p_t|`` (Invariant C), in probability units."""
        return float(self.convergence_delta.abs().max()) if self.tokens else 0.0

    @property
    def layer_names(self) -> list[str]:
        """``"emb"`` for index 0, ``"L<l>"`` for the output of block ``l``."""
        return layer_names(self.layer_indices)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: settings, ``input_ids``, and one entry per answer token."""
        tokens = []
        for t, token in enumerate(self.tokens):
            tokens.append(
                {
                    "token": token,
                    "token_id": int(self.token_ids[t]),
                    "position": int(self.positions[t]),
                    "attributions": [float(x) for x in self.attributions[t]],
                    "lens_probs": [float(x) for x in self.lens_probs[t]],
                    "p_final": float(self.p_final[t]),
                    "p_baseline": float(self.p_baseline[t]),
                    "delta_p": float(self.delta_p[t]),
                    "sum_attributions": float(self.attributions[t].sum()),
                    "convergence_delta": float(self.convergence_delta[t]),
                    "onset_layer": int(self.onset_layers[t]),
                }
            )
        return {
            "model": self.model_name,
            "prompt": self.prompt,
            "answer": self.answer,
            "chat_template_used": self.chat_template_used,
            "prompt_length": int(self.prompt_length),
            "input_ids": [int(i) for i in self.input_ids],
            "layers": [int(i) for i in self.layer_indices],
            "method": self.method,
            "baseline": self.baseline,
            "n_steps": int(self.n_steps),
            "onset_frac": float(self.onset_frac),
            "tokens": tokens,
            "completeness_max_abs_error": self.completeness_error,
            **self.extras,
        }

    def to_json(self, path: Optional[str] = None, indent: int = 2) -> str:
        """Serialise :meth:`to_dict` to a JSON string, and write it to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        return text

    def format_table(self, tokens_per_block: int = 5) -> str:
        """The layer x token table as text.

        Per token the IG credit and the logit-lens probability at each layer, then the sum,
        ``delta_p`` and onset layer per token.
        """
        lines: list[str] = []
        names = self.layer_names
        for begin in range(0, len(self.tokens), tokens_per_block):
            cols = list(range(begin, min(begin + tokens_per_block, len(self.tokens))))
            head = f"{'layer':>6} |" + "".join(
                f" {shorten(repr(self.tokens[t]), 19):>19} |" for t in cols
            )
            sub = f"{'':>6} |" + "".join(f" {'IG':>9} {'lens p':>9} |" for _ in cols)
            lines += [head, sub, "-" * len(head)]
            for j, name in enumerate(names):
                row = f"{name:>6} |"
                for t in cols:
                    credit, level = float(self.attributions[t, j]), float(self.lens_probs[t, j])
                    row += f" {credit:+9.5f} {level:9.5f} |"
                lines.append(row)
            lines.append("-" * len(head))
            for label, values in (
                ("sum", [float(self.attributions[t].sum()) for t in cols]),
                ("Δp", [float(self.delta_p[t]) for t in cols]),
                ("p", [float(self.p_final[t]) for t in cols]),
            ):
                lines.append(f"{label:>6} |" + "".join(f" {v:+19.6f} |" for v in values))
            lines.append(
                f"{'onset':>6} |"
                + "".join(
                    f" {names[self.layer_indices.index(self.onset_layers[t])]:>19} |" for t in cols
                )
            )
            lines.append("")
        lines.append(
            f"completeness: max |sum - Δp| = {self.completeness_error:.3e} "
            f"over {len(self.tokens)} tokens ({self.method}, baseline={self.baseline})"
        )
        return "\n".join(lines)

    def to_captum(self) -> Any:
        """This result as a ``captum.attr.LLMAttributionResult``.

        Layer names are the input tokens, answer tokens the output tokens, ``token_attr`` the
        ``[T, k]`` credits, ``seq_attr`` their ``[k]`` sum over tokens;
        ``plot_token_attr()`` draws the token x layer heatmap. See
        :func:`captum_iglens.plot.result_to_captum`.
        """
        from captum_iglens.plot import result_to_captum

        return result_to_captum(self)

    def plot(self, path: Optional[str] = None, **kwargs: Any) -> Any:
        """Token x layer heatmap and the logit-lens trajectory per token.

        The heatmap is diverging, centred at 0, with the onset marked. Returns the matplotlib
        ``Figure`` and saves it to ``path`` if given. See
        :func:`captum_iglens.plot.plot_result`.
        """
        from captum_iglens.plot import plot_result

        fig = plot_result(self, **kwargs)
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig

    def __str__(self) -> str:
        """The answer and the table."""
        return f"answer: {self.answer!r}\n" + self.format_table()
