"""The benchmark's families: the pre-registration's names and the models ``--model`` loads.

Light (no torch): the command line reads it while it builds its parser.
"""

from __future__ import annotations

from captum_iglens.validate.benchmark.decide import load_preregistration

__all__ = ["FAMILY_MODELS", "family_runs_task", "required_families"]

#: The pre-registration's family names -> the model names ``--model`` loads.
FAMILY_MODELS: dict[str, str] = {
    "SmolLM2-135M": "smollm2", "Qwen2.5-Coder-0.5B": "qwen2.5-coder-0.5b-instruct",
    "Gemma-3-270m": "gemma-3-270m", "Qwen2.5-Coder-1.5B": "qwen2.5-coder-1.5b-instruct"}


def required_families() -> list[str]:
    """The model names of the pre-registration's required families, in its order."""
    return [FAMILY_MODELS[f["name"]] for f in load_preregistration().data["families"]
            if f.get("required", True)]


def family_runs_task(model: str, task: str) -> bool:
    """False for an optional family on a task the pre-registration does not give it."""
    for f in load_preregistration().data["families"]:
        if FAMILY_MODELS.get(f["name"]) == model and "tasks" in f:
            return task in f["tasks"]
    return True
