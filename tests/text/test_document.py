"""Document mode in one cached pass, and each node read out once (issue 23).

The text runs once, in chunks fed with the KV cache of the earlier ones; the old path re-ran
the whole text for every chunk of positions (``one_pass=False`` keeps it, and families whose
cache cannot serve still take it). The two are different forward passes (attention over a
cache instead of the whole sequence), so their numbers are compared within the whole-model
node sensitivity of the text (tests/_tolerance.py), as tests/test_run.py compares a batch row
with its prompt alone; the model's own probabilities come from a plain forward over the text.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch
from _tolerance import (
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    head_gradient_magnitude,
    lens_nodes,
    node_sensitivity,
    readout_sensitivity,
    reduction_length,
)
from conftest import make_tiny
from tiny_families import FAMILY_NAMES, make_family
from tiny_tokenizer import word_tokenizer
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from captum_iglens import IGLens
from captum_iglens._core.estimators import PathNodes, read_nodes
from captum_iglens.lens.readout import readout_probs
from captum_iglens.text.document import explain_document
from captum_iglens.text.document_pass import UNCACHED_DOCUMENTS, cache_refusal
from captum_iglens.text.prompts import render_prompt

CHUNK = 8
N_WORDS = 27  # 26 explained positions: passes of 8, 8, 8 and 2 columns
CACHED = [f for f in FAMILY_NAMES if f not in UNCACHED_DOCUMENTS]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the launched processes of the suite (OMP_NUM_THREADS=1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def words(seed: int, n: int = N_WORDS) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(124)}" for _ in range(n))


@contextmanager
def block_rows(lens: IGLens) -> Iterator[list[int]]:
    """The text columns each forward feeds through the first decoder block."""
    seen: list[int] = []

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).shape[1])

    handle = lens.decoder_blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def bounds(lens: IGLens, ids: list[int], positions: list[int], targets: list[int],
           baselines="mean", foils: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Per position: node and credit bounds of two float32 forward passes of the text in
    other orders (eps sqrt(n) times the whole-model node sensitivity, once per side);
    contrastive: the target's plus the foil's."""
    inputs = torch.tensor([ids])
    sens = node_sensitivity(lens, inputs, positions, torch.tensor([targets]), baselines)[0]
    if foils is not None:
        sens = sens + node_sensitivity(lens, inputs, positions, torch.tensor([foils]),
                                       baselines)[0]
    n = reduction_length(lens.model)
    return {"node": f32_tol(sens, sens, n_terms=n),
            "credit": f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n),
            "sens": sens}


def assert_close(got, want, bound: dict[str, torch.Tensor]) -> None:
    """Same positions and targets; credits, levels and path ends within the bounds; each
    result adds up to its own Δp."""
    assert got.positions == want.positions and got.token_ids == want.token_ids
    node = bound["node"]
    assert ((got.attributions - want.attributions).abs() <= bound["credit"]).all()
    assert ((got.lens_probs - want.lens_probs).abs() <= node[:, 1:]).all()
    assert ((got.p_final - want.p_final).abs() <= node[:, -1]).all()
    assert ((got.p_baseline - want.p_baseline).abs() <= node[:, 0]).all()
    for result in (got, want):
        gap = (result.attributions.double().sum(-1) - result.delta_p.double()).abs()
        assert (gap <= completeness_tol(result.attributions, result.delta_p)).all()


def model_probs(model: nn.Module, ids: list[int], positions: list[int]) -> torch.Tensor:
    """The model's own probability of each next token of the text: one plain forward."""
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids]), use_cache=False).logits[0, positions]
    targets = torch.tensor([ids[p + 1] for p in positions])
    return torch.softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]


# ---------------------------------------------------------------------------- families
@pytest.mark.numerics
@pytest.mark.parametrize("family", CACHED)
def test_one_pass_equals_rerun_for_every_cached_family(family):
    """Every family whose cache serves: a 27-token text in passes of 8 columns (its cache
    carried from pass to pass) gives the old re-run path's numbers and the model's own
    probabilities, within the whole-model bound. The work is linear: the passes feed each
    column once, at most 8 at a time; the re-run fed the whole text once per chunk."""
    try:
        model = make_family(family).eval()
    except (ImportError, AttributeError) as err:  # pragma: no cover - depends on install
        pytest.skip(f"transformers cannot build {family!r} offline here: {err}")
    tok = word_tokenizer()
    lens = IGLens(model)
    text = words(3)
    ids = render_prompt(tok, text, chat_template=False).ids
    assert cache_refusal(model, len(ids)) is None
    with block_rows(lens) as passes:
        got = explain_document(lens, tok, text, chunk=CHUNK)
    assert passes == [8, 8, 8, 2]  # columns 0..25: the last token predicts nothing
    with block_rows(lens) as reruns:
        want = explain_document(lens, tok, text, chunk=CHUNK, one_pass=False)
    assert reruns == [len(ids)] * 4
    bound = bounds(lens, ids, got.positions, got.token_ids)
    assert_close(got, want, bound)
    own = model_probs(model, ids, got.positions)
    assert ((got.p_final - own).abs() <= bound["node"][:, -1]).all()
    # meaningful: a position read from the wrong pass or a mean baseline that misses a
    # chunk moves the credits by their own size
    assert got.attributions.abs().max() > 20 * bound["credit"].max()


def test_refused_caches_fall_back_to_rerunning_the_text():
    """RecurrentGemma (its forward hands back no cache, its state restarts every pass),
    reference-id baselines and a dynamic RoPE past its trained length re-run the whole text
    per chunk, by name; the re-run is the very same computation as one_pass=False."""
    tok = word_tokenizer()
    text = words(4, 12)
    recurrent = IGLens(make_family("recurrent_gemma").eval())
    n_tokens = len(render_prompt(tok, text, chat_template=False).ids)
    assert "recurrent_gemma" in cache_refusal(recurrent.model, n_tokens)
    with block_rows(recurrent) as rows:
        got = explain_document(recurrent, tok, text, chunk=CHUNK)
    assert rows == [n_tokens, n_tokens]
    want = explain_document(recurrent, tok, text, chunk=CHUNK, one_pass=False)
    # exact: both run the re-run path, the same operations on the same values
    assert torch.equal(got.attributions, want.attributions)

    llama = IGLens(make_tiny("llama", n_layers=2).eval())
    reference = torch.full((1, n_tokens), 7)
    assert "reference-id" in cache_refusal(llama.model, n_tokens, reference)
    with block_rows(llama) as rows:
        explain_document(llama, tok, text, chunk=CHUNK, baselines=reference)
    assert rows == [n_tokens] * 4  # the text, then the reference, per chunk

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=16,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                          "rope_theta": 10000.0})
    torch.manual_seed(0)
    dynamic = IGLens(LlamaForCausalLM(config).eval())
    long_text = words(5, 24)
    assert "dynamic RoPE" in cache_refusal(dynamic.model, 24)
    assert cache_refusal(dynamic.model, 16) is None  # within its trained length: one pass
    with block_rows(dynamic) as rows:
        explain_document(dynamic, tok, long_text, chunk=CHUNK)
    assert rows == [24] * 3


# ---------------------------------------------------------------------------- options
@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama", n_layers=3).eval(), word_tokenizer()


@pytest.mark.numerics
@pytest.mark.parametrize("option", ["zero", "embedding", "vector", "row", "per_position",
                                    "per_token", "stride", "positions", "contrast"])
def test_options_in_one_pass_equal_the_rerun(tiny, option):
    """Baselines (named, [d], [1, d], [1, T, d], [1, S, d]), stride, chosen positions and
    foils give the re-run path's numbers within the whole-model bound."""
    model, tok = tiny
    lens = IGLens(model)
    text = words(6)
    ids = render_prompt(tok, text, chat_template=False).ids
    n_pos = len(ids) - 1
    gen = torch.Generator().manual_seed(2)
    kwargs: dict = {}
    baselines = {"zero": "zero", "embedding": "embedding",
                 "vector": torch.randn(64, generator=gen),
                 "row": torch.randn(1, 64, generator=gen),
                 "per_position": torch.randn(1, n_pos, 64, generator=gen),
                 "per_token": torch.randn(1, len(ids), 64, generator=gen)}.get(option)
    if baselines is not None:
        kwargs["baselines"] = baselines
    if option == "stride":
        kwargs["stride"] = 3
    if option == "positions":
        kwargs["positions"] = [-1, 0, 9, 17]
    if option == "contrast":
        kwargs["contrast"] = [(ids[p + 1] + 5) % 128 for p in range(n_pos)]
    got = explain_document(lens, tok, text, chunk=CHUNK, **kwargs)
    want = explain_document(lens, tok, text, chunk=CHUNK, one_pass=False, **kwargs)
    foils = kwargs["contrast"] if option == "contrast" else None
    bound = bounds(lens, ids, got.positions, got.token_ids,
                   "mean" if baselines is None else baselines, foils)
    assert_close(got, want, bound)
    assert got.baseline == want.baseline
    assert got.contrast_ids == want.contrast_ids == foils
    if option == "stride":
        assert got.positions == list(range(0, n_pos, 3))
    if option == "positions":
        assert got.positions == [0, 9, 17, n_pos - 1]
    assert got.attributions.abs().max() > 20 * bound["credit"].max()


@pytest.mark.numerics
def test_units_and_top_k_in_one_pass(tiny):
    """Log-probability credits (a credit's sensitivity divided by the probabilities it is
    the log of) and the logit lens's top tokens, as in the re-run."""
    model, tok = tiny
    lens = IGLens(model, units="log-probability")
    text = words(7)
    ids = render_prompt(tok, text, chat_template=False).ids
    got = explain_document(lens, tok, text, chunk=CHUNK, top_k=3)
    want = explain_document(lens, tok, text, chunk=CHUNK, top_k=3, one_pass=False)
    assert got.units == want.units == "log-probability"
    bound = bounds(IGLens(model), ids, got.positions, got.token_ids)
    probs = torch.cat([want.p_baseline[:, None], want.lens_probs], -1)  # [T, k + 1] levels
    node = bound["node"] / probs.exp().double()  # d log p = dp / p
    credit = node[:, 1:] + node[:, :-1]
    assert ((got.attributions - want.attributions).abs() <= credit).all()
    assert got.top_k_ids.shape == (len(got.positions), 3, 3)
    assert torch.equal(got.top_k_ids, want.top_k_ids)
    assert got.attributions.abs().max() > 20 * credit.max()


@pytest.mark.numerics
@pytest.mark.filterwarnings("ignore:IG-Lens's gausslegendre estimate")
def test_gradient_method_in_one_pass(tiny):
    """Gauss-Legendre at 64 steps on the one-pass paths equals their prediction-aware
    credits within the rounding of each (as tests/test_core.py, on the same nodes)."""
    model, tok = tiny
    lens = IGLens(model)
    text = words(9, 12)
    ids = render_prompt(tok, text, chat_template=False).ids
    exact = explain_document(lens, tok, text, chunk=4)
    gl = explain_document(lens, tok, text, chunk=4, method="gausslegendre", n_steps=64)
    assert gl.method == "gausslegendre"
    nodes = lens_nodes(lens, torch.tensor([ids]), exact.positions)
    target = torch.tensor([exact.token_ids])
    mag = head_gradient_magnitude(lens.readout, nodes, target, "gausslegendre", 64)[0]
    sens = readout_sensitivity(lens.readout, nodes, target)[0]
    # both on the very same one-pass nodes: the rounding of each estimator is what is left
    tol = f32_tol(mag, credit_sensitivity(sens), n_terms=reduction_length(lens.readout))
    assert ((gl.attributions - exact.attributions).abs() <= tol).all()
    assert exact.attributions.abs().max() > 1e2 * tol.max()


def test_document_arguments_are_checked(tiny):
    model, tok = tiny
    lens = IGLens(model)
    with pytest.raises(TypeError, match="unexpected keyword argument 'target'"):
        explain_document(lens, tok, words(1, 6), target=5)
    with pytest.raises(ValueError, match=r"neither one row per explained position \(5\)"):
        explain_document(lens, tok, words(1, 6), baselines=torch.zeros(1, 3, 64))


# ------------------------------------------------------------------- readouts once
class CountingReadout(nn.Module):
    """The lens readout, counting the residual rows it reads out (padding included)."""

    def __init__(self, readout: nn.Module) -> None:
        super().__init__()
        self.inner, self.rows, self.name = readout, 0, "counting"

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.rows += hidden.reshape(-1, hidden.shape[-1]).shape[0]
        return self.inner(hidden)


@pytest.mark.numerics
@pytest.mark.parametrize("baselines", ["zero", "mean", "vector"])
def test_each_node_is_read_out_once(tiny, baselines):
    """A baseline shared by a row's positions ("zero", a [d] tensor) is read out once per
    row (8 rows: chunks are padded to 8), h_n once for its value and the readout check;
    the per-position causal mean at every position. Checked against the model (Invariant R
    passes) and within the readout's bound of reading every node on its own."""
    model, _ = tiny
    counting = CountingReadout(IGLens(model).readout)
    lens = IGLens(model, readout=counting)
    ids = torch.randint(4, 128, (1, 20), generator=torch.Generator().manual_seed(5))
    positions = list(range(3, 20))
    base = torch.randn(64, generator=torch.Generator().manual_seed(1)) \
        if baselines == "vector" else baselines
    out = lens.attribute_details(ids, base, positions=positions)
    n_pos, k = len(positions), len(lens.layer_indices)
    shared = baselines != "mean"
    assert counting.rows == n_pos * k + (8 if shared else n_pos)  # was n_pos * (k + 2)

    nodes = lens_nodes(lens, ids, positions, base)  # [1, P, k + 1, d]
    target = out.target
    path = PathNodes(nodes, target)
    values = read_nodes(counting.inner, path, 1 << 14).values
    flat = readout_probs(counting.inner, nodes.reshape(-1, 64),
                         target[..., None].expand(nodes.shape[:3]).reshape(-1), 1 << 14)
    sens = readout_sensitivity(counting.inner, nodes, target)
    tol = f32_tol(sens, sens, n_terms=reduction_length(counting.inner))
    assert ((values - flat.view(values.shape)).abs() <= tol).all()
