"""The layer options of the iglens commands: which hidden states, at which granularity."""

from __future__ import annotations

import argparse
from typing import Optional

from captum_iglens.cli._common import UsageError, add_check, at_least


def parse_layers(text: str) -> list[int]:
    """``--layers``: comma-separated hidden-state indices such as ``0,10,20,30``.

    Raises:
        UsageError: if a part is not an int, no layer is named or one is named twice.
    """
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise UsageError(
            f"--layers takes comma-separated ints such as 0,10,20,30, got {text!r}"
        ) from err
    if not layers:
        raise UsageError(f"--layers names no layer: give ints such as 0,10,20,30, got {text!r}")
    if len(set(layers)) != len(layers):
        raise UsageError(f"--layers names a layer twice: {text!r}")
    return layers


def add_layer_options(parser: argparse.ArgumentParser, default_k: Optional[int] = None) -> None:
    """``--layers`` / ``--k`` (not both).

    Args:
        parser (ArgumentParser): A command's parser.
        default_k (int, optional): ``--k`` when neither option is given; None: all blocks.
            Default: None.
    """
    parser.add_argument(
        "--layers",
        type=parse_layers,
        default=None,
        help="hidden-state indices, e.g. 0,10,20,30 (the last block is always added)",
    )
    k_help = "use k evenly spaced layers instead of all blocks"
    if default_k is not None:
        k_help = f"k evenly spaced layers (default: {default_k} when --layers is not given)"
    parser.add_argument("--k", type=at_least(1, "--k"), default=None, help=k_help)
    add_check(parser, _check_layers_or_k)


def add_granularity_options(parser: argparse.ArgumentParser, heads: bool = True) -> None:
    """``--granularity`` (block or sublayer) and, with ``heads``, ``--heads``.

    Args:
        parser (ArgumentParser): A command's parser.
        heads (bool, optional): Add ``--heads`` (per-head credits; needs
            ``--granularity sublayer``). Default: True.
    """
    from captum_iglens.settings import DEFAULT_GRANULARITY, GRANULARITIES

    parser.add_argument("--granularity", choices=GRANULARITIES, default=DEFAULT_GRANULARITY,
                        help="block (default): one credit per layer; sublayer: an attention "
                        "credit and an MLP credit per block (L3.attn, L3.mlp), adding up to "
                        "the block's")
    if heads:
        parser.add_argument("--heads", action="store_true",
                            help="with --granularity sublayer: split each attention credit "
                            "over the heads (JSON head_credits; one backward pass per step, "
                            "--n-steps steps; Llama-like families)")
        add_check(parser, _check_heads)


def _check_heads(args: argparse.Namespace) -> None:
    if args.heads and args.granularity != "sublayer":
        raise UsageError("--heads needs --granularity sublayer")
    if args.heads and not getattr(args, "json_path", None):
        raise UsageError("--heads writes per-head credits to the JSON export only (the table "
                         "and plot show each attention total): add --json FILE, or drop --heads "
                         "(it costs one backward pass per step)")


def _check_layers_or_k(args: argparse.Namespace) -> None:
    """``--layers`` or ``--k``, within the blocks of a model that its name or config tells.

    The block count of a named model or a folder's ``config.json`` is known before the load;
    a ``.gguf`` file's is checked after it.
    """
    if args.layers is not None and args.k is not None:
        raise UsageError("give --layers or --k, not both")
    if (args.layers is None and args.k is None) or not hasattr(args, "model"):
        return
    from captum_iglens.models.facts import block_count

    n_blocks = block_count(args.model)
    if n_blocks is not None:
        resolve_layers(args, n_blocks)


def evenly_spaced_layers(n_layers: int, k: int) -> list[int]:
    """``k`` hidden-state indices evenly spaced over ``0..n_layers``, the last block included.

    Raises:
        UsageError: if ``k`` is not in ``1..n_layers + 1``.
    """
    if not 1 <= k <= n_layers + 1:
        raise UsageError(
            f"--k must be between 1 and {n_layers + 1} for a model with {n_layers} blocks"
        )
    if k == 1:
        return [n_layers]
    return sorted({round(i * n_layers / (k - 1)) for i in range(k)})


def resolve_layers(
    args: argparse.Namespace, n_layers: int, default_k: Optional[int] = None
) -> Optional[list[int]]:
    """The layers named by ``--layers`` / ``--k`` for a model with ``n_layers`` blocks.

    Args:
        args (Namespace): Parsed and checked arguments.
        n_layers (int): Number of decoder blocks of the loaded model.
        default_k (int, optional): ``--k`` when neither option is given (capped at
            ``n_layers + 1``). Default: None (all blocks).

    Returns:
        Hidden-state indices, or None for all blocks.

    Raises:
        UsageError: a layer index or ``--k`` beyond this model's blocks.
    """
    if args.layers is not None:
        for layer in args.layers:
            if not -(n_layers + 1) <= layer <= n_layers:
                raise UsageError(
                    f"--layers: layer index {layer} is out of range: this model has {n_layers} "
                    f"decoder blocks, so hidden-state indices run from 0 to {n_layers} "
                    f"(or -{n_layers + 1}..-1 from the end)"
                )
        return args.layers
    if args.k is not None:
        return evenly_spaced_layers(n_layers, args.k)
    if default_k is not None:
        return evenly_spaced_layers(n_layers, min(default_k, n_layers + 1))
    return None


def hidden_state_indices(layers: Optional[list[int]], n_layers: int) -> list[int]:
    """The sorted hidden-state indices a lens takes from ``layers`` (the last block added).

    The integer case of :func:`captum_iglens.lens.layers.resolve_layer_indices`, without
    torch, for the checks made before the model is loaded.

    Args:
        layers (list of int, optional): :func:`resolve_layers`'s result (None: all blocks).
        n_layers (int): Number of decoder blocks.

    Returns:
        list[int]: as the run's fingerprint records them.
    """
    if layers is None:
        return list(range(1, n_layers + 1))
    indices = {layer + n_layers + 1 if layer < 0 else layer for layer in layers}
    return sorted(indices | {n_layers})
