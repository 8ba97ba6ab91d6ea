"""The text a lens is fitted on: the user's, or a corpus the model writes itself.

:func:`corpus_ids` returns fixed-length token chunks ``[N, S]``. From a text (``--text-file``)
the text is tokenised once and cut into chunks. Without one, the model continues each
packaged prompt (``captum_iglens/data/*.jsonl``) by **sampling** (temperature 1, a fixed
seed, ``transformers``' ``generate``): greedy decoding repeats itself within a few dozen
tokens, sampling gives varied text at the same cost.

Bias of the default corpus: it is the model's own distribution, so the fitted lens is best on
text the model finds likely (lower entropy than human text, the packaged prompts' topics: short
facts, arithmetic, code). A lens for another domain should be fitted on that domain's text.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Optional

import torch
from torch import Tensor, nn

from captum_iglens.lens.state import input_device, model_state_preserved

__all__ = ["corpus_ids", "packaged_prompts"]


def packaged_prompts() -> list[str]:
    """The prompts of the packaged ``*.jsonl`` files (``"prompt"``, else ``"clean"`` fields)."""
    prompts: list[str] = []
    folder = resources.files("captum_iglens") / "data"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".jsonl"):
            continue
        for line in entry.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                text = row.get("prompt") or row.get("clean")
                if isinstance(text, str) and text.strip():
                    prompts.append(text)
    return prompts


def corpus_ids(model: nn.Module, tokenizer: Any, text: Optional[str] = None, *,
               seq_len: int, n_sequences: int, seed: int = 0) -> Tensor:
    """Token chunks ``[N, seq_len]`` (int64) to fit a lens on.

    Args:
        model (nn.Module): The causal LM (used only when ``text`` is None).
        tokenizer: Its tokenizer.
        text (str, optional): The user's text. Default: a corpus the model samples from the
            packaged prompts (see the module docstring for its bias).
        seq_len (int): Tokens per chunk.
        n_sequences (int): Chunks wanted (fewer when the text is shorter).
        seed (int, optional): Seed of the sampling. Default: 0.

    Raises:
        ValueError: ``text`` shorter than one chunk.
    """
    if text is not None:
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
        count = min(n_sequences, ids.numel() // seq_len)
        if count < 1:
            raise ValueError(f"The text has {ids.numel()} tokens, fewer than one chunk of "
                             f"{seq_len}: give a longer --text-file or a smaller seq_len.")
        return ids[: count * seq_len].reshape(count, seq_len).long()
    prompts = packaged_prompts()
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(prompts), generator=gen).tolist()
    chunks = []
    device = input_device(model)
    torch.manual_seed(seed)
    generate: Any = getattr(model, "generate")  # noqa: B009  (a transformers method)
    with torch.no_grad(), model_state_preserved(model):
        for index in order[:n_sequences]:
            prompt = tokenizer(prompts[index], return_tensors="pt").input_ids.to(device)
            new = max(seq_len - prompt.shape[1], 1)
            out = generate(prompt, do_sample=True, temperature=1.0, top_k=0,
                                 max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=tokenizer.eos_token_id or 0)
            chunks.append(out[0, :seq_len].cpu())
    width = min(int(c.numel()) for c in chunks)
    return torch.stack([c[:width] for c in chunks]).long()
