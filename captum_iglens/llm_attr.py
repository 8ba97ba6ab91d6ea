"""Captum's ``LLMGradientAttribution`` with IG-Lens among its supported methods.

Captum's :class:`~captum.attr.LLMGradientAttribution` wraps a gradient attribution and
returns an :class:`~captum.attr.LLMAttributionResult` (output tokens x input tokens). With
IG-Lens the features are not input tokens but decoder layers: the subclass below accepts
:class:`~captum_iglens.IGLens` next to Captum's own methods and returns a result whose
"input tokens" are layer names, so Captum's ``plot_token_attr()`` / ``plot_seq_attr()`` draw
the token x layer map (arXiv:2606.29693).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from captum.attr import LLMAttributionResult, LLMGradientAttribution, TextTokenInput
from captum.attr._core.llm_attr import _convert_ids_to_pretty_tokens
from captum.attr._utils.interpretable_input import InterpretableInput
from torch import Tensor

from captum_iglens.ig_lens import IGLens

__all__ = ["LLMIGLensAttribution"]


class LLMIGLensAttribution(LLMGradientAttribution):
    r"""``LLMGradientAttribution`` whose ``SUPPORTED_METHODS`` include :class:`IGLens`.

    With an ``IGLens`` instance, :meth:`attribute` teacher-forces prompt + target in one
    forward (``use_cache=False``) and attributes the probability of every target token to the
    chosen layers; the result's ``input_tokens`` are layer names (``"emb"``, ``"L1"``, ...),
    ``token_attr`` is ``[n_output_tokens, k]`` IG-Lens credit in probability units (not the
    log-probability Captum's own gradient methods attribute), ``seq_attr`` its sum over the
    output tokens, ``output_probs`` the model's probability of each target token. Each row of
    ``token_attr`` adds up to that token's ``Δp = f(h_n) - f(b)`` (Proposition 1). With any of
    Captum's own methods the behaviour is Captum's unchanged.

    Args:
        attr_method (IGLens or a Captum gradient method): the attribution to wrap.
        tokenizer: the model's tokenizer.

    Examples::

        >>> from captum.attr import TextTokenInput
        >>> from captum_iglens import IGLens
        >>> from captum_iglens.llm_attr import LLMIGLensAttribution
        >>> llm_attr = LLMIGLensAttribution(IGLens(model), tokenizer)
        >>> inp = TextTokenInput("The capital of France is", tokenizer)
        >>> res = llm_attr.attribute(inp, target=" Paris")
        >>> res.input_tokens[:3], res.token_attr.shape     # ['L1', 'L2', 'L3'], [T, 30]
        >>> fig, ax = res.plot_token_attr()
    """

    SUPPORTED_METHODS = (*LLMGradientAttribution.SUPPORTED_METHODS, IGLens)

    def __init__(self, attr_method: Any, tokenizer: Any) -> None:
        super().__init__(attr_method, tokenizer)
        if isinstance(attr_method, IGLens):
            # IG-Lens runs the model itself (teacher forcing over prompt + answer); keep the
            # caller's instance instead of Captum's copy with a swapped forward function.
            self.attr_method = attr_method

    def attribute(  # type: ignore[override]
        self,
        inp: InterpretableInput,
        target: Union[str, Tensor, None] = None,
        gen_args: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> LLMAttributionResult:
        """Attribute every target token (IG-Lens: to layers; otherwise Captum's behaviour).

        Args:
            inp (TextTokenInput): The prompt.
            target (str or Tensor, optional): The target text (tokenised without special
                tokens, mind the leading space) or ids ``[T]``. ``None``: greedy generation
                with ``gen_args`` (Captum's defaults: 25 new tokens).
            gen_args (dict, optional): Generation arguments when ``target`` is None.
            **kwargs: Passed to :meth:`IGLens.attribute_details` (``baselines``, ``method``,
                ``n_steps``, ``internal_batch_size``), or to the Captum method.

        Returns:
            LLMAttributionResult: for IG-Lens, ``input_tokens`` = layer names,
            ``output_tokens`` = target tokens, ``token_attr`` ``[T, k]``, ``seq_attr`` ``[k]``.

        Raises:
            ValueError: an empty target.
        """
        if not isinstance(self.attr_method, IGLens):
            return super().attribute(inp, target=target, gen_args=gen_args, **kwargs)
        if not isinstance(inp, TextTokenInput):
            raise TypeError(f"LLMIGLensAttribution takes a TextTokenInput, got {type(inp)}")
        target_tokens = self._get_target_tokens(inp, target, gen_args=gen_args)
        target_tokens = torch.as_tensor(target_tokens).reshape(-1).to(self.device)
        if target_tokens.numel() == 0:
            raise ValueError("The target has no tokens: nothing to attribute.")
        prompt_ids = self._format_model_input(inp.to_model_input())["input_ids"]
        prompt_ids = prompt_ids.to(self.device).reshape(1, -1)
        n_prompt, n_out = prompt_ids.shape[1], target_tokens.numel()
        ids = torch.cat([prompt_ids, target_tokens[None, :-1]], dim=1)
        positions = list(range(n_prompt - 1, n_prompt - 1 + n_out))
        lens: IGLens = self.attr_method
        out = lens.attribute_details(
            ids, target=target_tokens[None, :], positions=positions, **kwargs
        )
        token_attr = out.attributions[0].detach().float().cpu()
        layer_names = ["emb" if i == 0 else f"L{i}" for i in lens.layer_indices]
        return LLMAttributionResult(
            input_tokens=layer_names,
            output_tokens=_convert_ids_to_pretty_tokens(target_tokens.cpu(), self.tokenizer),
            seq_attr=token_attr.sum(0),
            token_attr=token_attr,
            output_probs=out.p_final[0].detach().float().cpu(),
            inp=inp,
        )
