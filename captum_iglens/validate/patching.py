"""Counterfactual patching: does contrastive IG-Lens credit predict what a block carries?

A prompt pair (clean, corrupted) differs in a few tokens and has as many tokens in both, so
positions align ("The capital of France is" / "... of Japan is"); the answer ``y`` fits the
clean prompt and the foil the corrupted one (" Paris" / " Tokyo"). The readout is the
contrast ``F = p(y) - p(foil)`` at the last prompt position ``i`` (probability units).

Patching (denoising): in the corrupted run, block ``L``'s update at ``i`` is replaced by the
clean run's, ``h_L[i] := h_{L-1}[i] + u_L^clean[i]``, the later blocks run on the changed
stream, and the *recovery* is ``F(patched) - F(corrupted)``. The reverse (noising): the
corrupted update patched into the clean run, ``F(clean) - F(patched)``. IG-Lens's
contrastive credit from the corrupted reference is ``IGLens.attribute(clean,
baselines=corrupted, target=y, contrast=foil)``: the paper's telescoping path
(arXiv:2606.29693, Section 3) started at the corrupted run's last-block residual, so the
credits add up to ``F(clean) - F(corrupted)`` and block 1's credit holds that jump. The
rows of a pair are
one batched single-token forward per run over the cached prefix
(:mod:`captum_iglens.validate.ablation_rows`).

Built-in checks (:class:`~captum_iglens.validate.ablation.AblationCheckError` when one fails): the
clean rows reproduce IG-Lens's ``F(clean)`` and ``F(corrupted)``; one cached patch equals
the same patch through a full-sequence hooked forward; and patching the embedding and every
block's update at once restores the other run's ``F`` (the residual at ``i`` then *is* the
other run's, whatever the prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.onset import onset_layer_indices
from captum_iglens.settings import DEFAULT_ONSET_FRAC, DEFAULT_ONSET_RULE
from captum_iglens.validate.ablation import BlockAblation, ResidualTrace
from captum_iglens.validate.ablation_checks import compare
from captum_iglens.validate.ablation_hooks import eval_mode, hooked
from captum_iglens.validate.ablation_rows import RowPlan, token_probs
from captum_iglens.validate.pairs import PairAlignmentError, PromptPair, load_pairs

__all__ = ["PairAlignmentError", "PairPatch", "PromptPair", "load_pairs", "pair_ids",
           "patch_pair", "patch_pairs"]

def pair_ids(tokenizer: Any, pair: PromptPair) -> tuple[list[int], list[int], int, int]:
    """Token ids of a pair: ``(clean, corrupted, y, foil)``.

    ``y`` (``foil``) is the first token of the answer (foil) after the clean (corrupted)
    prompt, as the tokenizer splits prompt + continuation.

    Raises:
        ValueError: the prompts have different token counts (positions would not align),
            a continuation merges with its prompt's last token, or ``y == foil``.
    """
    clean, corrupted = tokenizer(pair.clean).input_ids, tokenizer(pair.corrupted).input_ids
    if len(clean) != len(corrupted):
        raise ValueError(f"pair {pair.id}: {len(clean)} clean vs {len(corrupted)} corrupted "
                         "tokens, positions do not align")
    ids = []
    for prompt, text, cont in ((clean, pair.clean, pair.answer),
                               (corrupted, pair.corrupted, pair.foil)):
        full = tokenizer(text + cont).input_ids
        if full[:len(prompt)] != prompt or len(full) == len(prompt):
            raise ValueError(f"pair {pair.id}: {cont!r} merges with its prompt's last token")
        ids.append(full[len(prompt)])
    if ids[0] == ids[1]:
        raise ValueError(f"pair {pair.id}: answer and foil start with the same token")
    return clean, corrupted, ids[0], ids[1]


@dataclass
class PairPatch:
    """Patching and contrastive IG-Lens of one pair over ``n`` blocks (probability units).

    Attributes:
        pair (PromptPair): The pair.
        position (int): The explained position ``i`` (the last prompt token).
        target / foil (int): Token ids of ``y`` and the foil.
        f_clean / f_corrupted (float): ``F = p(y) - p(foil)`` at ``i`` in each run.
        recovery (Tensor): ``[n]`` ``F(corrupted, clean u_L patched) - F(corrupted)``.
        reverse (Tensor): ``[n]`` ``F(clean) - F(clean, corrupted u_L patched)``.
        embedding_recovery (float): The same as ``recovery`` for the embedding ``h_0``.
        credits (Tensor): ``[n]`` contrastive IG-Lens credit from the corrupted reference.
        lens (Tensor): ``[n]`` ``F(h_L)`` of the clean run (the contrastive logit lens).
        direct (Tensor): ``[n]`` ``F(h_n) - F(h_n - u_L)`` of the clean run.
        onset (int): IG-Lens onset of the credits (0-based column, the default rule).
        check_errors (dict[str, float]): Largest error of each built-in check.
    """

    pair: PromptPair
    position: int
    target: int
    foil: int
    f_clean: float
    f_corrupted: float
    recovery: Tensor
    reverse: Tensor
    embedding_recovery: float
    credits: Tensor
    lens: Tensor
    direct: Tensor
    onset: int
    check_errors: dict[str, float] = field(default_factory=dict)


def _plan(source: ResidualTrace, pos: int) -> RowPlan:
    """The rows of one patched run, all taken from ``source`` at ``pos``.

    Row 0 clean; row 1 the embedding patched; row ``1 + L`` block ``L``'s update patched;
    row ``n + 2`` the embedding and every update at once.
    """
    n = source.hidden.shape[1] - 1
    h0, updates = source.hidden[pos, 0], source.updates[pos]
    layers = {0: (torch.tensor([1, n + 2]), torch.stack([h0, h0]))}
    for layer in range(1, n + 1):
        layers[layer] = (torch.tensor([1 + layer, n + 2]),
                         updates[layer - 1].expand(2, -1).contiguous())
    start = torch.tensor([n + 1, *range(0, n + 1), 0])
    return RowPlan(n + 3, start, layers)


def _contrast(probs: Tensor) -> Tensor:
    """``F = p(y) - p(foil)`` from ``[R, 2]`` probabilities, float64."""
    return probs[:, 0].double() - probs[:, 1].double()


def _full_patch(ablation: BlockAblation, trace: ResidualTrace, source: ResidualTrace,
                pos: int, layer: int, ids: Tensor) -> Tensor:
    """``F`` of the clean row and of block ``layer`` patched, by a full hooked forward."""
    plan = {layer: (torch.tensor([1]), source.updates[pos, layer - 1][None])}
    batch = trace.input_ids[: pos + 1][None].expand(2, -1)
    with eval_mode(ablation.model), hooked(ablation.blocks, plan, pos):
        logits = ablation.model(batch.to(ablation._device()), use_cache=False).logits[:, pos]
    return _contrast(token_probs(logits, ids).cpu())


def _lens_terms(ablation: BlockAblation, clean: Tensor, corrupted: Tensor, pos: int,
                ids: Tensor, trace: ResidualTrace) -> tuple[Any, Tensor]:
    """Contrastive IG-Lens details from the corrupted reference, and the direct effects."""
    device = ablation._device()
    details = ablation.credit_details(
        clean[None].to(device), ids[:1].reshape(1, 1), [pos],
        baselines=corrupted[None].to(device), contrast=ids[1:].reshape(1, 1))
    h_n = trace.hidden[pos, -1]
    points = torch.cat([h_n[None], h_n[None] - trace.updates[pos]])
    with eval_mode(ablation.model):
        f = _contrast(token_probs(ablation.readout(points.to(device)), ids).cpu())
    return details, (f[0] - f[1:]).float()


def patch_pair(ablation: BlockAblation, tokenizer: Any, pair: PromptPair,
               spot_layer: Optional[int] = None) -> PairPatch:
    """Patch every block of one pair both ways and explain it with contrastive IG-Lens.

    Args:
        ablation (BlockAblation): On the model (its tolerance is the checks').
        tokenizer: The model's tokenizer (no chat template: the prompts are completions).
        pair (PromptPair): The pair.
        spot_layer (int, optional): Block of the full-forward spot check. Default:
            ``1 + len(clean tokens) % n``.

    Returns:
        PairPatch: recoveries, reverse drops and the IG-Lens terms, ``[n]`` each.

    Raises:
        ValueError: as :func:`pair_ids`.
        AblationCheckError: a built-in check failed.
    """
    clean_ids, corrupted_ids, y, foil = pair_ids(tokenizer, pair)
    clean, corrupted = torch.tensor(clean_ids), torch.tensor(corrupted_ids)
    pos, n, ids = len(clean_ids) - 1, ablation.num_layers, torch.tensor([y, foil])
    t_clean, t_corr = ablation.trace(clean), ablation.trace(corrupted)
    denoise = _contrast(ablation.run_plan(t_corr, pos, _plan(t_clean, pos), ids))
    noise = _contrast(ablation.run_plan(t_clean, pos, _plan(t_corr, pos), ids))
    details, direct = _lens_terms(ablation, clean, corrupted, pos, ids, t_clean)
    f_clean, f_corr = details.p_final.reshape(-1).cpu(), details.p_baseline.reshape(-1).cpu()
    spot = spot_layer if spot_layer is not None else 1 + len(clean_ids) % n
    full = _full_patch(ablation, t_corr, t_clean, pos, spot, ids)
    tol = ablation.tolerance
    errors = {
        "clean": max(compare("clean row vs IG-Lens F(clean)", noise[:1], f_clean, tol),
                     compare("corrupted row vs IG-Lens F(corrupted)", denoise[:1], f_corr,
                             tol)),
        "spot": compare(f"cached vs full-sequence patch of block {spot}",
                        denoise[[0, 1 + spot]], full, tol),
        "restore": max(compare("embedding and every block patched vs F(clean)",
                               denoise[-1:], f_clean, tol),
                       compare("embedding and every block reverse-patched vs F(corrupted)",
                               noise[-1:], f_corr, tol)),
    }
    credits = details.attributions.reshape(-1).cpu().float()
    onset = onset_layer_indices(credits, tuple(range(1, n + 1)), DEFAULT_ONSET_FRAC,
                                DEFAULT_ONSET_RULE)
    return PairPatch(
        pair=pair, position=pos, target=y, foil=foil, f_clean=float(f_clean),
        f_corrupted=float(f_corr), recovery=(denoise[2:n + 2] - denoise[0]).float(),
        reverse=(noise[0] - noise[2:n + 2]).float(),
        embedding_recovery=float(denoise[1] - denoise[0]), credits=credits,
        lens=details.lens_probs.reshape(-1).cpu().float(), direct=direct,
        onset=int(onset) - 1, check_errors=errors)


def patch_pairs(ablation: BlockAblation, tokenizer: Any, pairs: Sequence[PromptPair],
                progress: bool = False) -> tuple[list[PairPatch], list[str]]:
    """:func:`patch_pair` over a set; pairs whose tokens do not align are skipped.

    Returns:
        (patches, skipped): the patched pairs, and why each skipped pair was skipped.

    Raises:
        AblationCheckError: a built-in check failed.
    """
    from tqdm.auto import tqdm

    from captum_iglens._utils.progress import progress_enabled

    patches, skipped = [], []
    shown = progress and progress_enabled()  # --no-progress switches this bar off too
    for j, pair in enumerate(tqdm(pairs, desc="patch", unit="pair", disable=not shown)):
        try:
            pair_ids(tokenizer, pair)
        except ValueError as err:
            skipped.append(str(err))
            continue
        patches.append(patch_pair(ablation, tokenizer, pair,
                                  spot_layer=1 + j % ablation.num_layers))
    return patches, skipped
