"""Inputs and provenance of the causal validation: prompt sets, their bounds, their hashes.

The prompt set of :func:`captum_iglens.validate.driver.validate` (the packaged frozen set or a
file), the token-count bounds that let ``mean`` ablation be refused before anything is
explained, and :func:`provenance`: what a validation's numbers depend on (package, torch and
transformers versions, the model's name and content hash, the hashes of the prompt and pair
files, the seeds and every setting), recorded in its JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import warnings
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from captum_iglens._utils.lines import split_lines, surrogate_problem

if TYPE_CHECKING:  # torch is imported only where a model is: the CLI reads prompts before
    from torch import nn

__all__ = ["DEFAULT_MIN_REFERENCE", "data_file", "load_prompts", "max_reference_positions",
           "prompt_lengths", "provenance", "reference_shortfall"]

DEFAULT_MIN_REFERENCE = 200


def data_file(name: str) -> str:
    """The text of a file shipped in the package's ``data/`` folder (UTF-8)."""
    return (resources.files("captum_iglens") / "data" / name).read_text(encoding="utf-8")


def load_prompts(path: Union[str, Path, None] = None) -> list[str]:
    """The validation prompts: the frozen set shipped with the package, or a file.

    Args:
        path (str or Path, optional): A ``.jsonl`` file of objects with a ``"prompt"`` key,
            or a text file with one prompt per line. Default: the package's
            ``data/validation_prompts.jsonl`` (read with :mod:`importlib.resources`).

    Returns:
        list[str]: the prompts, in file order.

    Raises:
        ValueError: if the file holds no prompt or a JSON line has no ``"prompt"`` string.
    """
    if path is None:
        text = data_file("validation_prompts.jsonl")
        is_jsonl = True
    else:
        text = Path(path).read_text(encoding="utf-8")
        is_jsonl = str(path).endswith(".jsonl")
    lines = [line.strip() for line in split_lines(text) if line.strip()]
    prompts = [_prompt_of(json.loads(line)) for line in lines] if is_jsonl else lines
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"{path or 'the packaged prompt set'} holds no prompt, or a JSON line "
                         "without a non-empty \"prompt\" string.")
    for number, prompt in enumerate(prompts, start=1):
        broken = surrogate_problem(prompt, f"prompt {number}")
        if broken:
            raise ValueError(f"{path or 'the packaged prompt set'}: {broken}.")
    return prompts


def _prompt_of(entry: Any) -> Any:
    return entry.get("prompt") if isinstance(entry, dict) else None


def prompt_lengths(tokenizer: Any, prompts: Sequence[str]) -> list[int]:
    """Token count of each prompt as :func:`validate` explains it (chat template applied).

    Args:
        tokenizer: The model's tokenizer.
        prompts (sequence of str): The prompts.

    Returns:
        list[int]: one count per prompt. The template warnings (no template, a template that
        writes today's date) are left to the explanation itself.
    """
    from captum_iglens.text.prompts import render_prompt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [len(render_prompt(tokenizer, prompt, True).ids) for prompt in prompts]


def max_reference_positions(lengths: Sequence[int], max_new_tokens: int) -> int:
    """The most reference positions ``mean`` ablation can find for any prompt of a set.

    A prompt's reference set is every other prompt's sequence (prompt and answer) after
    position 0, and an answer has at most ``max_new_tokens`` tokens: a prompt's set holds at
    most the sum over the others of ``length + max_new_tokens - 1``. The largest such set is
    the shortest prompt's.

    Args:
        lengths (sequence of int): Tokens of each prompt (chat template included), or upper
            bounds of them.
        max_new_tokens (int): Longest answer.

    Returns:
        int: the upper bound (0 for fewer than two prompts).
    """
    spans = [n + max_new_tokens - 1 for n in lengths]
    return sum(spans) - min(spans) if len(spans) > 1 else 0


def reference_shortfall(lengths: Sequence[int], max_new_tokens: int,
                        min_reference: int = DEFAULT_MIN_REFERENCE) -> Optional[str]:
    """Why ``mean`` ablation cannot run on a prompt set; None when it may.

    Mean ablation fails for certain when even the largest reference set of
    :func:`max_reference_positions` falls short of ``min_reference`` (every prompt's own
    set is then too small, whichever tokens pass the threshold).

    Args:
        lengths (sequence of int): As for :func:`max_reference_positions`.
        max_new_tokens (int): Longest answer.
        min_reference (int, optional): Fewest reference positions. Default: 200.

    Returns:
        str or None: the shortfall, counts and the prompts needed, without the remedy.
    """
    most = max_reference_positions(lengths, max_new_tokens)
    if most >= min_reference or len(lengths) < 2:
        return None
    needed = math.ceil(min_reference / (most / (len(lengths) - 1))) + 1
    return (f"mean ablation needs at least {min_reference} reference positions (the other "
            f"prompts' tokens, position 0 excluded), but with these {len(lengths)} prompts and "
            f"answers of at most {max_new_tokens} tokens a prompt's reference set holds at most "
            f"{most} (at least {needed} prompts of this length are needed)")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_entry(path: Optional[Union[str, Path]], packaged: str) -> dict[str, str]:
    """Where a file came from and the SHA-256 of its bytes (UTF-8 text)."""
    if path is None:
        return {"file": f"packaged: captum_iglens/data/{packaged}",
                "file_sha256": _sha256(data_file(packaged))}
    return {"file": str(path),
            "file_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}


def provenance(model: nn.Module, prompts: Sequence[str], prompts_file: Optional[str],
               pairs: Optional[Sequence[Any]], pairs_file: Optional[str],
               settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a validation's numbers depend on, for its JSON.

    Args:
        model (nn.Module): The validated model.
        prompts (sequence of str): The prompts used.
        prompts_file (str, optional): Their file; ``None``: the packaged set.
        pairs (sequence of PromptPair, optional): The patching pairs used (``None``: none).
        pairs_file (str, optional): Their file; ``None``: the packaged set.
        settings (mapping): Every setting of the run (seeds included).

    Returns:
        dict: ``package``, ``torch``, ``transformers``, ``numpy``, ``scipy``, ``python``
        versions; ``model`` (name) and ``weights`` (:func:`~captum_iglens.run.fingerprint.
        weights_digest`, BLAKE2b of every parameter and buffer), ``dtype``; ``prompts``
        and ``pairs`` (file, its SHA-256, the SHA-256 of the items used, their count);
        ``settings``.
    """
    import numpy
    import scipy
    import torch
    import transformers

    from captum_iglens import __version__
    from captum_iglens.lens.architectures import display_name
    from captum_iglens.run.fingerprint import weights_digest

    out: dict[str, Any] = {
        "package": __version__, "torch": torch.__version__,
        "transformers": transformers.__version__, "numpy": numpy.__version__,
        "scipy": scipy.__version__, "python": platform.python_version(),
        "model": display_name(model), "weights": weights_digest(model),
        "dtype": str(next((p.dtype for p in model.parameters()), "none")),
        "prompts": {**_file_entry(prompts_file, "validation_prompts.jsonl"),
                    "items_sha256": _sha256(json.dumps(list(prompts))), "count": len(prompts)},
        "settings": dict(settings),
    }
    if pairs is not None:
        items = [vars(p) if hasattr(p, "__dict__") else p for p in pairs]
        out["pairs"] = {**_file_entry(pairs_file, "patching_pairs.jsonl"),
                        "items_sha256": _sha256(json.dumps(items, sort_keys=True)),
                        "count": len(items)}
    return out
