"""The benchmark's tasks, generated offline with a frozen seed: IOI, factual recall, packaged.

Every task is a list of :class:`~captum_iglens.validate.pairs.PromptPair` (clean and
corrupted prompt, answer and foil), the form counterfactual patching reads; the clean
prompts are also what the ablations explain.

* **IOI** (indirect-object identification; the templates follow the public ones of Wang et
  al. 2022, "Interpretability in the Wild", arXiv:2211.00593): ``"When Mary and John went to
  the store, John gave a drink to"`` -> `` Mary``. ABBA templates name the indirect object
  first, BABA ones second; the counterfactual swaps the two names everywhere, so the
  answer becomes the foil and the token multiset is unchanged.
* **Factual recall**: capitals, official languages and currencies of countries; the
  corrupted prompt names another country of the same relation whose answer differs.
* **Packaged**: the pairs shipped with the package
  (:func:`~captum_iglens.validate.pairs.load_pairs`).

No pair is ever its own mirror's duplicate: of ``(A, B)`` and ``(B, A)`` only one is made
(the reverse patch covers the other direction). Which pairs a model is tested on depends
on the model: :func:`aligned` keeps those of equal token counts under its tokenizer
(answer and foil distinct first tokens), :func:`answered` those where its greedy next token
is the clean answer. Both run at benchmark time; the generators need no tokenizer.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from captum_iglens.validate.pairs import PromptPair, load_pairs

__all__ = ["FACTS", "IOI_NAMES", "IOI_TEMPLATES", "TASK_SEED", "TASKS", "aligned", "answered",
           "factual_pairs", "ioi_pairs", "packaged_pairs", "task_pairs"]

#: The frozen seed of every generator (the pre-registration's ``seeds.tasks``).
TASK_SEED = 30

#: Common English first names (single tokens with a leading space in the GPT-2-style BPEs of
#: the benchmark's families; :func:`aligned` drops the pairs where one is not).
IOI_NAMES: tuple[str, ...] = (
    "Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Laura", "Mark",
    "Emma", "Peter", "Kate", "Daniel", "Lisa", "Michael", "Alice", "Robert", "Susan",
    "George", "Linda", "Steven", "Karen", "Brian", "Helen", "Kevin", "Julia", "Jack",
    "Rachel", "Eric", "Amy", "Frank", "Grace", "Adam", "Jessica", "Sam",
)

#: ``(kind, template)``: ``{IO}`` the indirect object (the answer), ``{S}`` the subject,
#: named twice. ABBA: IO first; BABA: S first.
IOI_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("ABBA", "When {IO} and {S} went to the store, {S} gave a drink to"),
    ("ABBA", "When {IO} and {S} got a snack at the cafe, {S} decided to give it to"),
    ("ABBA", "After {IO} and {S} went to the park, {S} gave a ball to"),
    ("ABBA", "Then, {IO} and {S} had a long argument, and afterwards {S} said to"),
    ("ABBA", "While {IO} and {S} were working at the office, {S} gave a book to"),
    ("ABBA", "Friends {IO} and {S} found a necklace at the beach. {S} gave it to"),
    ("BABA", "When {S} and {IO} went to the store, {S} gave a drink to"),
    ("BABA", "When {S} and {IO} got a snack at the cafe, {S} decided to give it to"),
    ("BABA", "After {S} and {IO} went to the park, {S} gave a ball to"),
    ("BABA", "Then, {S} and {IO} had a long argument, and afterwards {S} said to"),
    ("BABA", "While {S} and {IO} were working at the office, {S} gave a book to"),
    ("BABA", "Friends {S} and {IO} found a necklace at the beach. {S} gave it to"),
)

#: relation -> (template with ``{X}``, ((subject, answer), ...)).
FACTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "capital": ("The capital of {X} is", (
        ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"),
        ("Spain", "Madrid"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"),
        ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
        ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
        ("Portugal", "Lisbon"), ("Sweden", "Stockholm"), ("Cuba", "Havana"),
        ("Thailand", "Bangkok"), ("China", "Beijing"))),
    "language": ("The official language of {X} is", (
        ("France", "French"), ("Japan", "Japanese"), ("Italy", "Italian"),
        ("Germany", "German"), ("Spain", "Spanish"), ("Russia", "Russian"),
        ("Greece", "Greek"), ("Poland", "Polish"), ("Sweden", "Swedish"),
        ("Portugal", "Portuguese"), ("China", "Chinese"), ("Turkey", "Turkish"),
        ("Finland", "Finnish"), ("Hungary", "Hungarian"), ("Korea", "Korean"))),
    "currency": ("The currency of {X} is the", (
        ("Japan", "yen"), ("India", "rupee"), ("Russia", "ruble"), ("Mexico", "peso"),
        ("Britain", "pound"), ("China", "yuan"), ("Poland", "zloty"), ("Brazil", "real"),
        ("Sweden", "krona"), ("Thailand", "baht"), ("Turkey", "lira"), ("Korea", "won"))),
}


def _rng(seed: Optional[int]) -> np.random.Generator:
    return np.random.default_rng(TASK_SEED if seed is None else seed)


def ioi_pairs(n: int = 400, seed: Optional[int] = None,
              names: Sequence[str] = IOI_NAMES,
              templates: Sequence[tuple[str, str]] = IOI_TEMPLATES) -> list[PromptPair]:
    """``n`` IOI pairs, ABBA and BABA templates alternating, names drawn without mirrors.

    The clean prompt has indirect object ``A`` and subject ``B`` (answer `` A``, foil
    `` B``); the corrupted prompt is the same template with ``A`` and ``B`` swapped, whose
    answer is `` B``, the clean foil.

    Args:
        n (int, optional): Pairs. Default: 400.
        seed (int, optional): Default: :data:`TASK_SEED` (frozen).
        names (sequence of str, optional): Default: :data:`IOI_NAMES`.
        templates (sequence, optional): ``(kind, template)``. Default: :data:`IOI_TEMPLATES`.

    Returns:
        list[PromptPair]: ids ``ioi-<k>``, category ``ioi-ABBA`` / ``ioi-BABA``.

    Raises:
        ValueError: fewer than 2 names, no template, or ``n`` more than the distinct
            (template, unordered name pair) combinations.
    """
    names = list(dict.fromkeys(names))
    if len(names) < 2 or not templates:
        raise ValueError("IOI needs at least 2 distinct names and a template.")
    combos = len(templates) * len(names) * (len(names) - 1) // 2
    if not 0 < n <= combos:
        raise ValueError(f"n must be in 1..{combos} (templates x unordered name pairs), got {n}.")
    rng = _rng(seed)
    seen: set[tuple[int, frozenset]] = set()
    pairs: list[PromptPair] = []
    while len(pairs) < n:
        t = len(pairs) % len(templates)
        kind, template = templates[t]
        a, b = (names[int(i)] for i in rng.choice(len(names), 2, replace=False))
        key = (t, frozenset((a, b)))
        if key in seen:
            continue
        seen.add(key)
        pairs.append(PromptPair(
            id=f"ioi-{len(pairs)}", category=f"ioi-{kind}",
            clean=template.format(IO=a, S=b), corrupted=template.format(IO=b, S=a),
            answer=f" {a}", foil=f" {b}"))
    return pairs


def factual_pairs(n: int = 200, seed: Optional[int] = None,
                  facts: Optional[dict[str, tuple[str, tuple[tuple[str, str], ...]]]] = None
                  ) -> list[PromptPair]:
    """``n`` factual-recall pairs: a subject and another of the same relation as corruption.

    Args:
        n (int, optional): Pairs (at most the distinct unordered subject pairs with
            different answers). Default: 200.
        seed (int, optional): Default: :data:`TASK_SEED` (frozen).
        facts (dict, optional): relation -> (template with ``{X}``, (subject, answer)
            pairs). Default: :data:`FACTS`.

    Returns:
        list[PromptPair]: ids ``fact-<k>``, category the relation; the relations take turns.

    Raises:
        ValueError: ``n`` out of range.
    """
    facts = FACTS if facts is None else facts
    pools = {}
    for relation, (template, rows) in facts.items():
        pools[relation] = [(template, rows[i], rows[j]) for i in range(len(rows))
                           for j in range(i + 1, len(rows)) if rows[i][1] != rows[j][1]]
    total = sum(len(p) for p in pools.values())
    if not 0 < n <= total:
        raise ValueError(f"n must be in 1..{total} (unordered subject pairs), got {n}.")
    rng = _rng(seed)
    order = {r: [pool[int(k)] for k in rng.permutation(len(pool))] for r, pool in pools.items()}
    pairs: list[PromptPair] = []
    while len(pairs) < n:
        for relation, pool in order.items():
            if pool and len(pairs) < n:
                template, (x, ans), (z, foil) = pool.pop()
                if rng.random() < 0.5:  # either subject is the clean one
                    (x, ans), (z, foil) = (z, foil), (x, ans)
                pairs.append(PromptPair(
                    id=f"fact-{len(pairs)}", category=relation,
                    clean=template.format(X=x), corrupted=template.format(X=z),
                    answer=f" {ans}", foil=f" {foil}"))
    return pairs


def packaged_pairs() -> list[PromptPair]:
    """The patching pairs shipped with the package (the packaged task)."""
    return load_pairs()


#: task name -> generator with the pre-registered sizes.
TASKS: dict[str, Callable[[], list[PromptPair]]] = {
    "ioi": ioi_pairs, "factual": factual_pairs, "packaged": packaged_pairs}


def task_pairs(task: str) -> list[PromptPair]:
    """The pairs of a pre-registered task (:data:`TASKS`), frozen seed.

    Raises:
        ValueError: an unknown task.
    """
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}: use one of {', '.join(TASKS)}.")
    return TASKS[task]()


def aligned(tokenizer: Any, pairs: Sequence[PromptPair]) -> tuple[list[PromptPair], list[str]]:
    """The pairs whose prompts have equal token counts for ``tokenizer``, and why others not.

    A pair is kept when :func:`~captum_iglens.validate.patching.pair_ids` accepts it (equal
    counts, continuations that do not merge, distinct answer and foil tokens).
    """
    from captum_iglens.validate.patching import pair_ids

    kept, dropped = [], []
    for pair in pairs:
        try:
            pair_ids(tokenizer, pair)
        except ValueError as err:
            dropped.append(str(err))
            continue
        kept.append(pair)
    return kept, dropped


def answered(tokenizer: Any, pairs: Sequence[PromptPair],
             next_token: Callable[[list[int]], int]) -> list[PromptPair]:
    """The aligned pairs where the model's greedy next token after the clean prompt is the answer.

    Args:
        tokenizer: The model's tokenizer.
        pairs (sequence of PromptPair): Aligned pairs (:func:`aligned`).
        next_token (callable): token ids -> the model's argmax next token id (e.g. a
            closure over ``model(ids).logits[0, -1].argmax()``).
    """
    from captum_iglens.validate.patching import pair_ids

    kept = []
    for pair in pairs:
        clean, _, y, _ = pair_ids(tokenizer, pair)
        if int(next_token(clean)) == y:
            kept.append(pair)
    return kept
