"""Generate the tutorial notebooks (no outputs are committed).

    python tutorials/make_notebooks.py

Edit the cells here and re-run; tests/test_tutorials.py executes the notebooks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from _baseline_comparison_notebook import baseline_comparison
from _real_model_notebook import real_model
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
%matplotlib inline
import os

from transformers.utils import logging as hf_logging

from captum_iglens.models import load_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()
model, tokenizer = load_model()  # the embedded SmolLM2-135M-Instruct, offline
print(type(model).__name__, "with", model.config.num_hidden_layers, "decoder blocks")"""


def getting_started() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# Getting started with IG-Lens\n\n"
            "IG-Lens (D. A. Nguyen, arXiv:2606.29693) answers: *between which layers of a "
            "decoder-only transformer is the probability of a predicted token produced?* It "
            "integrates the gradient of the logit-lens readout "
            "`f(h) = softmax(unembed(final_norm(h)))[y]` along one path through the residual "
            "stream, `baseline -> h_L1 -> ... -> h_n`, and credits each chosen layer with its "
            "segment. The credits add up exactly to the change of the token's probability, "
            "`Δp = f(h_n) - f(baseline)`.\n\n"
            "This notebook runs offline on the embedded SmolLM2-135M-Instruct (30 blocks)."
        ),
        new_code_cell(SETUP),
        new_markdown_cell(
            "## Explain a prompt\n\n"
            "`explain` applies the chat template, generates the answer greedily and attributes "
            "every answer token with one teacher-forced forward. We keep 7 evenly spaced "
            "layers so the table fits on screen (`layers=None` takes all 30 blocks; index 0 is "
            "the embedding output, `l` the output of block `l`)."
        ),
        new_code_cell(
            "from captum_iglens import explain\n\n"
            "result = explain(model, tokenizer, \"What is the capital of Vietnam?\",\n"
            "                 layers=[0, 5, 10, 15, 20, 25, 30], max_new_tokens=12)\n"
            "print(\"answer:\", result.answer)\n"
            "print(result.format_table())"
        ),
        new_markdown_cell(
            "## Reading the table\n\n"
            "For every answer token there are two columns: **IG**, the IG-Lens credit of each "
            "layer (probability units, signed), and **lens p**, the logit-lens probability "
            "`f(h_L)` of the token read out at that layer (a *level*, not a credit). The footer "
            "gives per token the sum of the credits, `Δp`, the model's probability `p` and the "
            "**onset** layer: the earliest layer at which the cumulative `|credit|` reaches half "
            "of the token's total `|credit|`."
        ),
        new_code_cell(
            "for token, onset, p in zip(result.tokens, result.onset_layers, result.p_final,\n"
            "                           strict=True):\n"
            "    print(f\"{token!r:>14}  onset layer {onset:>2}   p = {float(p):.3f}\")"
        ),
        new_markdown_cell(
            "## Completeness\n\n"
            "The credits of each token add up to its `Δp` to float precision (Proposition 1 of "
            "the paper). `completeness_error` is `max_t |sum_j IGL_tj - Δp_t|`."
        ),
        new_code_cell(
            "sums = result.attributions.sum(-1)\n"
            "print(\"sum of credits:\", sums)\n"
            "print(\"Δp            :\", result.delta_p)\n"
            "print(\"completeness error:\", result.completeness_error)\n"
            "assert result.completeness_error <= 1e-6"
        ),
        new_markdown_cell(
            "## Heatmap and logit-lens trajectory\n\n"
            "`result.plot()` returns a matplotlib figure: left the token x layer credits "
            "(diverging colours centred at 0, the onset layer of each token boxed), right the "
            "logit-lens probability of each token across the layers. From the command line: "
            "`iglens --plot heat.png \"...\"`."
        ),
        new_code_cell("fig = result.plot()\nfig"),
        new_markdown_cell(
            "## Captum's plots\n\n"
            "`result.to_captum()` is a `captum.attr.LLMAttributionResult` whose *input tokens* "
            "are the layer names and whose output tokens are the answer tokens, so Captum's own "
            "`plot_token_attr()` and `plot_seq_attr()` work unchanged."
        ),
        new_code_cell(
            "captum_result = result.to_captum()\n"
            "print(captum_result.input_tokens)\n"
            "print(captum_result.output_tokens)\n"
            "fig, ax = captum_result.plot_token_attr()  # Captum draws with pyplot: shown inline"
        ),
        new_code_cell("fig, ax = captum_result.plot_seq_attr()"),
        new_markdown_cell(
            "## The `LLMGradientAttribution` way\n\n"
            "`LLMIGLensAttribution` is Captum's `LLMGradientAttribution` with `IGLens` added to "
            "its supported methods: the same call shape as with `LayerIntegratedGradients`, but "
            "the features are layers. Mind the leading space of the target: `\" Paris\"` and "
            "`\"Paris\"` are different tokens."
        ),
        new_code_cell(
            "from captum.attr import TextTokenInput\n\n"
            "from captum_iglens import IGLens\n"
            "from captum_iglens.llm_attr import LLMIGLensAttribution\n\n"
            "llm_attr = LLMIGLensAttribution(IGLens(model, layers=[0, 10, 20, 30]), tokenizer)\n"
            "res = llm_attr.attribute(TextTokenInput(\"The capital of France is\", tokenizer),\n"
            "                         target=\" Paris\")\n"
            "print(res.input_tokens, res.output_tokens, res.token_attr, res.output_probs)\n"
            "fig, ax = res.plot_token_attr()"
        ),
        new_markdown_cell(
            "## The Captum `Attribution` API\n\n"
            "`IGLens` is a Captum `Attribution`: `attribute(inputs, target=..., positions=..., "
            "baselines=..., return_convergence_delta=True)`; the delta is `sum - Δp`."
        ),
        new_code_cell(
            "lens = IGLens(model, layers=[model.model.layers[i] for i in (9, 19, 29)])\n"
            "ids = tokenizer(\"The capital of France is\", return_tensors=\"pt\").input_ids\n"
            "attributions, delta = lens.attribute(ids, positions=-1,\n"
            "                                     return_convergence_delta=True)\n"
            "print(lens.layer_indices, attributions, delta)\n"
            "assert float(delta.abs().max()) <= 1e-6"
        ),
        new_markdown_cell(
            "## What IG-Lens measures\n\n"
            "A conditional marginal: the extra probability that the final norm and unembedding "
            "can read out of `h_L` beyond the previous chosen layer. It is **not** the total "
            "causal effect of block `L` through the blocks above it; to measure that, ablate the "
            "block. The tutorial *Completeness_IG_Lens_vs_Captum* compares IG-Lens with Captum's "
            "layer methods."
        ),
    ]
    return new_notebook(cells=cells, metadata=_metadata())


def completeness() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# Completeness: IG-Lens vs Captum's layer methods\n\n"
            "We explain one prediction of the embedded SmolLM2-135M-Instruct with IG-Lens "
            "(arXiv:2606.29693), Captum's `LayerIntegratedGradients` and `LayerConductance` "
            "(one decoder layer at a time) and the logit lens, on the same token ids, the same "
            "position, the same target token and the same layers, and check which per-layer "
            "credits add up to the change they explain. Runs offline in about a minute."
        ),
        new_code_cell(SETUP),
        new_markdown_cell(
            "## The prediction\n\n"
            "`\"The capital of France is\"` → the model's next token. Four layers: the "
            "embedding output (0) and the outputs of blocks 10, 20 and 30; 16 integration steps "
            "per Captum run."
        ),
        new_code_cell(
            "from captum_iglens.compare import compare_completeness\n\n"
            "ids = tokenizer(\"The capital of France is\", return_tensors=\"pt\").input_ids\n"
            "report = compare_completeness(model, ids, layers=[0, 10, 20, 30], n_steps=16,\n"
            "                              tokenizer=tokenizer)\n"
            "print(report)"
        ),
        new_code_cell("fig = report.plot()\nfig"),
        new_markdown_cell(
            "## Why the Captum layer methods do not add up\n\n"
            "Captum's `LayerIntegratedGradients(layer)` replaces that layer's output by a "
            "straight line from its value on the baseline input to its value on the real input, "
            "and integrates the gradient of `F` along that line. In a residual transformer the "
            "output of *any* decoder block carries everything the rest of the network sees: it "
            "is a complete cut. So each single-layer run is an ordinary Integrated Gradients "
            "run through the whole upper network, and by IG's own completeness its total is the "
            "**whole** change `F(x) - F(x')`, for every layer. Each layer gets its own baseline "
            "(the layer's activation on the baseline input), and nothing ties the layers "
            "together. Summing `k` layers therefore gives about `k` times the change, as the "
            "`sum` row shows. `LayerConductance` has the same structure (its per-layer totals "
            "are each about the whole change, plus a larger discretisation error). Asking "
            "Captum for a list of layers does not help either: the hooks cut the earlier layers "
            "out of the graph, so the comparison runs one layer at a time.\n\n"
            "IG-Lens takes **one** path through the layers, `b → h_L1 → h_L2 → ... → h_n`, and "
            "credits each layer with its own segment. The segments are consecutive, so by the "
            "gradient theorem the credits telescope: they add up to `f(h_n) - f(b) = Δp`, to "
            "float precision, whatever the number of layers."
        ),
        new_code_cell(
            "ig = report[\"ig_lens\"]\n"
            "lig = report[\"layer_integrated_gradients\"]\n"
            "lc = report[\"layer_conductance\"]\n"
            "change = report.f_input - report.f_baseline\n"
            "print(f\"IG-Lens : sum {ig.layer_sum:+.6f}  Δp {ig.total:+.6f}\"\n"
            "      f\"  gap {ig.completeness_gap:.1e}\")\n"
            "print(f\"LayerIG : per layer {[round(float(v), 4) for v in lig.per_layer]}\")\n"
            "k = len(report.layer_indices)\n"
            "print(f\"          sum / (F(x) - F(x')) = {lig.layer_sum / change:.2f}  (k = {k})\")\n"
            "print(f\"LayerCond: sum / (F(x) - F(x')) = {lc.layer_sum / change:.2f}\")\n"
            "assert ig.completeness_gap <= 1e-6\n"
            "assert lig.completeness_gap > 0.5 * abs(change)"
        ),
        new_markdown_cell(
            "## What IG-Lens does not measure\n\n"
            "IG-Lens's credit for layer `L` is a **conditional marginal**: how much more "
            "probability the final norm and unembedding can read out of the residual stream at "
            "`L` than at the previous chosen layer. It is measured *through the readout*, not "
            "through the blocks above `L`. A block whose write is only used later (for example "
            "an attention head that moves information that a later MLP turns into the answer) "
            "can get little IG-Lens credit while ablating it would destroy the prediction. "
            "IG-Lens tells you *where along the depth the answer becomes readable*; for the "
            "total causal effect of a block, ablate it. Also note that the totals differ: "
            "IG-Lens's baseline lives in residual space (`\"mean\"`), Captum's is an input "
            "sequence (the prompt's special tokens kept, other tokens replaced by a space), so "
            "each method is compared with its *own* total."
        ),
        new_markdown_cell(
            "## From the command line\n\n"
            "```\n"
            "iglens compare --k 4 \"What is the capital of Vietnam?\"\n"
            "iglens compare --token-index 6 --json cmp.json --plot cmp.png \"...\"\n"
            "```"
        ),
    ]
    return new_notebook(cells=cells, metadata=_metadata())


def causal_validation() -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell(
            "# Causal validation of IG-Lens\n\n"
            "IG-Lens (arXiv:2606.29693) credits each decoder block with a **conditional "
            "marginal**: how much more probability of the token the final norm and unembedding "
            "can read out of the residual stream after the block than before it. That is a "
            "statement about the readout, not about causation. The paper leaves open whether "
            "the credit tracks the causal importance of blocks, and expects it to, especially "
            "for tokens whose logit-lens trajectory is non-monotonic. Here we ask it with a "
            "test fixed in the package before its numbers were computed, and two kinds of "
            "intervention: **ablation** (a block's update at the explained position removed or "
            "replaced) and **counterfactual patching** (a block's update carried from a clean "
            "prompt into a corrupted one). A weak or negative answer is a legitimate result; an "
            "untested claim is not. Runs offline in a few minutes on a CPU."
        ),
        new_code_cell(SETUP),
        new_markdown_cell(
            "## One token, by hand\n\n"
            "`BlockAblation.trace` runs one clean forward and keeps the residual stream and the "
            "KV cache. `ablate` then runs, for each explained position, one single-token "
            "forward over the cached prefix with a clean row and, for each block `L`, a row "
            "with block `L`'s update removed (`zero`: `h_L := h_(L-1)` at that position). A "
            "row that changes block `L` computes only the blocks above it: it joins the batch "
            "after block `L - 1`, from the clean row's residual there. Every call checks "
            "itself: the clean row must reproduce the model's probability, one cached ablation "
            "must equal a full-sequence hooked forward, and the last block's drop must equal "
            "its IG-Lens credit (both are `f(h_30) - f(h_29)`: an identity, which is why the "
            "test below is decided without that block under zero ablation)."
        ),
        new_code_cell(
            "import torch\n\n"
            "from captum_iglens import explain\n"
            "from captum_iglens.validate.ablation import BlockAblation\n\n"
            "question = \"What is the capital of France? Answer in one word.\"\n"
            "answer = explain(model, tokenizer, question, max_new_tokens=8)  # greedy, from "
            "generation\n"
            "# the same answer explained with one teacher-forced forward, the computation the "
            "ablation's\n"
            "# checks repeat (generation's incremental KV cache rounds differently)\n"
            "res = explain(model, tokenizer, question, target=answer.token_ids)\n"
            "t = next((i for i, tok in enumerate(res.tokens) if tok.strip() == \"Paris\"), 0)\n"
            "print(\"answer:\", res.answer, \"| token explained:\", repr(res.tokens[t]))\n"
            "ablation = BlockAblation(model)\n"
            "trace = ablation.trace(torch.tensor(res.input_ids))\n"
            "out = ablation.ablate(trace, [res.positions[t]], torch.tensor([res.token_ids[t]]),\n"
            "                      kinds=(\"zero\",), p_final=res.p_final[[t]],\n"
            "                      last_credit=res.attributions[[t], -1])\n"
            "print(\"checks, largest |error|:\", out.check_errors)\n"
            "drop, credit = out.drops[\"zero\"][0], res.attributions[t]\n"
            "print(f\"{'block':>5} {'IG-Lens credit':>15} {'lens p':>8} {'zero drop':>10}\")\n"
            "for layer in range(1, 31):\n"
            "    print(f\"{layer:>5} {float(credit[layer - 1]):>+15.4f} \"\n"
            "          f\"{float(res.lens_probs[t, layer - 1]):>8.4f} \"\n"
            "          f\"{float(drop[layer - 1]):>+10.4f}\")\n"
            "assert abs(float(drop[-1] - credit[-1])) <= ablation.tolerance"
        ),
        new_code_cell(
            "from matplotlib.figure import Figure\n\n"
            "fig = Figure(figsize=(8, 3.5), layout=\"constrained\")\n"
            "ax = fig.subplots()\n"
            "ax.plot(range(1, 31), credit, \"k-o\", ms=3, label=\"IG-Lens credit\")\n"
            "ax.plot(range(1, 31), drop, \"C0-s\", ms=3, label=\"zero-ablation drop\")\n"
            "ax.axhline(0, color=\"0.6\", lw=0.8)\n"
            "ax.set_xlabel(\"decoder block\")\n"
            "ax.set_ylabel(\"probability\")\n"
            "ax.set_title(f\"{res.tokens[t]!r}: credit vs causal drop, block by block\")\n"
            "ax.legend()\n"
            "fig"
        ),
        new_markdown_cell(
            "## The pre-stated test\n\n"
            "Three hypotheses, one statistic each (two for H1), and one decision rule, written "
            "into the package (`captum_iglens.validate.verdict.PRE_STATED`) before any of its "
            "numbers were computed; `iglens validate` prints it with its verdict."
        ),
        new_code_cell(
            "from captum_iglens.validate.verdict import PRE_STATED\n\n"
            "print(PRE_STATED)"
        ),
        new_markdown_cell(
            "## Ablation on a few prompts\n\n"
            "`validate` explains every prompt (chat template, greedy answer), ablates every "
            "block at every answer token with `p_final >= 0.2` in three ways (`zero`; `mean`: "
            "the update replaced by its mean over the other prompts' positions, position 0 "
            "excluded; `resample`: the update taken from `donors` other prompts at the same "
            "answer offset, their probabilities averaged), and scores per token how well each "
            "predictor ranks the 30 blocks by their drop. The baselines matter as much as "
            "IG-Lens: \"first layer\" and \"last layer\" always, random scores, and the average "
            "drop profile of the *other* prompts. Six prompts and four answer tokens each keep "
            "this quick; the confidence intervals (prompts resampled) are correspondingly wide, "
            "and so few tokens rarely decide anything."
        ),
        new_code_cell(
            "from captum_iglens.validate import load_prompts, validate\n\n"
            "prompts = load_prompts()  # the frozen set shipped with the package\n"
            "few = [prompts[i] for i in (0, 8, 14, 21, 26, 28)]\n"
            "result = validate(model, tokenizer, few, kinds=(\"zero\", \"mean\", \"resample\"),\n"
            "                  max_new_tokens=4, n_boot=200, donors=3, progress=False)\n"
            "print(result.format_verdict().split(\"\\n\\n\")[-1])  # the verdict\n"
            "from captum_iglens.validate.tables import summary_block\n\n"
            "print()\n"
            "print(\"\\n\".join(summary_block(result.summary, \"mean\", \"mean ablation, all "
            "blocks\")))"
        ),
        new_code_cell("fig = result.plot()\nfig"),
        new_markdown_cell(
            "## Counterfactual patching, by hand\n\n"
            "A prompt pair has as many tokens in its clean and corrupted prompt, so positions "
            "align, and an answer for each: the readout is the contrast `F = p(y) - p(foil)` at "
            "the last prompt token. Patching block `L`: in the corrupted run, its update there "
            "is replaced by the clean run's, and the later blocks run on. The *recovery* is how "
            "much of `F` comes back. IG-Lens's contrastive credit from the corrupted reference "
            "(`IGLens.attribute(clean, baselines=corrupted, target=y, contrast=foil)`) adds up "
            "to `F(clean) - F(corrupted)`; its block-1 credit also holds the jump from the "
            "corrupted run's last residual to the clean `h_1`, so the test leaves block 1 out."
        ),
        new_code_cell(
            "from captum_iglens.validate.patching import load_pairs, patch_pair\n\n"
            "pair = load_pairs()[0]\n"
            "print(pair.clean, \"->\", repr(pair.answer), \"|\", pair.corrupted, \"->\",\n"
            "      repr(pair.foil))\n"
            "patch = patch_pair(ablation, tokenizer, pair)\n"
            "print(\"checks, largest |error|:\", patch.check_errors)\n"
            "print(f\"F(clean) {patch.f_clean:+.3f}, F(corrupted) {patch.f_corrupted:+.3f}\")\n"
            "gap = patch.f_clean - patch.f_corrupted\n"
            "assert abs(float(patch.credits.sum()) - gap) <= 1e-4\n"
            "top = patch.recovery.argsort(descending=True)[:5] + 1\n"
            "print(\"blocks that recover most:\", top.tolist())\n"
            "print(\"blocks credited most:    \", (patch.credits[1:].argsort(descending=True)[:5]\n"
            "                                  + 2).tolist())\n"
            "fig = Figure(figsize=(8, 3.5), layout=\"constrained\")\n"
            "ax = fig.subplots()\n"
            "ax.plot(range(1, 31), patch.credits, \"k-o\", ms=3, label=\"contrastive credit\")\n"
            "ax.plot(range(1, 31), patch.recovery, \"C4-s\", ms=3, label=\"patch recovery\")\n"
            "ax.plot(range(1, 31), patch.reverse, \"C5--\", label=\"reverse patch loss\")\n"
            "ax.axhline(0, color=\"0.6\", lw=0.8)\n"
            "ax.set_xlabel(\"decoder block\")\n"
            "ax.set_ylabel(\"F = p(y) - p(foil)\")\n"
            "ax.legend()\n"
            "fig"
        ),
        new_markdown_cell(
            "## Patching on a few pairs\n\n"
            "The same test on six packaged pairs (capitals, arithmetic, agreement, pronouns, "
            "antonyms; one cluster per pair)."
        ),
        new_code_cell(
            "patched = validate(model, tokenizer, few, kinds=(\"patch\",),\n"
            "                   pairs=load_pairs()[::6], n_boot=200, progress=False)\n"
            "print(patched.format_verdict().split(\"\\n\\n\")[-1])"
        ),
        new_markdown_cell(
            "## Where the damage is, and where the credit is\n\n"
            "For each ablation kind, which block hurts most when ablated (block: number of "
            "tokens), and which block IG-Lens credits most; then block 1 on its own."
        ),
        new_code_cell(
            "import numpy as np\n\n"
            "def counts(columns):\n"
            "    found = np.bincount(columns + 1, minlength=31)[1:]\n"
            "    return {block + 1: int(c) for block, c in enumerate(found) if c}\n\n"
            "for kind in result.kinds:\n"
            "    print(f\"largest {kind} drop at block:\", counts(result.drops[kind].argmax(1)))\n"
            "print(\"largest IG-Lens credit at block:\", counts(result.credits.argmax(1)))\n"
            "p = np.array([t[\"p_final\"] for t in result.tokens])\n"
            "drop1, credit1 = result.drops[\"zero\"][:, 0], result.credits[:, 0]\n"
            "print(f\"block 1: mean zero drop {drop1.mean():.3f} of mean p {p.mean():.3f}; \"\n"
            "      f\"median credit {np.median(credit1):+.4f}; median lens probability \"\n"
            "      f\"f(h_1) {np.median(result.lens_probs[:, 0]):.1e}\")"
        ),
        new_markdown_cell(
            "## Reading it honestly\n\n"
            "Six prompts and six pairs decide little. On the full packaged sets (`iglens "
            "validate`: 313 tokens from 32 prompts, 36 pairs; the README has the verdicts for "
            "SmolLM2 and Qwen2.5-Coder-0.5B) the test reads:\n\n"
            "- **H1, credit ranks the blocks better than the logit-lens level and chance:** "
            "yes under mean and resample ablation; under zero ablation the advantage over the "
            "lens level vanishes once the last block (whose drop *is* its credit) is left out; "
            "under patching the lens level does as well.\n"
            "- **H2, better on non-monotonic trajectories:** no; if anything credit ranks the "
            "blocks *worse* on them, the opposite of the paper's expectation.\n"
            "- **H3, the onset nearer the half-drop block than a random block:** no under "
            "ablation (the damage sits in block 1, the onset late); yes under patching, where "
            "the recovered contrast builds up in the upper blocks.\n"
            "- **Token-specific signal:** with the shared layer profile removed (`rho_tok`), "
            "credit keeps a small positive correlation with the drops, about as large as the "
            "direct effect's; the profile of the other prompts alone ranks the blocks better "
            "under zero and resample ablation.\n"
            "- **Block 1 matters most and gets no credit** under ablation: the lens cannot read "
            "the token out of `h_1`, although everything downstream depends on it.\n\n"
            "So IG-Lens answers *where along the depth the answer becomes readable*; that "
            "carries some information about which blocks matter, but it is not a causal "
            "importance score."
        ),
        new_markdown_cell(
            "## From the command line\n\n"
            "```\n"
            "iglens validate                       # packaged prompts and pairs, the verdict\n"
            "iglens validate --model qwen2.5-coder-0.5b-instruct --json v.json\n"
            "iglens validate --ablation zero --threshold 0.5 --json v.json --plot v.png\n"
            "iglens validate --ablation patch --pairs-file my_pairs.jsonl\n"
            "```"
        ),
    ]
    return new_notebook(cells=cells, metadata=_metadata())


def _metadata() -> dict:
    return {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }


def main() -> None:
    for name, build in (
        ("Getting_started_with_IG_Lens.ipynb", getting_started),
        ("Completeness_IG_Lens_vs_Captum.ipynb", completeness),
        ("Causal_validation_of_IG_Lens.ipynb", causal_validation),
        ("Baseline_comparison_tests.ipynb", baseline_comparison),
        ("IG_Lens_on_a_real_model.ipynb", real_model),
    ):
        nb = build()
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
