"""benchmarks/gpu_check.py runs on a CPU too: the smallest sizes on a tiny model folder.

Every section runs in float32 and bfloat16 and its numbers are the ones the table prints: a
dataset run that explains every prompt, a document whose every position is explained, and
IG-Lens credits that add up to their Δp (bfloat16: within the readout's half-precision
rounding).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_check", None)


def test_gpu_check_runs_on_cpu_with_the_smallest_sizes(gpu_check, tmp_path, capsys):
    folder = tmp_path / "tiny-llama"
    make_tiny("llama", n_layers=3).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = gpu_check.main(["--model", str(folder), "--cpu-small", "--device", "cpu"])
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert "small sizes" in out and "ratio LIG / IG-Lens" in out
    sz = gpu_check.SMALL
    assert set(results) == {"float32", "bfloat16"}
    for name, got in results.items():
        assert got["run_ok"] == sz.prompts and got["run_errors"] == 0, name
        assert got["run_tokens"] == got["generate_tokens"] > 0  # the same greedy answers
        assert got["document_positions"] == got["document_tokens"] - 1 > 0
        assert got["lig_layers"] == 3 and len(got["lig_report"].methods) == 1
        for key in ("lens_over_logit_lens", "lig_over_lens", "run_over_generate"):
            assert math.isfinite(got[key]) and got[key] > 0, (name, key)
    # float32 credits add up to Δp to a few float32 roundings of probabilities <= 1
    assert results["float32"]["completeness"] < 1e-5
    assert results["float32"]["document_completeness"] < 1e-5
