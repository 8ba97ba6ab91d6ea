"""``iglens compare``: IG-Lens vs Captum's layer methods on one answer token.

Examples::

    iglens compare "What is the capital of Vietnam?"                # first answer token
    iglens compare --token-index 6 --k 4 "What is the capital of Vietnam?"
    iglens compare --prefix "The capital of Vietnam is" "What is the capital of Vietnam?"
    iglens compare --json cmp.json --plot cmp.png "..."
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from captum_iglens.cli import _layer_options as layer_opts
from captum_iglens.cli import _options as opts
from captum_iglens.cli import _prompt_options as prompt_opts
from captum_iglens.cli._common import (
    UsageError,
    exit_status_help,
    load,
    model_device,
    write_json,
)

__all__ = ["DEFAULT_K", "DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

DEFAULT_K = 6
#: Where the explained token came from with --token-index: the greedy answer's own token.
GREEDY_SOURCE = "greedy answer token"
HELP = "compare IG-Lens with Captum's LayerIntegratedGradients and LayerConductance"
DESCRIPTION = (
    "Explain one answer token with IG-Lens, Captum's LayerIntegratedGradients and "
    "LayerConductance (one layer at a time) and the logit lens, on the same ids, position, "
    "target and layers, and compare completeness: |sum over layers - each method's own total "
    "change| (arXiv:2606.29693)."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the model could not be loaded, the computation failed or --json / "
    "--plot could not be written",
    usage="usage error: something is wrong in the command line; found before the model is "
    "loaded, except what only the model can tell: a layer index or --k beyond its blocks, "
    "--token-index past the answer",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens compare``."""
    from captum_iglens.settings import BASELINES, CAPTUM_METHODS

    prompt_opts.add_prompt_options(parser)
    opts.add_model_options(parser)
    layer_opts.add_layer_options(parser, default_k=DEFAULT_K)
    parser.add_argument("--token-index", type=opts.at_least(0, "--token-index"), default=None,
                        help="which answer token to explain (default: 0, the first)")
    parser.add_argument("--prefix", default=None,
                        help="instead of an answer token, explain the model's next token after "
                        "the prompt (chat template applied) followed by this text")
    opts.add_estimator_options(parser, n_steps=20, with_method=False,
                               n_steps_help="integration steps per Captum layer run",
                               batch_help="integration steps per Captum forward chunk")
    parser.add_argument("--baseline-token", type=opts.at_least(0, "--baseline-token"),
                        default=None, help="Captum baseline: this token id at every content "
                        "position, special tokens kept (default: a space token)")
    parser.add_argument("--lens-baseline", default=None, choices=BASELINES,
                        help="give IG-Lens this residual-space baseline and a total of its own "
                        "(default: none, IG-Lens starts at the shared reference, like Captum)")
    parser.add_argument("--gradient-method", default=None,
                        choices=CAPTUM_METHODS,
                        help="also run IG-Lens with this gradient estimator")
    opts.add_generation_options(parser)
    opts.add_output_options(parser, json_help="write the report as JSON to this path",
                            plot_help="write the bar chart (PNG, PDF, SVG) to this path")
    opts.add_check(parser, _check_token_choice)


def _check_token_choice(args: argparse.Namespace) -> None:
    if args.prefix is not None and args.token_index is not None:
        raise UsageError("give --token-index or --prefix, not both")


def run(args: argparse.Namespace) -> int:
    """Compare the methods on the token chosen by ``args`` and print the table.

    Args:
        args (Namespace): Arguments parsed and checked by the router.

    Returns:
        0

    Raises:
        UsageError: ``--layers`` / ``--k`` beyond the loaded model's blocks, or
            ``--token-index`` past the answer.
        Exception: loading or computation errors (exit status 1).
    """
    import torch

    from captum_iglens import resolve_decoder_blocks
    from captum_iglens.compare.driver import compare_completeness

    prompt = args.prompts[0]
    model, tokenizer = load(args.model)
    layers = layer_opts.resolve_layers(args, len(resolve_decoder_blocks(model)), DEFAULT_K)
    opts.warn_unused_template_date(args, tokenizer)
    ids, target, what, used = _explained_token(args, model, tokenizer, prompt)
    methods = ["ig_lens", "layer_integrated_gradients", "layer_conductance", "logit_lens"]
    if args.gradient_method:
        methods.insert(1, "ig_lens_gradient")
    report = compare_completeness(
        model, torch.tensor([ids], device=model_device(model)), target=target, position=-1,
        layers=layers, baselines=args.baseline_token, n_steps=args.n_steps, methods=methods,
        lens_baseline=args.lens_baseline, gradient_method=args.gradient_method or "gausslegendre",
        internal_batch_size=args.internal_batch_size, tokenizer=tokenizer,
    )
    if target is not None:  # the token the model generated greedily, not one the user gave
        report.target_source = GREEDY_SOURCE  # type: ignore[union-attr]  # one position: a report
    print(f"prompt: {opts.echo(prompt)}")
    print(opts.template_note(used))
    print(f"explaining: {opts.echo(what)}")
    print(report.format_table())
    if args.json_path:
        write_json(args.json_path, {"prompt": prompt, "explained": what, **report.to_dict()})
    if args.plot_path:
        report.plot().savefig(args.plot_path, dpi=120)  # type: ignore[union-attr]  # a report
        print(f"wrote {args.plot_path}", file=sys.stderr)
    return 0


def _explained_token(
    args: argparse.Namespace, model: Any, tokenizer: Any, prompt: str
) -> tuple[list[int], Optional[int], str, bool]:
    """The ids, target, description and chat-template flag of the token to explain.

    Returns:
        (ids, target, what, used): the input ids (the token is predicted after the last),
        the target id (None: the model's greedy next token), a description, and whether the
        chat template was applied.

    Raises:
        UsageError: ``--token-index`` past the generated answer.
    """
    from captum_iglens.text.explain_prompt import generate_answer
    from captum_iglens.text.prompts import render_prompt

    rendered = render_prompt(tokenizer, prompt, not args.no_chat_template,
                             opts.template_kwargs(args))
    prompt_ids, used = rendered.ids, rendered.chat_template_used
    if args.prefix is not None:
        extra = list(tokenizer(args.prefix, add_special_tokens=False)["input_ids"])
        return prompt_ids + extra, None, f"next token after prefix {args.prefix!r}", used
    index = args.token_index or 0
    answer = generate_answer(model, tokenizer, prompt_ids, max(args.max_new_tokens, index + 1))
    if index >= len(answer):
        raise UsageError(
            f"--token-index {index} is past the answer, which has {len(answer)} tokens"
        )
    what = f"answer token {index} of {tokenizer.decode(answer, skip_special_tokens=True)!r}"
    return prompt_ids + answer[:index], answer[index], what, used
