"""``iglens explain``: prompt in, answer out, IG-Lens token x layer table.

Examples::

    iglens explain "What is the capital of Vietnam?"
    iglens "What is the capital of Vietnam?"            # the same: explain is the default
    iglens explain --k 6 --json out.json "Name a prime number."
    echo "Why is the sky blue?" | iglens explain --stdin
    iglens explain --prompts-file prompts.txt           # one prompt per line, one report each
    iglens explain --target " Paris" "The capital of France is"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from captum_iglens.cli import _layer_options as layer_opts
from captum_iglens.cli import _options as opts
from captum_iglens.cli import _prompt_options as prompt_opts
from captum_iglens.cli._common import UsageError, exit_status_help, load, write_json

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "explain each answer token of a prompt, layer by layer (the default command)"
DESCRIPTION = (
    "IG-Lens: exact additive attribution of each answer token's probability to the decoder "
    "layers of a causal LM (arXiv:2606.29693). Runs offline on the embedded "
    "SmolLM2-135M-Instruct by default."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the model could not be loaded, the computation failed or --json / "
    "--plot could not be written",
    usage="usage error: something is wrong in the command line; found before the model is "
    "loaded, except what only the model can tell: a layer index or --k beyond its blocks, a "
    "--target or --contrast its tokenizer turns into no token, a --contrast whose tokens do "
    "not pair with the answer's (found before the answer is explained)",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens explain`` (and of the ``iglens PROMPT`` shorthand)."""
    prompt_opts.add_prompt_options(parser, sources=True)
    opts.add_model_options(parser)
    layer_opts.add_layer_options(parser)
    layer_opts.add_granularity_options(parser)
    opts.add_estimator_options(parser)
    opts.add_effect_option(parser)
    opts.add_lens_option(parser)
    opts.add_result_options(parser)
    opts.add_generation_options(parser)
    opts.add_output_options(
        parser,
        json_help="write the results as JSON to this path (a list for several prompts)",
        plot_help="write the token x layer heatmap and logit-lens trajectory (PNG, PDF, SVG) "
        "to this path; several prompts get PATH-<i>",
    )


def run(args: argparse.Namespace) -> int:
    """Explain ``args.prompts`` (or prompts read with ``--loop``) and print one report each.

    Args:
        args (Namespace): Arguments parsed and checked by the router.

    Returns:
        0

    Raises:
        UsageError: ``--layers`` / ``--k`` beyond the loaded model's blocks; a ``--target`` or
            ``--contrast`` that tokenises to no token; a ``--contrast`` of several tokens
            whose count is not the answer's.
        Exception: loading or computation errors (exit status 1).
    """
    from captum_iglens import resolve_decoder_blocks

    model, tokenizer = load(args.model)
    layers = layer_opts.resolve_layers(args, len(resolve_decoder_blocks(model)))
    foils = _check_foil(args, tokenizer)
    opts.warn_unused_template_date(args, tokenizer)
    results: list[Any] = []
    explain_one = _explainer(args, model, tokenizer, layers, foils)
    for prompt in _loop_prompts() if args.loop else args.prompts:
        results.append(explain_one(prompt))
    if args.json_path and not results:
        print(f"no prompt was explained: {args.json_path} not written", file=sys.stderr)
    elif args.json_path:
        dicts = [result.to_dict() for result in results]
        write_json(args.json_path, dicts[0] if len(dicts) == 1 else dicts)
    if args.plot_path and results:
        _write_plots(results, args.plot_path)
    return 0


def _check_foil(args: argparse.Namespace, tokenizer: Any) -> list[int]:
    """The foil ids of ``--contrast``, refused before anything is explained where wrong.

    Returns:
        list[int]: the ids (empty without ``--contrast``).

    Raises:
        UsageError: ``--contrast`` or ``--target`` tokenises to no token, or ``--contrast``
            has several tokens and ``--target`` another number of them.
    """
    if args.contrast is None:
        return []
    foils = _ids(tokenizer, "--contrast", args.contrast)
    if args.target is not None:
        answer = _ids(tokenizer, "--target", args.target)
        if len(foils) not in (1, len(answer)):
            raise UsageError(
                f"--contrast {args.contrast!r} is {_tokens(foils)} but --target "
                f"{args.target!r} is {_tokens(answer)}: give a foil of one token (used for "
                "every answer token) or of one token per answer token (a leading space matters)")
    return foils


def _ids(tokenizer: Any, option: str, text: str) -> list[int]:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise UsageError(f"{option} {text!r}: the model's tokenizer turns it into no token; "
                         "give text it keeps")
    return ids


def _tokens(ids: list[int]) -> str:
    return f"{len(ids)} token{'s' if len(ids) != 1 else ''} {ids}"


def _unpaired_foil(args: argparse.Namespace, foils: list[int]) -> UsageError:
    """The error of a foil of several tokens that does not pair with the generated answer."""
    return UsageError(
        f"--contrast {args.contrast!r} is {_tokens(foils)}, which does not pair with the answer "
        "generated for this prompt (another number of tokens): give a foil of one token (used "
        "for every answer token), or --target with one token per foil token")


def _explainer(
    args: argparse.Namespace, model: Any, tokenizer: Any, layers: Any, foils: list[int]
) -> Callable[[str], Any]:
    """A function that explains one prompt with the options of ``args`` and prints it."""
    from captum_iglens.text.explain_prompt import explain

    settings = opts.attribution_settings(args)

    def explain_one(prompt: str) -> Any:
        try:
            result = _explain(prompt)
        except ValueError as err:  # the generated answer has another number of tokens
            if len(foils) > 1 and args.target is None and str(err).startswith("contrast has"):
                raise _unpaired_foil(args, foils) from err
            raise
        _print(result, prompt)
        return result

    def _explain(prompt: str) -> Any:
        return explain(
            model,
            tokenizer,
            prompt,
            max_new_tokens=args.max_new_tokens,
            layers=layers,
            onset_frac=args.onset_frac,
            chat_template=not args.no_chat_template,
            target=args.target,
            onset_rule=args.onset_rule,
            top_k=args.top_k,
            template_kwargs=opts.template_kwargs(args),
            contrast=args.contrast,
            settings=settings,
            layer_readout=args.lens,
        )

    def _print(result: Any, prompt: str) -> None:
        print(f"prompt: {opts.echo(prompt)}")
        print(opts.template_note(result.chat_template_used))
        print(f"answer: {opts.echo(result.answer)}"
              + (" [truncated]" if result.truncated else ""))
        if args.target is not None:
            print(f"target token ids: {result.token_ids}")
        if args.contrast is not None:
            print(f"contrast (foil) token ids: {list(dict.fromkeys(result.contrast_ids))}")
        print(result.format_table())
        print()

    return explain_one


def _loop_prompts() -> Any:
    """``--loop``: prompts typed at ``prompt>`` until an empty line or end of input."""
    while True:
        try:
            prompt = input("prompt> ").strip()
        except EOFError:
            return
        if not prompt:
            return
        yield prompt


def _write_plots(results: list[Any], path: str) -> None:
    """``--plot``: one figure per result (``stem-<i>.ext`` when there are several)."""
    target = Path(path)
    for i, result in enumerate(results):
        out = target
        if len(results) > 1:
            out = target.with_name(f"{target.stem}-{i}{target.suffix}")
        result.plot(str(out))
        print(f"wrote {out}", file=sys.stderr)
        if result.top_k_tokens:  # --top-k: the K tokens at every layer, a figure of its own
            top = out.with_name(f"{out.stem}-topk{out.suffix}")
            result.plot_top_k(str(top))
            print(f"wrote {top}", file=sys.stderr)
