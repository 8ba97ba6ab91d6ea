"""Where a decoder block's half-way residual lives: after attention, before the MLP.

IG-Lens's telescoping holds for any sequence of residual states on the path, so adding the
residual between a block's attention and its MLP as a path node splits the block's credit
into an attention credit and an MLP credit that add up to it exactly (Proposition 1 of
arXiv:2606.29693 applied to a finer path). Where that residual lives differs by family, and
is read, never guessed, from the ``half_block`` of the family's row
(:data:`~captum_iglens.lens.families.FAMILIES`):

* ``"input"`` of a named submodule — sequential blocks, whose MLP branch starts from the
  half-way residual: the MLP's pre-norm (``post_attention_layernorm`` in Llama, Mistral,
  Qwen, Phi-3, OLMo, Gemma, Granite; ``ln_2`` in GPT-2; ``norm_2`` in MPT;
  ``final_layer_norm`` in pre-norm OPT), the pre-feed-forward norm of sandwich-norm blocks
  (Gemma-2/3/4, VaultGemma: after the post-attention norm), the MLP itself where it has no
  pre-norm (OLMo-2), and BLOOM, whose attention output already includes the residual (the
  input of its post-attention norm is that sum). Residual multipliers (Granite) are inside.
* ``"parallel"`` — blocks whose attention and MLP read the same input (GPT-J, CodeGen,
  Phi-1/2, Cohere, Falcon with ``parallel_attn`` or its new architecture, GPT-NeoX and
  StableLM with ``use_parallel_residual``; sequential otherwise): the order
  is defined as attention first, ``L.attn = h_{L-1} + attn_out``; the MLP credit is then the
  rest of the block, ``h_L - L.attn`` (its MLP read ``h_{L-1}``, not ``L.attn``).

A family outside the table (post-norm OPT-350m; hybrids such as Falcon-H1, GraniteMoeHybrid
and RecurrentGemma, whose mixer is not always attention) is refused by name.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from torch import Tensor, nn

from captum_iglens.lens.architectures import model_type, unwrap_model
from captum_iglens.lens.families import FAMILIES, HalfBlockSite, family_row, site_of
from captum_iglens.lens.hooks import held_hooks

__all__ = ["HalfBlockSite", "SublayerUnsupportedError", "capture_half_residuals",
           "half_block_site"]


class SublayerUnsupportedError(ValueError):
    """The family's half-block residual is not known: sub-layer credits are refused."""


def _config(model: nn.Module) -> Any:
    config = getattr(unwrap_model(model), "config", None)
    return getattr(config, "text_config", None) or config


def half_block_site(model: nn.Module, blocks: nn.ModuleList) -> HalfBlockSite:
    """The :class:`HalfBlockSite` of ``model``'s family, checked against its first block.

    Raises:
        SublayerUnsupportedError: a family outside the table, or a block without the
            submodule the table names (the message says what to do instead).
    """
    kind = model_type(model)
    row = family_row(kind)
    site = None if row is None else site_of(row, _config(model))
    if site is None:
        raise SublayerUnsupportedError(
            f"Sub-layer credits are not defined for {kind!r}: its half-block residual (after "
            "attention, before the MLP) is not in the table of verified families (post-norm "
            "and hybrid blocks are refused). Use granularity='block'.")
    if not all(isinstance(getattr(b, site.module, None), nn.Module) for b in blocks):
        raise SublayerUnsupportedError(
            f"The decoder blocks of this {kind!r} model have no '{site.module}' submodule, "
            "where its half-block residual is read: use granularity='block'.")
    return site


def _first(output: object) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output  # type: ignore[return-value]


@contextmanager
def capture_half_residuals(blocks: nn.ModuleList, indices: list[int], site: HalfBlockSite,
                           store: dict[int, Tensor]) -> Iterator[dict[int, Tensor]]:
    """Record ``L.attn`` (``[B, S, d]``) of blocks ``indices`` (1-based) into ``store``.

    Args:
        blocks (nn.ModuleList): The decoder blocks.
        indices (list of int): Hidden-state indices ``L >= 1`` whose half residual to keep.
        site (HalfBlockSite): From :func:`half_block_site`.
        store (dict): Filled as ``{L: L.attn}`` by the forward pass run inside the block.

    Yields:
        dict: ``store``. Every hook is removed on exit, also after an error.
    """
    with held_hooks() as hooks:
        for index in indices:
            block = blocks[index - 1]
            module = getattr(block, site.module)
            inputs: dict[int, Tensor] = {}
            hooks.pre(block, _input_hook(index, inputs))
            if site.kind == "input":
                hooks.pre(module, _reshaped_input_hook(index, inputs, store))
            else:
                hooks.forward(module, _sum_hook(index, inputs, store))
        yield store


def _input_hook(index: int, store: dict[int, Tensor]) -> Callable[..., None]:
    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        store[index] = args[0] if args else kwargs["hidden_states"]
    return hook


def _reshaped_input_hook(index: int, inputs: dict[int, Tensor], store: dict[int, Tensor]
                         ) -> Callable[..., None]:
    """The submodule's input, in the block input's ``[B, S, d]`` shape (OPT flattens it)."""
    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        shape = inputs.pop(index).shape
        store[index] = (args[0] if args else kwargs["hidden_states"]).reshape(shape)
    return hook


def _sum_hook(index: int, inputs: dict[int, Tensor], store: dict[int, Tensor]
              ) -> Callable[..., None]:
    def hook(_m: nn.Module, _a: tuple, output: object) -> None:
        store[index] = inputs.pop(index) + _first(output)
    return hook


#: The built-in families whose attention output is the projection of the concatenated heads,
#: added to the residual as it is (no post-attention norm, no multiplier): a view of the
#: rows' ``heads`` (code reads the row, registered families included).
HEAD_FAMILIES: tuple[str, ...] = tuple(k for k, r in FAMILIES.items() if r.heads)


@dataclass(frozen=True)
class HeadSite:
    """Where the heads meet: ``block.<attention>.<projection>`` takes ``[.., H * d_head]``.

    Attributes:
        attention (str): The attention submodule of a decoder block.
        projection (str): Its output projection (an ``nn.Linear``).
        n_heads (int): ``H``.
    """

    attention: str
    projection: str
    n_heads: int


def _projection(block: nn.Module, site: HeadSite) -> nn.Linear:
    """The output projection (:func:`head_site` checked it is an ``nn.Linear``)."""
    return getattr(getattr(block, site.attention, None), site.projection, None)  # type: ignore[return-value]


def head_site(model: nn.Module, blocks: nn.ModuleList) -> HeadSite:
    """The :class:`HeadSite` of ``model``'s family, checked against its blocks.

    Raises:
        SublayerUnsupportedError: a family whose row names no head split, or blocks whose
            output projection is not an ``nn.Linear`` over ``H`` equal head slices.
    """
    kind = model_type(model)
    row = family_row(kind)
    if row is None or row.heads is None:
        known = [k for k, r in FAMILIES.items() if r.heads]
        raise SublayerUnsupportedError(
            f"Per-head credits are not defined for {kind!r}: they are implemented for the "
            f"families whose attention adds the projection of the concatenated heads to the "
            f"residual as it is ({', '.join(known)}). Use heads=False (the attention credit "
            "stays whole).")
    attention, projection = row.heads
    site = HeadSite(attention, projection, int(_config(model).num_attention_heads))
    for block in blocks:
        proj = _projection(block, site)
        if not isinstance(proj, nn.Linear) or proj.in_features % site.n_heads:
            raise SublayerUnsupportedError(
                f"The decoder blocks of this {kind!r} model have no {attention}.{projection} "
                f"Linear "
                f"over {site.n_heads} heads: use heads=False.")
    return site
