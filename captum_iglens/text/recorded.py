"""Greedy answers with the residual stream recorded by the generation's own forward passes.

Explaining a generated answer by teacher forcing runs the model twice over prompt and answer:
once to generate, once to attribute. Recording instead hooks the decoder blocks while
transformers' ``generate`` runs: its first pass over the prompt predicts answer token 0 at
the prompt's last position, and pass ``t`` (one token, KV cache) predicts answer token ``t``.
Those are exactly the positions IG-Lens explains, so the attribution needs only the readouts.

The recorded residuals are those of the forward that produced each token: every generated
token is its argmax. They equal a teacher-forced forward's up to kernel rounding (attention
over a KV cache instead of the whole sequence), and the model's logits at each step are
kept for the readout check (Invariant R, arXiv:2606.29693). Families whose generation passes
are not their plain forward (:data:`~captum_iglens.lens.families.UNRECORDED_GENERATION`) are not
recorded, nor are float64 models (``generate`` returns float32 logits); their answers are
teacher-forced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.baseline_rows import recordable_baselines
from captum_iglens._core.entry import layers_to_record
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.architectures import model_type, unwrap_model
from captum_iglens.lens.families import family_row
from captum_iglens.lens.hooks import check_finite_residuals, record_residual_steps
from captum_iglens.lens.state import model_dtype
from captum_iglens.settings import DEFAULT_BASELINE
from captum_iglens.text.generation import greedy_generate

if TYPE_CHECKING:
    from captum_iglens.ig_lens import IGLens

__all__ = ["Recording", "can_record", "generate_recording"]

#: The baselines a recording can start paths from (reference ids and tensors need a forward
#: or shapes of their own: those runs are teacher-forced).
RECORDABLE_BASELINES = recordable_baselines()


def can_record(baselines: BaselineSpec, model: Optional[nn.Module] = None) -> bool:
    """Whether paths from ``baselines`` (for ``model``) can be built from a recording.

    Families in :data:`~captum_iglens.lens.families.UNRECORDED_GENERATION`, whose generation
    passes are not their plain forward, cannot; nor can float64 models (``generate`` returns
    float32 logits, too coarse for their readout check).
    """
    if model is not None and _unrecordable(model) is not None:
        return False
    return isinstance(baselines, str) and baselines in RECORDABLE_BASELINES


def _unrecordable(model: nn.Module) -> Optional[str]:
    """Why ``model``'s generation cannot be recorded, or ``None``."""
    row = family_row(model_type(model))
    if row is not None and row.unrecorded:
        return f"{model_type(model)}: {row.unrecorded}"
    if model_dtype(model) == torch.float64:
        # generate hands back its logits in float32: too coarse for a float64 model's check
        return "a float64 model: generate returns float32 logits"
    config = getattr(unwrap_model(model), "config", None)
    config = getattr(config, "text_config", None) or config
    shared = getattr(config, "num_kv_shared_layers", 0)
    if isinstance(shared, int) and shared > 0:
        # Gemma-4: generate's prompt pass keeps only the last position before the layers
        # that reuse an earlier layer's keys and values
        return (f"{shared} KV-shared layers: generate's prompt pass keeps only the last "
                "position before them")
    return None


@dataclass
class Recording:
    """``B`` greedy answers and the residuals of the passes that produced them.

    The recorded sequence has ``C = S_p + N - 1`` columns: the left-padded prompt (``S_p``),
    then answer tokens ``0 .. N - 2`` (the last answer token is never an input). Answer token
    ``t`` of every row is predicted at column ``S_p - 1 + t``.

    Attributes:
        answers (list[list[int]]): ``B`` answers (each up to its first end token).
        states (dict[int, Tensor]): ``{l: h_l}``: ``[B, N, d]`` at the ``N`` predicting
            columns, or ``[B, C, d]`` for indices needed at every position.
        mask (Tensor): ``[B, C]`` int64, 1 at each row's real tokens (prompt and its own
            answer but the last token).
        logits (Tensor): ``[B, N, V]`` the model's logits at each step.
        prompt_width (int): ``S_p``.
    """

    answers: list[list[int]]
    states: dict[int, Tensor]
    mask: Tensor
    logits: Tensor
    prompt_width: int

    @property
    def positions(self) -> list[int]:
        """The ``N`` predicting columns: answer token ``t`` at ``S_p - 1 + t``."""
        return list(range(self.prompt_width - 1, self.prompt_width - 1 + self.logits.shape[1]))

    def rows(self, index: Sequence[int]) -> Recording:
        """The recording of rows ``index`` only."""
        pick = torch.tensor(list(index), dtype=torch.long)

        def take(tensor: Tensor) -> Tensor:
            return tensor[pick.to(tensor.device)]

        return Recording([self.answers[i] for i in index],
                         {i: take(s) for i, s in self.states.items()}, take(self.mask),
                         take(self.logits), self.prompt_width)


def generate_recording(lens: IGLens, tokenizer: Any, prompt_ids: Sequence[Sequence[int]],
                       max_new_tokens: int,
                       baselines: BaselineSpec = DEFAULT_BASELINE) -> Recording:
    """Greedy answers of ``B`` prompts, recording what IG-Lens needs from each pass.

    Args:
        lens (IGLens): The lens (model, decoder blocks, chosen layers, readout).
        tokenizer: The model's tokenizer (pad and end tokens).
        prompt_ids (sequence of sequence of int): ``B`` prompts' token ids.
        max_new_tokens (int): Longest answer.
        baselines (str): ``"mean"``, ``"zero"`` or ``"embedding"`` (see :func:`can_record`).

    Returns:
        Recording: answers, residuals, mask and logits.

    Raises:
        ValueError: ``max_new_tokens < 1``, a prompt too long for the model, or a model or
            baseline :func:`can_record` refuses.
        FloatingPointError: NaN or inf in the residual of a real token (the first such
            block named, chosen or not).
        ResidualShapeError: a decoder block's output is not a ``[B, s, d]`` residual stream.
        RuntimeError: ``generate`` ran another number of passes than it made tokens.
    """
    model, blocks = lens.model, lens.decoder_blocks
    reason = _unrecordable(model)
    if reason is not None:
        raise ValueError(f"This model cannot be recorded while generating ({reason}): use "
                         "teacher forcing.")
    if not can_record(baselines):
        raise ValueError(f"baselines={baselines!r} cannot be recorded while generating: use "
                         f"one of {RECORDABLE_BASELINES}, or teacher forcing.")
    needed, whole = layers_to_record(lens.spec, baselines)
    device = lens.spec.readout_device
    passes: dict[int, list[Tensor]] = {}  # every block, chosen or not: name the first NaN
    with record_residual_steps(blocks, needed, device, whole, passes) as steps:
        answers, out, prompt_mask = greedy_generate(
            model, tokenizer, prompt_ids, max_new_tokens, output_logits=True,
            return_dict_in_generate=True)
    n_steps = len(out.logits)
    counts = {len(calls) for calls in passes.values()}
    if counts != {n_steps}:
        raise RuntimeError(f"generate ran {sorted(counts)} forward passes for {n_steps} "
                           "generated tokens: this decoding cannot be recorded.")
    states = {i: torch.cat(calls, dim=1) for i, calls in steps.items()}
    width = prompt_mask.shape[1]
    lengths = torch.tensor([len(a) for a in answers])
    answer_real = torch.arange(n_steps - 1)[None] < (lengths[:, None] - 1)
    mask = torch.cat([prompt_mask.cpu(), answer_real.long()], dim=1)
    logits = torch.stack(out.logits, dim=1)
    # every block at every real position (prompt and answer), as a teacher-forced forward
    real = mask.bool()
    finite = {index: bool(torch.cat([f.cpu() for f in flags], dim=1)[real].all())
              for index, flags in passes.items()}
    check_finite_residuals(model, blocks, finite)
    return Recording(answers, states, mask.to(prompt_mask.device),
                     logits.to(device) if device is not None else logits, width)
