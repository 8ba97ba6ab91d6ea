"""The offline word-level tokenizer over the 128-token test vocabulary: a thin re-export of
:func:`captum_iglens.testing.word_tokenizer` (``<pad> <bos> <eos> <unk>``, then ``w0..w123``).
"""

from __future__ import annotations

from captum_iglens.testing._tokenizer import word_tokenizer  # noqa: F401
