"""The settings of a dataset run and the report of what it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from captum_iglens.settings import (
    DEFAULT_CHUNK,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    AttributionSettings,
    GenerationSettings,
    ReportSettings,
)
from captum_iglens.text.explain_prompt import (
    DEFAULT_MAX_NEW_TOKENS,
)


@dataclass
class RunSettings:
    """How every record of a run is explained.

    Attributes:
        batch_size (int): Prompts per batch (generation and attribution). Default: 8.
        max_new_tokens (int): Longest generated answer. Default: 64.
        chat_template (bool): Wrap prompts in the tokenizer's chat template. Default: True.
        template_kwargs (dict, optional): Chat-template variables (``date_string``).
        onset_frac (float): Fraction of the onset rule. Default: 0.5.
        onset_rule (str): ``"sustained"`` (default) or ``"mass"``.
        top_k (int): Logit-lens top tokens recorded per layer. Default: 0.
        stride (int): Document mode: step between explained positions. Default: 1.
        chunk (int): Document mode: positions per forward. Default: 512.
        attribution (AttributionSettings): ``baselines``, ``method``, ``n_steps``,
            ``internal_batch_size`` of every record (the lens decides units, granularity
            and effect). Default: the defaults.
        model_source (str, optional): The identity of the model's files
            (:func:`captum_iglens.models.facts.source_id`), recorded in every line's
            fingerprint as ``source`` (not compared) so that a rerun with nothing left to do
            can tell so without loading the model. Default: None (not recorded).
    """

    batch_size: int = 8
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    chat_template: bool = True
    template_kwargs: Optional[dict[str, Any]] = None
    onset_frac: float = DEFAULT_ONSET_FRAC
    onset_rule: str = DEFAULT_ONSET_RULE
    top_k: int = 0
    stride: int = 1
    chunk: int = DEFAULT_CHUNK
    attribution: AttributionSettings = field(default_factory=AttributionSettings)
    model_source: Optional[str] = None

    @property
    def report(self) -> ReportSettings:
        """The :class:`~captum_iglens.settings.ReportSettings` of every record."""
        return ReportSettings(self.onset_frac, self.onset_rule, self.top_k)

    @property
    def generation(self) -> GenerationSettings:
        """The :class:`~captum_iglens.settings.GenerationSettings` of every prompt record."""
        return GenerationSettings(self.max_new_tokens, self.chat_template,
                                  self.template_kwargs)


@dataclass
class RunReport:
    """What a run did (counts over the whole merged output, in every process).

    Attributes:
        output (Path): The output file.
        n_records (int): Records in the input.
        n_skipped (int): Already in the output when the run started.
        n_ok (int): Results in the output.
        n_errors (int): Error records in the output.
        n_tokens (int): Explained tokens run by this process now.
        seconds (float): Wall time of this process.
    """

    output: Path
    n_records: int
    n_skipped: int
    n_ok: int
    n_errors: int
    n_tokens: int
    seconds: float

    def format(self) -> str:
        """One line: records done, errors, tokens per second."""
        rate = self.n_tokens / self.seconds if self.seconds > 0 else 0.0
        return (f"{self.output}: {self.n_ok} results, {self.n_errors} errors of "
                f"{self.n_records} records ({self.n_skipped} "
                f"{'was' if self.n_skipped == 1 else 'were'} already done); "
                f"{self.n_tokens} tokens explained now by this process in {self.seconds:.1f} s "
                f"({rate:.1f} tokens/s)")
