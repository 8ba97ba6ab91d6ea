"""Fitting the tuned and the Jacobian lens offline, and finding fitted ones in the cache.

- :func:`fit_tuned_lens`: the tuned-lens objective (Belrose et al. 2023, Sec. 3 and App. B):
  minimise ``sum_{L<n} KL(p_final || softmax(readout(T_L(h_L))))`` averaged over tokens, with
  Adam, from the identity (the logit lens). The residuals ``h_L`` of the corpus are read
  once; each step draws ``batch_tokens`` token rows. Resumable: a checkpoint (translators,
  optimiser, step) is written every ``checkpoint_every`` steps and read back on the next call
  with the same settings.
- :func:`fit_jacobian_lens`: no optimisation: ``J_L`` is the average Jacobian of the last
  block's output with respect to ``h_L`` (TransformerLens's estimator: a one-hot cotangent per
  output coordinate at every valid target position, so that position ``t`` receives
  ``sum_{t' >= t} d h_{n,t'} / d h_{L,t}``; averaged over the valid source positions, which
  skip the first ``skip_first`` and the last, then over prompts).
- :func:`lens_cache_path` keys a fitted lens by the model's weights digest and a hash of the
  fit settings, under ``cache_root() / "lenses"``; :func:`named_lens` loads the newest one of
  a kind for ``IGLens(model, lens="tuned" | "jacobian")``.
- :func:`load_tuned_lens_folder` loads a lens trained with the ``tuned-lens`` package
  (``config.json`` and ``params.pt`` with ``layer_translators.{L}.weight/bias``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from captum_iglens._utils.progress import progress_bar
from captum_iglens.lens.architectures import resolve_decoder_blocks
from captum_iglens.lens.hooks import capture_residual_stream, held_hooks, hidden_of
from captum_iglens.lens.state import input_device, model_state_preserved
from captum_iglens.lens.translators import (
    FittedLens,
    JacobianLens,
    TunedLens,
    load_lens,
    settings_key,
)
from captum_iglens.lens.weights import weights_digest
from captum_iglens.models.facts import cache_root
from captum_iglens.settings import FIT_BATCH_TOKENS, FIT_LR, FIT_STEPS

__all__ = ["FIT_KINDS", "corpus_digest", "fit_jacobian_lens", "fit_tuned_lens", "lens_cache_path",
           "load_tuned_lens_folder", "named_lens", "residuals_of"]

#: The lenses ``iglens fit-lens`` fits.
FIT_KINDS = ("tuned", "jacobian")


def corpus_digest(ids: Tensor) -> str:
    """A hash of the fit corpus's token ids (part of the settings key)."""
    return hashlib.blake2b(ids.long().numpy().tobytes(), digest_size=8).hexdigest()


def lens_cache_path(digest: str, kind: str, settings: dict[str, Any]) -> Path:
    """``cache_root()/lenses/<weights digest>/<kind>-<settings hash>.pt``."""
    return cache_root() / "lenses" / digest / f"{kind}-{settings_key(settings)}.pt"


def named_lens(model: nn.Module, kind: str) -> FittedLens:
    """The newest fitted lens of ``kind`` for ``model`` in the cache.

    Raises:
        ValueError: an unknown kind; no lens of that kind fitted for this model (the message
            says to run ``iglens fit-lens``).
    """
    if kind not in FIT_KINDS:
        raise ValueError(f"lens={kind!r}: use 'logit', one of {FIT_KINDS} or a LayerReadout.")
    digest = weights_digest(model)
    folder = cache_root() / "lenses" / digest
    found = sorted(folder.glob(f"{kind}-*.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ValueError(
            f"No {kind} lens is fitted for this model (weights digest {digest}) in {folder}: "
            f"fit one first with `iglens fit-lens --kind {kind}` (add `--model M` for a "
            "model other than the default; in Python, lens= also takes a LayerReadout).")
    return load_lens(found[-1], model, digest)


def residuals_of(model: nn.Module, ids: Tensor, batch: int = 4) -> Tensor:
    """``h_0 .. h_n`` of every token of ``ids`` ``[N, S]``: ``[N * S, n + 1, d]`` float32."""
    blocks = resolve_decoder_blocks(model)
    n = len(blocks)
    device = input_device(model)
    rows = []
    with torch.no_grad(), model_state_preserved(model):
        for start in range(0, ids.shape[0], batch):
            part = ids[start:start + batch].to(device)
            with capture_residual_stream(blocks, range(n + 1)) as store:
                model(part, use_cache=False)
            stacked = torch.stack([store[i].float().cpu() for i in range(n + 1)], dim=2)
            rows.append(stacked.reshape(-1, n + 1, stacked.shape[-1]))
    return torch.cat(rows)


def _kl_rows(final_logp: Tensor, logits: Tensor) -> Tensor:
    """``KL(p || q)`` per row, from ``log p`` and the logits of ``q`` (float32)."""
    logq = logits.float().log_softmax(-1)
    return (final_logp.exp() * (final_logp - logq)).sum(-1)


def fit_tuned_lens(model: nn.Module, ids: Tensor, *, steps: int = FIT_STEPS,
                   lr: float = FIT_LR, batch_tokens: int = FIT_BATCH_TOKENS, seed: int = 0,
                   checkpoint_every: int = 10,
                   checkpoint: Optional[Path] = None, progress: bool = True,
                   settings: Optional[dict[str, Any]] = None) -> TunedLens:
    """Fit a :class:`TunedLens` on the token chunks ``ids`` ``[N, S]`` (Belrose et al. 2023).

    Args:
        model (nn.Module): The causal LM (left as found).
        ids (Tensor): ``[N, S]`` int64 token chunks (:func:`~captum_iglens.lens.fit_corpus.
            corpus_ids`).
        steps (int, optional): Adam steps. Default: 120.
        lr (float, optional): Adam learning rate. Default: 1e-3.
        batch_tokens (int, optional): Token rows per step. Default: 32.
        seed (int, optional): Seed of the row draws. Default: 0.
        checkpoint_every (int, optional): Steps between checkpoints. Default: 10.
        checkpoint (Path, optional): The checkpoint file; an existing one is resumed.
        progress (bool, optional): A tqdm bar. Default: True.
        settings (dict, optional): Recorded in the lens (its cache key).

    Returns:
        TunedLens: fitted, on CPU, with the model's digest.
    """
    lens = TunedLens.for_model(model, settings)
    readout = lens.readout
    hidden = residuals_of(model, ids)
    n = lens.num_layers
    optimiser = torch.optim.Adam(lens.translators.parameters(), lr=lr)
    done = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        lens.translators.load_state_dict(state["translators"])
        optimiser.load_state_dict(state["optimiser"])
        done = int(state["step"])
    device = next(iter(readout.parameters()), torch.empty(0)).device \
        if isinstance(readout, nn.Module) else torch.device("cpu")
    lens.to(device)
    grads = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in grads:
            p.requires_grad_(False)
        bar = progress_bar(total=steps, desc="fitting the tuned lens", unit="step",
                           enabled=progress)
        bar.update(done)
        with bar:
            for step in range(done, steps):
                gen = torch.Generator().manual_seed(seed * 100003 + step)
                rows = torch.randint(hidden.shape[0], (batch_tokens,), generator=gen)
                batch = hidden[rows].to(device)
                dtype = next(model.parameters()).dtype
                with torch.no_grad():
                    final_logp = readout(batch[:, n].to(dtype)).float().log_softmax(-1)
                loss = torch.zeros((), device=device)
                for layer in range(n):
                    logits = readout(lens.translate(batch[:, layer], layer).to(dtype))
                    loss = loss + _kl_rows(final_logp, logits).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                bar.update(1)
                bar.set_postfix(kl=f"{float(loss.detach()) / n:.3f}")
                if checkpoint is not None and ((step + 1) % checkpoint_every == 0
                                               or step + 1 == steps):
                    checkpoint.parent.mkdir(parents=True, exist_ok=True)
                    torch.save({"translators": lens.translators.state_dict(),
                                "optimiser": optimiser.state_dict(), "step": step + 1},
                               checkpoint)
    finally:
        for p, flag in grads:
            p.requires_grad_(flag)
    return lens.cpu().requires_grad_(False)  # fitted: read, not trained, from here on


def fit_jacobian_lens(model: nn.Module, ids: Tensor, *, skip_first: int = 1,
                      dim_batch: int = 16, progress: bool = True,
                      settings: Optional[dict[str, Any]] = None) -> JacobianLens:
    """Fit a :class:`JacobianLens`: ``J_L = E[d h_n / d h_L]`` (TransformerLens's estimator).

    Args:
        model (nn.Module): The causal LM (left as found).
        ids (Tensor): ``[N, S]`` int64 token chunks, one prompt each.
        skip_first (int, optional): Leading positions left out of the sources and targets
            (attention sinks; TransformerLens uses 16 on long prompts). Default: 1.
        dim_batch (int, optional): Output coordinates per backward pass. Default: 16.
        progress (bool, optional): A tqdm bar. Default: True.
        settings (dict, optional): Recorded in the lens.

    Raises:
        ValueError: chunks of at most ``skip_first + 1`` tokens (no valid position).
    """
    lens = JacobianLens.for_model(model, settings)
    blocks = resolve_decoder_blocks(model)
    n, d = lens.num_layers, lens.hidden_size
    seq = ids.shape[1]
    valid = torch.arange(skip_first, seq - 1)
    if valid.numel() == 0:
        raise ValueError(f"Chunks of {seq} tokens leave no position after skip_first="
                         f"{skip_first} and the last one: use longer chunks.")
    total = torch.zeros(n, d, d)
    with model_state_preserved(model), torch.enable_grad():
        for row in progress_bar(ids, desc="fitting the Jacobian lens", unit="prompt",
                                enabled=progress):
            total += _jacobian_of_prompt(model, blocks, row, valid, min(dim_batch, d))
    lens.jacobians.copy_(total / ids.shape[0])
    return lens


def _stream_with_grad(model: nn.Module, blocks: nn.ModuleList, ids: Tensor) -> list[Tensor]:
    """``h_0 .. h_n`` of one forward pass, in one graph rooted at ``h_0`` (requires grad)."""
    stream: dict[int, Tensor] = {}

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> Any:
        h = (args[0] if args else kwargs["hidden_states"]).detach().requires_grad_(True)
        stream[0] = h
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

    def keep(index: int) -> Any:
        return lambda _m, _a, out: stream.__setitem__(index, hidden_of(out))

    with held_hooks() as hooks:
        hooks.pre(blocks[0], pre, with_kwargs=True)
        for index in range(len(blocks)):
            hooks.forward(blocks[index], keep(index + 1))
        model(ids, use_cache=False)
    return [stream[i] for i in range(len(blocks) + 1)]


def _jacobian_of_prompt(model: nn.Module, blocks: nn.ModuleList, row: Tensor, valid: Tensor,
                        width: int) -> Tensor:
    """One prompt's ``J_L``, ``[n, d, d]``.

    Row ``k`` of ``J_L`` is the gradient of ``sum_{t' valid} h_{n,t'}[k]`` with respect to
    ``h_L``, averaged over the valid source positions.
    """
    stream = _stream_with_grad(model, blocks, row[None].expand(width, -1).to(
        input_device(model)))
    target, sources = stream[-1], stream[:-1]
    n, d = len(sources), target.shape[-1]
    out = torch.zeros(n, d, d)
    cotangent = torch.zeros_like(target)
    lanes = torch.arange(width)
    passes = -(-d // width)
    for p in range(passes):
        start, count = p * width, min(width, d - p * width)
        cotangent.zero_()
        cotangent[lanes[:count, None], valid[None, :], start + lanes[:count, None]] = 1.0
        grads = torch.autograd.grad(target, sources, cotangent, retain_graph=p < passes - 1)
        for layer, grad in enumerate(grads):
            out[layer, start:start + count] = grad[:count, valid].float().mean(1).cpu()
    return out


def load_tuned_lens_folder(folder: Union[str, Path], model: nn.Module) -> TunedLens:
    """A lens trained with the ``tuned-lens`` package, read from its local folder.

    The folder holds ``config.json`` (``d_model``, ``num_hidden_layers``, ``bias``) and
    ``params.pt`` (``layer_translators.{L}.weight`` ``[d, d]`` and ``.bias`` ``[d]``, the
    translator of hidden-state index ``L``: ``h + W h + b``, the layout of :class:`TunedLens`).

    Raises:
        FileNotFoundError: a file missing.
        ValueError: the layouts differ (width, number of translators).
    """
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    params = torch.load(folder / "params.pt", map_location="cpu", weights_only=True)
    lens = TunedLens.for_model(model, {"source": str(folder), "tuned_lens_config": config})
    if (config.get("d_model"), config.get("num_hidden_layers")) != (lens.hidden_size,
                                                                    lens.num_layers):
        raise ValueError(
            f"The tuned-lens folder {folder} is for d_model={config.get('d_model')}, "
            f"{config.get('num_hidden_layers')} layers; this model has d={lens.hidden_size}, "
            f"{lens.num_layers} blocks: the layouts do not match.")
    state = {k.removeprefix("layer_translators."): v for k, v in params.items()
             if k.startswith("layer_translators.")}
    if not config.get("bias", True):
        state.update({f"{i}.bias": torch.zeros(lens.hidden_size) for i in range(lens.num_layers)})
    try:
        lens.translators.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"The tuned-lens folder {folder} does not match this model's "
                         f"layout: {err}") from err
    lens.source = str(folder)
    return lens.requires_grad_(False)
