"""The benchmark's model-based predictors of one token, per reference group.

A predictor scores every block of one explained token (``[n]``, higher = more important).
Those with a reference get the one that matches the intervention (the pre-registration's
"reference matching the intervention"): group ``"zero"`` (zero ablation, the deletion and
keep curves and the magnitude metric: reference ``"zero"``), group ``"mean"`` (mean and
resample ablation: reference ``"mean"``) and group ``"patch"`` (both patching directions:
the corrupted prompt's ids, contrast ``p(y) - p(foil)``). Computed here:

* readout credit (:class:`~captum_iglens.IGLens` defaults; contrastive from the corrupted
  reference under patching) and the logit-lens level ``f(h_L)`` it returns;
* total effect, position and sequence scope, and AtP (and AtP*'s GradDrop) through
  :func:`~captum_iglens._core.total_effect.run_total`, ``n_steps`` = 8;
* direct logit attribution ``f(h_n) - f(h_n - u_L)``
  (:meth:`~captum_iglens.validate.ablation.BlockAblation.direct_effects`);
* Captum's :class:`~captum.attr.LayerIntegratedGradients` and
  :class:`~captum.attr.LayerConductance` per-layer totals, through the runners of
  :mod:`captum_iglens.compare.runners` (one decoder layer at a time; the reference is the
  blanked input of :func:`~captum_iglens._core.baselines.input_baseline_ids` for the
  ablation groups, the corrupted prompt under patching; the target's probability).

"last layer always", the other prompts' mean drop profile and random are computed from the
drops and a seed (:mod:`~captum_iglens.validate.benchmark.analysis`).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from torch import nn

__all__ = ["CAPTUM_STEPS", "GROUPS", "MODEL_PREDICTORS", "TOTAL_STEPS", "token_predictors"]

#: Reference groups of the model-based predictors.
GROUPS: tuple[str, ...] = ("zero", "mean", "patch")
#: Steps of the total effect's exact split (pre-registered: 8).
TOTAL_STEPS = 8
#: Integration steps of each Captum layer run (compare's default).
CAPTUM_STEPS = 20
#: The model-based predictors, in the pre-registration's names.
MODEL_PREDICTORS: tuple[str, ...] = (
    "readout credit", "total effect (position)", "total effect (sequence)", "AtP", "AtP*",
    "direct logit attribution", "logit-lens level", "LayerIntegratedGradients",
    "LayerConductance")

_TOTAL = {"total effect (position)": ("total", "position", False),
          "total effect (sequence)": ("total", "sequence", False),
          "AtP": ("atp", "position", False), "AtP*": ("atp", "position", True)}
_CAPTUM = {"LayerIntegratedGradients": "layer_integrated_gradients",
           "LayerConductance": "layer_conductance"}


def _total(model: nn.Module, ids: torch.Tensor, reference: Any, pos: int, y: int,
           foil: Optional[int], effect: str, scope: str, grad_drop: bool) -> np.ndarray:
    from captum_iglens._core.total_effect import run_total
    from captum_iglens.ig_lens import IGLens
    from captum_iglens.settings import DEFAULT_METHOD

    spec = IGLens(model, effect=effect).spec
    contrast = None if foil is None else torch.tensor([[foil]])
    out, _ = run_total(spec, ids, reference, torch.tensor([[y]]), None, TOTAL_STEPS,
                       DEFAULT_METHOD, None, [pos], contrast=contrast, scope=scope,
                       grad_drop=grad_drop)
    return out.attributions[0, 0].detach().double().cpu().numpy()


def _captum(model: nn.Module, blocks: nn.ModuleList, ids: torch.Tensor,
            reference: torch.Tensor, pos: int, y: int, method: str, steps: int) -> np.ndarray:
    """Captum's layer method on each block's output, summed at the explained position.

    One block at a time (compare's residual tap and target-probability forward); the
    attribution is summed over the hidden dimension at the explained position.

    Summed over every position instead, LayerIntegratedGradients on a residual-stream cut
    gives every block the same total ``F(x) - F(x')`` (completeness): the explained
    position's share is what the pre-registration names.
    """
    from captum.attr import LayerConductance, LayerIntegratedGradients

    from captum_iglens.compare.runners import target_probability_forward
    from captum_iglens.lens.architectures import input_embeddings
    from captum_iglens.lens.hooks import residual_tap

    use_embeds = method == "layer_conductance"
    forward = target_probability_forward(model, pos, y, use_embeds)
    x, xb = ids, reference
    if use_embeds:
        embed = input_embeddings(model)
        with torch.no_grad():
            x, xb = embed(x), embed(xb)  # type: ignore[misc]  # a causal LM has input embeddings
    out = []
    for index in range(1, len(blocks) + 1):
        with residual_tap(blocks, index) as layer:
            algo = (LayerConductance if use_embeds else LayerIntegratedGradients)(forward, layer)
            attr = algo.attribute(x, baselines=xb,
                                  additional_forward_args=(torch.ones_like(ids),),
                                  n_steps=steps, method="gausslegendre")
        attr = attr[0] if isinstance(attr, tuple) else attr
        out.append(float(attr.detach()[0, pos].double().sum()))
    return np.array(out)


def token_predictors(model: nn.Module, tokenizer: Any, ablation: Any, trace: Any,
                     clean: list[int], corrupted: list[int], y: int, foil: int, patch: Any,
                     captum_steps: int = CAPTUM_STEPS,
                     errors: Optional[dict[str, str]] = None
                     ) -> dict[str, dict[str, np.ndarray]]:
    """Every model-based predictor of one pair's clean token, per reference group.

    Args:
        model (nn.Module): The causal LM (eval mode).
        tokenizer: Its tokenizer (the blanked Captum reference).
        ablation (BlockAblation): On the model.
        trace (ResidualTrace): The clean prompt's trace.
        clean (list of int): The clean prompt's token ids.
        corrupted (list of int): The corrupted prompt's (as many).
        y (int): The answer's token id.
        foil (int): The foil's.
        patch (PairPatch): :func:`~captum_iglens.validate.patching.patch_pair`'s result (its
            contrastive readout credit, lens and direct effects are the patch group's).
        captum_steps (int, optional): Steps of each Captum layer run.
        errors (dict, optional): Filled with ``"group/predictor" -> message`` for a predictor
            that refused the input (its row is then NaN: "not available").

    Returns:
        dict: group (:data:`GROUPS`) -> predictor name -> ``[n]`` float64 (probability
        units; contrastive under patching).
    """
    from captum_iglens._core.baselines import input_baseline_ids
    from captum_iglens.ig_lens import IGLens

    errors = {} if errors is None else errors
    pos = len(clean) - 1
    n = ablation.num_layers
    device = next(model.parameters()).device
    ids = torch.tensor([clean], device=device)
    corr = torch.tensor([corrupted], device=device)
    blank = input_baseline_ids(model, ids, tokenizer=tokenizer)
    details = IGLens(model).attribute_details(ids, target=torch.tensor([[y]]), positions=[pos])
    direct = ablation.direct_effects(trace, [pos], torch.tensor([y]))[0].double().numpy()
    out: dict[str, dict[str, np.ndarray]] = {}
    for group in GROUPS:
        found: dict[str, np.ndarray] = {}
        if group == "patch":
            found["readout credit"] = patch.credits.double().numpy()
            found["logit-lens level"] = patch.lens.double().numpy()
            found["direct logit attribution"] = patch.direct.double().numpy()
        else:
            found["readout credit"] = details.attributions[0, 0].double().cpu().numpy()
            found["logit-lens level"] = details.lens_probs[0, 0].double().cpu().numpy()
            found["direct logit attribution"] = direct
        reference: Any = corr if group == "patch" else group
        for name, (effect, scope, grad_drop) in _TOTAL.items():
            try:
                found[name] = _total(model, ids, reference, pos, y,
                                     foil if group == "patch" else None, effect, scope,
                                     grad_drop)
            except ValueError as err:
                errors[f"{group}/{name}"] = str(err)
                found[name] = np.full(n, np.nan)
        for name, method in _CAPTUM.items():
            if group == "mean" and "zero" in out:  # the same reference as the zero group
                found[name] = out["zero"][name]
                continue
            ref = corr if group == "patch" else blank
            found[name] = _captum(model, ablation.blocks, ids, ref, pos, y, method,
                                  captum_steps)
        out[group] = {k: found[k] for k in MODEL_PREDICTORS}
    return out
