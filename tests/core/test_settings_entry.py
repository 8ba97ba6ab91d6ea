"""Settings objects travel whole: the keyword form and the settings form agree, the output
records its estimator, and the pipeline leaves the capture it is given as it was."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, explain_ids
from captum_iglens._core.pipeline import capture_lens_path, output_from_path
from captum_iglens.settings import AttributionSettings, ReportSettings
from captum_iglens.text.explain_prompt import annotate_answer
from captum_iglens.text.prompts import RenderedPrompt

GRADIENT = dict(method="riemann_middle", n_steps=8, baselines="zero")


@pytest.fixture(scope="module")
def lens_and_ids() -> tuple[IGLens, torch.Tensor]:
    torch.manual_seed(0)
    model = make_tiny("llama", n_layers=3).eval()
    ids = torch.randint(4, 100, (2, 7))
    return IGLens(model), ids


def test_settings_object_gives_the_keyword_credits(lens_and_ids) -> None:
    lens, ids = lens_and_ids
    keywords = lens.attribute(ids, positions=[-2, -1], **GRADIENT)
    settings = lens.attribute(ids, positions=[-2, -1],
                              settings=AttributionSettings(**GRADIENT))
    default = lens.attribute(ids, positions=[-2, -1])
    # one code path, same inputs: identical tensors (not a tolerance between two computations)
    assert torch.equal(keywords, settings)
    # and the settings took effect: a zero baseline and a gradient rule give other credits
    assert (keywords - default).abs().max() > 1e-3


def test_settings_and_a_keyword_at_once_are_refused(lens_and_ids) -> None:
    lens, ids = lens_and_ids
    with pytest.raises(ValueError, match="settings= was given together with.*n_steps"):
        lens.attribute(ids, n_steps=8, settings=AttributionSettings())


def test_method_and_n_steps_are_recorded_on_the_output(lens_and_ids) -> None:
    lens, ids = lens_and_ids
    out = lens.attribute_details(ids, method="gausslegendre", n_steps=6)
    assert (out.method, out.n_steps) == ("gausslegendre", 6)
    exact = lens.attribute_details(ids, settings=AttributionSettings(n_steps=3))
    assert (exact.method, exact.n_steps) == ("prediction_aware", 3)


def test_explain_ids_settings_equal_keywords_and_are_recorded(lens_and_ids) -> None:
    lens, _ = lens_and_ids
    prompt, answer = [5, 9, 14, 20], [30, 31, 32]
    by_keyword = explain_ids(lens.model, prompt, answer, lens=lens, **GRADIENT)
    by_object = explain_ids(lens.model, prompt, answer, lens=lens,
                            settings=AttributionSettings(**GRADIENT))
    assert torch.equal(by_keyword.attributions, by_object.attributions)
    assert (by_object.method, by_object.n_steps, by_object.baseline) == (
        "riemann_middle", 8, "zero")
    # a keyword given wins over the settings' field
    mixed = explain_ids(lens.model, prompt, answer, lens=lens, n_steps=4,
                        settings=AttributionSettings(**GRADIENT))
    assert mixed.n_steps == 4


def test_output_from_path_leaves_the_capture_unchanged(lens_and_ids) -> None:
    lens, ids = lens_and_ids
    cap = capture_lens_path(lens.spec, ids, None, [-3, -1], "mean", None)
    assert cap.reference is not None
    before = {
        "nodes": cap.path.nodes.clone(), "target": cap.path.target.clone(),
        "model_probs": cap.model_probs.clone(), "argmax": cap.model_argmax.clone(),
        "log_probs": cap.reference.log_probs.clone(),
    }
    out = output_from_path(lens.spec, cap, settings=AttributionSettings(), top_k=2)
    assert cap.reference is not None  # the distribution is still the capture's
    after = {
        "nodes": cap.path.nodes, "target": cap.path.target, "model_probs": cap.model_probs,
        "argmax": cap.model_argmax, "log_probs": cap.reference.log_probs,
    }
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
    assert cap.path.log is False  # the log-units flag is set on a copy of the path
    assert out.top_k_ids is not None and out.top_k_ids.shape[-1] == 2  # built complete
    with pytest.raises(dataclasses.FrozenInstanceError):
        cap.reference = None  # type: ignore[misc]


def test_annotate_answer_returns_a_new_result(lens_and_ids) -> None:
    lens, _ = lens_and_ids
    result = explain_ids(lens.model, [5, 9, 14], [30, 31], lens=lens)
    rendered = RenderedPrompt(text="w5 w9 w14", ids=[5, 9, 14], chat_template_used=True,
                              uses_clock=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tokens that are not the argmax: not the point here
        done = annotate_answer(result, lens.model, word_tokenizer(), rendered, True,
                               max_new_tokens=2)
    assert (done.generated, done.max_new_tokens, done.chat_template_used) == (True, 2, True)
    assert done.rendered_prompt == "w5 w9 w14"
    assert done.truncated is True  # two tokens at max_new_tokens=2, no end token among them
    # the result given is not changed
    assert (result.generated, result.max_new_tokens, result.chat_template_used) == (
        False, None, False)
    with pytest.raises(dataclasses.FrozenInstanceError):  # results are built complete
        result.generated = True  # type: ignore[misc]



def test_report_settings_object_equals_the_keywords(lens_and_ids) -> None:
    lens, _ = lens_and_ids
    prompt, answer = [5, 9, 14, 20], [30, 31, 32]
    by_keyword = explain_ids(lens.model, prompt, answer, lens=lens, onset_frac=0.8,
                             onset_rule="mass", top_k=2)
    by_object = explain_ids(lens.model, prompt, answer, lens=lens,
                            report=ReportSettings(onset_frac=0.8, onset_rule="mass", top_k=2))
    assert (by_object.onset_rule, by_object.onset_layers) == ("mass", by_keyword.onset_layers)
    assert by_object.top_k_ids is not None and by_object.top_k_ids.shape[-1] == 2
    assert torch.equal(by_keyword.top_k_ids, by_object.top_k_ids)
    with pytest.raises(ValueError, match="report= was given together with.*top_k"):
        explain_ids(lens.model, prompt, answer, lens=lens, top_k=3, report=ReportSettings())
