"""Captum's ``LLMGradientAttribution`` with IG-Lens among its supported methods.

Captum's :class:`~captum.attr.LLMGradientAttribution` wraps a gradient attribution and
returns an :class:`~captum.attr.LLMAttributionResult` (output tokens x input tokens); it
refuses :class:`~captum_iglens.IGLens` (its ``SUPPORTED_METHODS`` check). The subclass below
accepts IG-Lens next to Captum's own methods. With IG-Lens the features are decoder layers,
so the result's "input tokens" are layer names and Captum's ``plot_token_attr()`` /
``plot_seq_attr()`` draw the token x layer map (arXiv:2606.29693). The reference's own
readout ``-p(y | x')`` is kept out of the layer columns (``baseline_attr``): in the first
column it would be the largest bar of every plot.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Union

import torch
from captum.attr import LLMAttributionResult, LLMGradientAttribution, TextTokenInput
from torch import Tensor

from captum_iglens._utils.captum_compat import InterpretableInput, convert_ids_to_pretty_tokens
from captum_iglens._utils.format import layer_names
from captum_iglens.ig_lens import IGLens
from captum_iglens.results import IGLensLLMAttributionResult
from captum_iglens.results.captum_view import split_baseline_readout

__all__ = ["LLMIGLensAttribution"]

#: Keywords of IGLens.attribute that the wrapper passes on.
_PASSED = ("baselines", "method", "n_steps", "internal_batch_size")
#: Captum keywords that have no meaning for IG-Lens, with what to do instead.
_REFUSED = {
    "attribute_to_layer_input": (
        "IG-Lens credits the segments between the chosen layers' outputs; for the input of "
        "block l choose hidden-state index l - 1 in IGLens(model, layers=...)"
    ),
    "skip_tokens": (
        "give it to TextTokenInput(prompt, tokenizer, skip_tokens=...): those tokens are kept "
        "in the reference, every other prompt token becomes the TextTokenInput baseline"
    ),
    "additional_forward_args": "the wrapper builds the forward arguments itself",
    "target": "give target to attribute(inp, target=...) itself",
}


def _check_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    passed = {k: v for k, v in kwargs.items() if k in _PASSED}
    for key in kwargs:
        if key in _PASSED or key == "return_convergence_delta":
            continue
        reason = _REFUSED.get(key, f"IG-Lens takes only {', '.join(_PASSED)} and "
                                   "return_convergence_delta")
        raise TypeError(
            f"LLMIGLensAttribution.attribute(..., {key}=...) with IGLens: {reason}."
        )
    return passed


class LLMIGLensAttribution(LLMGradientAttribution):
    r"""``LLMGradientAttribution`` whose ``SUPPORTED_METHODS`` include :class:`IGLens`.

    With an ``IGLens`` instance, :meth:`attribute` teacher-forces prompt + target in one
    forward (``use_cache=False``) and attributes the probability of every target token to the
    chosen layers. The reference is the one Captum's gradient methods use: every token of the
    ``TextTokenInput`` replaced by its ``baselines`` token, its ``skip_tokens`` kept, followed
    by the target tokens; IG-Lens starts at that reference's last-block residual, so
    ``baseline_attr + token_attr.sum(-1)`` adds up to ``F(x) - F(x')`` row by row
    (Proposition 1), where ``baseline_attr = -F(x')`` is the reference's own readout, kept
    out of the layer columns (it would otherwise sit in the first layer's column and be the
    largest bar of ``plot_seq_attr``); each row of ``token_attr`` alone adds up to
    ``F(x)``, the ``output_probs``. ``baselines="mean"`` (or any :meth:`IGLens.attribute`
    baseline) overrides the reference. With ``IGLens(model, effect="total")`` the credits
    are total effects gated from the reference prompt's block updates at each target
    position (``baselines="mean"`` or ``"zero"`` for the other references): they add up to
    ``output_probs - p_baseline`` with ``baseline_attr = 0``; ``effect="atp"`` gives
    attribution patching's estimates, which do not add up. ``result.effect`` says which.
    With any of Captum's own methods the behaviour is Captum's unchanged.

    Args:
        attr_method (IGLens or a Captum gradient method): the attribution to wrap.
        tokenizer: the model's tokenizer.

    Examples::

        >>> from captum.attr import TextTokenInput
        >>> from captum_iglens import IGLens, LLMIGLensAttribution
        >>> llm_attr = LLMIGLensAttribution(IGLens(model), tokenizer)
        >>> inp = TextTokenInput("The capital of France is", tokenizer,
        ...                      baselines=" ", skip_tokens=[tokenizer.bos_token_id])
        >>> res = llm_attr.attribute(inp, target=" Paris")
        >>> res.baseline_attr + res.token_attr.sum(-1) - res.delta_p   # ~0
        >>> res.token_attr.sum(-1) - res.output_probs   # ~0: each row adds up to p(y|x)
        >>> fig, ax = res.plot_token_attr(display="row")   # every token's row visible
    """

    SUPPORTED_METHODS = (*LLMGradientAttribution.SUPPORTED_METHODS, IGLens)

    def __init__(self, attr_method: Any, tokenizer: Any) -> None:
        """Wrap ``attr_method`` (IGLens or a Captum gradient method) for ``tokenizer``."""
        super().__init__(attr_method, tokenizer)
        if isinstance(attr_method, IGLens):
            # IG-Lens runs the model itself (teacher forcing over prompt + answer); keep the
            # caller's instance instead of Captum's copy with a swapped forward function.
            self.attr_method = attr_method

    def attribute(
        self,
        inp: InterpretableInput,
        target: Union[str, Tensor, None] = None,
        gen_args: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> LLMAttributionResult:
        """Attribute every target token (IG-Lens: to layers; otherwise Captum's behaviour).

        Args:
            inp (TextTokenInput): The prompt; its ``baselines`` token and ``skip_tokens``
                define the reference (see the class docstring).
            target (str or Tensor, optional): The target text (tokenised without special
                tokens, mind the leading space) or ids ``[T]``. ``None``: greedy generation
                with ``gen_args`` (Captum's defaults: 25 new tokens).
            gen_args (dict, optional): Generation arguments when ``target`` is None.
            **kwargs: For IG-Lens: ``baselines``, ``method``, ``n_steps``,
                ``internal_batch_size`` (as in :meth:`IGLens.attribute`) and
                ``return_convergence_delta`` (accepted; the result always carries
                ``convergence_delta``). For a Captum method: passed to it.

        Returns:
            LLMAttributionResult: for IG-Lens an
            :class:`~captum_iglens.results.IGLensLLMAttributionResult`: ``input_tokens`` =
            layer names, ``token_attr`` ``[T, k]`` (the baseline's readout set apart),
            ``seq_attr`` ``[k]``, ``output_probs``, ``p_baseline``, ``baseline_attr``,
            ``delta_p`` and ``convergence_delta`` ``[T]``.

        Raises:
            ValueError: an empty target.
            TypeError: not a ``TextTokenInput``, or a keyword with no meaning for IG-Lens
                (the message says what to do instead).
        """
        if not isinstance(self.attr_method, IGLens):
            return super().attribute(inp, target=target, gen_args=gen_args, **kwargs)
        if not isinstance(inp, TextTokenInput):
            raise TypeError(f"LLMIGLensAttribution takes a TextTokenInput, got {type(inp)}")
        passed = _check_kwargs(kwargs)
        target_tokens = self._get_target_tokens(inp, target, gen_args=gen_args)
        target_tokens = torch.as_tensor(target_tokens).reshape(-1).to(self.device)
        if target_tokens.numel() == 0:
            raise ValueError("The target has no tokens: nothing to attribute.")
        return self._attribute_lens(inp, target_tokens, passed)

    def _attribute_lens(
        self, inp: TextTokenInput, target_tokens: Tensor, passed: dict[str, Any]
    ) -> IGLensLLMAttributionResult:
        prompt_ids = inp.to_model_input().to(self.device).reshape(1, -1)
        reference = inp.to_model_input(torch.zeros_like(inp.to_tensor())).to(self.device)
        keep = _without_appended_end(self.tokenizer, prompt_ids[0].tolist())
        prompt_ids, reference = prompt_ids[:, :keep], reference.reshape(1, -1)[:, :keep]
        answer = target_tokens[None, :-1]
        ids = torch.cat([prompt_ids, answer], dim=1)
        passed.setdefault("baselines", torch.cat([reference.reshape(1, -1), answer], dim=1))
        n_prompt = prompt_ids.shape[1]
        positions = list(range(n_prompt - 1, n_prompt - 1 + target_tokens.numel()))
        lens: IGLens = self.attr_method
        out = lens.attribute_details(ids, target=target_tokens[None, :], positions=positions,
                                     **passed)
        attributions = out.attributions[0].detach().float().cpu()
        p_baseline = out.p_baseline[0].detach().float().cpu()
        if out.effect == "readout":
            token_attr, baseline_attr = split_baseline_readout(attributions, p_baseline)
        else:  # gated block credits: no path start to set apart, nothing else in column 0
            token_attr, baseline_attr = attributions, torch.zeros_like(p_baseline)
        result = IGLensLLMAttributionResult(
            input_tokens=layer_names(out.layer_indices, out.granularity),
            output_tokens=convert_ids_to_pretty_tokens(target_tokens.cpu(), self.tokenizer),
            seq_attr=token_attr.sum(0),
            token_attr=token_attr,
            output_probs=out.p_final[0].detach().float().cpu(),
            inp=inp,
            p_baseline=p_baseline,
            baseline_attr=baseline_attr,
            convergence_delta=out.convergence_delta[0].detach().float().cpu(),
            baseline=out.baseline,
            units=out.units,
        )
        result.effect = out.effect
        return result


def _without_appended_end(tokenizer: Any, ids: list[int]) -> int:
    """How many of the prompt ids to keep: all but an end token the tokenizer appended.

    A tokenizer with ``add_eos_token=True`` ends every ``TextTokenInput`` with ``</s>``; the
    first target would then be explained as the prediction after the end token. It is
    dropped (prompt and reference alike) with a warning.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    if len(ids) > 1 and eos is not None and ids[-1] == eos:
        warnings.warn(
            f"The TextTokenInput ends with the end token id {eos} that the tokenizer appends "
            "(add_eos_token=True): it is dropped, so that the first target is explained as "
            "the prompt's continuation, not the prediction after the end of the text.",
            stacklevel=4)
        return len(ids) - 1
    return len(ids)
