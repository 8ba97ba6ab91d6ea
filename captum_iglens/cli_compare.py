"""``iglens compare``: IG-Lens vs Captum's layer methods on one answer token.

    iglens compare "What is the capital of Vietnam?"                # first answer token
    iglens compare --token-index 6 --k 4 "What is the capital of Vietnam?"
    iglens compare --prefix "The capital of Vietnam is" "What is the capital of Vietnam?"
    iglens compare --json cmp.json --plot cmp.png "..."
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from captum_iglens.cli import (
    CliError,
    _parse_layers,
    _Parser,
    check_output_paths,
    evenly_spaced_layers,
    load,
)

__all__ = ["build_compare_parser", "run_compare"]

DEFAULT_K = 6


def build_compare_parser() -> argparse.ArgumentParser:
    """Parser of ``iglens compare``."""
    from captum_iglens.ig_lens import BASELINES, METHODS

    parser = _Parser(
        prog="iglens compare",
        description=(
            "Explain one answer token with IG-Lens, Captum's LayerIntegratedGradients and "
            "LayerConductance (one layer at a time) and the logit lens, on the same ids, "
            "position, target and layers, and compare completeness: |sum over layers - each "
            "method's own total change| (arXiv:2606.29693)."
        ),
    )
    add = parser.add_argument
    add("prompt", nargs="*", help="the prompt (several words are joined)")
    add("--model", default=None,
        help="'smollm2' (default, embedded), a local model folder or a .gguf file")
    add("--layers", type=_parse_layers, default=None,
        help="hidden-state indices, e.g. 0,10,20,30 (the last block is always added)")
    add("--k", type=int, default=None,
        help=f"k evenly spaced layers (default: {DEFAULT_K} when --layers is not given)")
    add("--token-index", type=int, default=None,
        help="which answer token to explain (default: 0, the first)")
    add("--prefix", default=None,
        help="instead of an answer token, explain the model's next token after the prompt "
        "(chat template applied) followed by this text")
    add("--n-steps", type=int, default=20,
        help="integration steps per Captum layer run (default: 20)")
    add("--baseline-token", type=int, default=None,
        help="Captum baseline: this token id at every content position, special tokens "
             "kept (default: a space token)")
    add("--lens-baseline", default="mean", choices=BASELINES,
        help="IG-Lens baseline in residual space (default: mean)")
    add("--gradient-method", default=None, choices=[m for m in METHODS if m != "prediction_aware"],
        help="also run IG-Lens with this gradient estimator")
    add("--max-new-tokens", type=int, default=32, help="longest answer (default: 32)")
    add("--internal-batch-size", type=int, default=None,
        help="integration steps per Captum forward chunk")
    add("--no-chat-template", action="store_true",
        help="use the raw prompt, without the chat template")
    add("--json", dest="json_path", default=None, help="write the report as JSON to this path")
    add("--plot", dest="plot_path", default=None,
        help="write the bar chart (PNG, PDF, SVG) to this path")
    return parser


def run_compare(argv: Sequence[str]) -> int:
    """Run ``iglens compare`` with ``argv`` (without the word ``compare``)."""
    from captum_iglens.readout import resolve_decoder_blocks
    from captum_iglens.text import build_prompt_ids, generate_answer

    args = build_compare_parser().parse_args(list(argv))
    prompt = " ".join(args.prompt).strip()
    if not prompt:
        raise CliError("the prompt is empty: give a prompt to explain")
    if args.n_steps < 2:
        raise CliError("--n-steps must be >= 2")
    if args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be >= 1")
    if args.layers is not None and args.k is not None:
        raise CliError("give --layers or --k, not both")
    if args.prefix is not None and args.token_index is not None:
        raise CliError("give --token-index or --prefix, not both")
    if args.token_index is not None and args.token_index < 0:
        raise CliError("--token-index must be >= 0")
    if args.internal_batch_size is not None and args.internal_batch_size < 1:
        raise CliError("--internal-batch-size must be >= 1")
    check_output_paths(args)
    model, tokenizer = load(args)
    n_layers = len(resolve_decoder_blocks(model))
    layers = args.layers if args.layers is not None else evenly_spaced_layers(
        n_layers, args.k if args.k is not None else min(DEFAULT_K, n_layers + 1)
    )
    prompt_ids, used = build_prompt_ids(tokenizer, prompt, not args.no_chat_template)
    if args.prefix is not None:
        extra = list(tokenizer(args.prefix, add_special_tokens=False)["input_ids"])
        ids, target, what = prompt_ids + extra, None, f"next token after prefix {args.prefix!r}"
    else:
        index = args.token_index or 0
        answer = generate_answer(model, tokenizer, prompt_ids, max(args.max_new_tokens, index + 1))
        if index >= len(answer):
            raise CliError(
                f"--token-index {index} is past the answer, which has {len(answer)} tokens"
            )
        ids, target = prompt_ids + answer[:index], answer[index]
        what = f"answer token {index} of {tokenizer.decode(answer, skip_special_tokens=True)!r}"
    import torch

    from captum_iglens.compare import compare_completeness

    methods = ["ig_lens", "layer_integrated_gradients", "layer_conductance", "logit_lens"]
    if args.gradient_method:
        methods.insert(1, "ig_lens_gradient")
    device = model.get_input_embeddings().weight.device
    report = compare_completeness(
        model, torch.tensor([ids], device=device), target=target, position=-1, layers=layers,
        baselines=args.baseline_token, n_steps=args.n_steps, methods=methods,
        lens_baseline=args.lens_baseline, gradient_method=args.gradient_method or "gausslegendre",
        internal_batch_size=args.internal_batch_size, tokenizer=tokenizer,
    )
    print(f"prompt: {prompt}" + ("" if used else "  (no chat template: raw prompt)"))
    print(f"explaining: {what}")
    print(report.format_table())
    if args.json_path:
        payload = {"prompt": prompt, "explained": what, **report.to_dict()}
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plot_path:
        report.plot().savefig(args.plot_path, dpi=120)
        print(f"wrote {args.plot_path}", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:  # pragma: no cover - via cli.main
    from captum_iglens.cli import main as cli_main

    return cli_main(["compare", *(sys.argv[1:] if argv is None else argv)])
