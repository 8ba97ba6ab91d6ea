"""An offline word-level tokenizer over the 128-token test vocabulary."""

from __future__ import annotations

from typing import Any


def word_tokenizer(**kwargs: Any):
    """Words ``w0..w123`` after ``<pad> <bos> <eos> <unk>`` (ids 0-3); no chat template.

    Keyword arguments go to ``PreTrainedTokenizerFast`` (e.g. ``chat_template=...``).
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(124)]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", **kwargs)
