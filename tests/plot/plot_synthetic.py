"""Synthetic IG-Lens results for figure tests: exact levels, credits that telescope.

The logit-lens levels are drawn first (float64); the credits are their differences along
the path ``b -> L_1 -> ... -> L_k``, so every row adds up to ``p_final - p_baseline`` up
to the float32 rounding of each value.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from captum_iglens.results import IGLensResult


def synthetic_result(n_tok: int = 4, layer_indices: Optional[Sequence[int]] = None,
                     granularity: str = "block", units: str = "probability",
                     seed: int = 0, low: float = 1e-20,
                     lens: Optional[torch.Tensor] = None) -> IGLensResult:
    """A result whose levels go from ``p_baseline`` (0.05..0.2) to ``low`` at the first layer,
    then 0.2..1, halved at the second layer (a negative credit there); or the given ``lens``
    levels ``[T, k]`` (probabilities, float64).

    With ``units="log-probability"`` the levels and credits are the logs (nats). Onsets sit
    at the last layer; no top-k tokens.
    """
    layers = list(layer_indices if layer_indices is not None else range(1, 5))
    k = len(layers)
    gen = torch.Generator().manual_seed(seed)
    # levels: a tiny start at the first layer (the logit lens far from the output), then up
    if lens is None:
        start = torch.full((n_tok, 1), low, dtype=torch.float64)
        rest = 0.2 + 0.8 * torch.rand(n_tok, k - 1, generator=gen, dtype=torch.float64)
        if k > 2:
            rest[:, 1] = 0.5 * rest[:, 0]  # a dip: the second layer's credit is negative
        lens = torch.cat([start, rest], -1)
    p_baseline = 0.05 + 0.15 * torch.rand(n_tok, generator=gen, dtype=torch.float64)
    levels = torch.cat([p_baseline[:, None], lens], -1)
    if units == "log-probability":
        levels = levels.log()
    credits = levels.diff(dim=-1)
    return IGLensResult(
        prompt="w1 w2", answer=" ".join(f"w{t}" for t in range(n_tok)), prompt_length=2,
        input_ids=list(range(2 + n_tok)), tokens=[f"w{t}" for t in range(n_tok)],
        token_ids=list(range(n_tok)), positions=list(range(1, 1 + n_tok)),
        layer_indices=layers, attributions=credits.float(), lens_probs=levels[:, 1:].float(),
        p_final=levels[:, -1].float(), p_baseline=levels[:, 0].float(),
        convergence_delta=torch.zeros(n_tok), onset_layers=[layers[-1]] * n_tok,
        units=units, granularity=granularity)
