"""The benchmark's task generators: frozen, aligned, counterfactuals correct."""

from __future__ import annotations

import pytest

from captum_iglens.testing import word_tokenizer
from captum_iglens.validate.benchmark.tasks import (
    FACTS,
    IOI_TEMPLATES,
    aligned,
    answered,
    factual_pairs,
    ioi_pairs,
    task_pairs,
)
from captum_iglens.validate.patching import pair_ids

_WORDS = [f"w{i}" for i in range(30)]
_TEMPLATES = (("ABBA", "w40 {IO} w41 {S} w42 , {S} w43 w44"),
              ("BABA", "w40 {S} w41 {IO} w42 , {S} w43 w44"))


def test_ioi_is_frozen_and_several_hundred_pairs() -> None:
    pairs = ioi_pairs()
    assert len(pairs) == 400 and pairs == ioi_pairs()
    assert pairs != ioi_pairs(seed=1)
    assert {p.category for p in pairs} == {"ioi-ABBA", "ioi-BABA"}
    kinds = [p.category for p in pairs[:len(IOI_TEMPLATES)]]
    assert kinds.count("ioi-ABBA") == kinds.count("ioi-BABA")
    # no mirrored couple: (A, B) and (B, A) of one template never both appear
    seen = {(p.clean, p.corrupted) for p in pairs}
    assert not any((p.corrupted, p.clean) in seen for p in pairs)


def test_ioi_counterfactual_swaps_the_names() -> None:
    for p in ioi_pairs(60):
        io, s = p.answer.strip(), p.foil.strip()
        # the corrupted prompt is the clean one with the names swapped
        assert p.corrupted == p.clean.replace(io, "\0").replace(s, io).replace("\0", s)
        assert p.clean.count(s) == 2 and p.clean.count(io) == 1  # the subject repeats
        assert p.corrupted.count(io) == 2 and p.corrupted.count(s) == 1


def test_ioi_pairs_align_on_a_tokenizer() -> None:
    tok = word_tokenizer(128)
    pairs = ioi_pairs(40, names=_WORDS, templates=_TEMPLATES)
    kept, dropped = aligned(tok, pairs)
    assert kept == pairs and dropped == []
    for p in kept:
        clean, corrupted, y, foil = pair_ids(tok, p)
        assert len(clean) == len(corrupted)
        assert tok.convert_ids_to_tokens(y) == p.answer.strip()
        assert tok.convert_ids_to_tokens(foil) == p.foil.strip()
        # the corrupted prompt's indirect object is the clean foil
        assert tok.convert_ids_to_tokens(corrupted[1]) in (p.foil.strip(), p.answer.strip())


def test_factual_pairs() -> None:
    pairs = factual_pairs()
    assert len(pairs) == 200 and pairs == factual_pairs()
    assert {p.category for p in pairs} == set(FACTS)
    for p in pairs:
        template, rows = FACTS[p.category]
        answers = dict(rows)
        x = next(s for s in answers if template.format(X=s) == p.clean)
        z = next(s for s in answers if template.format(X=s) == p.corrupted)
        assert (p.answer, p.foil) == (f" {answers[x]}", f" {answers[z]}")
        assert p.answer != p.foil
    with pytest.raises(ValueError, match="n must be"):
        factual_pairs(10_000)


def test_unequal_token_counts_are_dropped_and_only_answered_pairs_kept() -> None:
    tok = word_tokenizer(128)
    facts = {"r": ("w50 w51 {X} w52", (("w1", "w10"), ("w2 w3", "w11"), ("w4", "w12")))}
    kept, dropped = aligned(tok, factual_pairs(3, facts=facts))
    assert len(kept) == 1 and len(dropped) == 2  # "w2 w3" is two tokens
    assert all("do not align" in d for d in dropped)
    right = answered(tok, kept, lambda clean: pair_ids(tok, kept[0])[2])
    wrong = answered(tok, kept, lambda clean: pair_ids(tok, kept[0])[3])
    assert right == kept and wrong == []


def test_task_pairs_names_the_tasks() -> None:
    assert task_pairs("ioi") == ioi_pairs()
    assert len(task_pairs("packaged")) >= 2
    with pytest.raises(ValueError, match="Unknown task"):
        task_pairs("nope")
