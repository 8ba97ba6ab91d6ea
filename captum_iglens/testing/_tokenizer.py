"""An offline word-level tokenizer for the tiny test models: no download, no files."""

from __future__ import annotations

from typing import Any

__all__ = ["word_tokenizer"]

_SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def word_tokenizer(vocab: int = 128, **kwargs: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` over words ``w0 .. w{vocab - 5}`` after 4 special tokens.

    Ids 0-3 are ``<pad> <bos> <eos> <unk>`` (the tiny models' ``pad_token_id``,
    ``bos_token_id``, ``eos_token_id``), then ``w0`` is id 4, ``w1`` id 5, and so on; text
    splits on whitespace, so ``"w5 w6"`` is ids ``[9, 10]``. No chat template.

    Args:
        vocab (int, optional): Vocabulary size, the model's. Default: 128.
        **kwargs: Passed to ``PreTrainedTokenizerFast`` (e.g. ``chat_template=...``).

    Raises:
        ValueError: ``vocab`` below 5.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    if vocab < 5:
        raise ValueError(f"vocab must be >= 5 (4 special tokens and a word), got {vocab}")
    words = _SPECIALS + [f"w{i}" for i in range(vocab - len(_SPECIALS))]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", **kwargs)
