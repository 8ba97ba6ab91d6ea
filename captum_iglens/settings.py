"""The settings of an explanation, with each default written once (no torch import).

Every entry point (``IGLens.attribute``, ``explain``, ``iglens run``, ``validate`` and the
CLI's options and help) takes its defaults and choices from here, so that ``iglens --help``
can list them without importing torch, and no two places disagree about a default.

* :class:`AttributionSettings`: what is decomposed and how (estimator, steps, baseline,
  units, readout chunk) — Section 3 of the paper (IG-Lens, arXiv:2606.29693).
* :class:`ReportSettings`: how results are summarised (onset rule and fraction, top-k).
* :class:`GenerationSettings`: how an answer is obtained (greedy, chat template, date pin).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional

__all__ = [
    "BASELINES",
    "BUILTIN_MIN_STEPS",
    "CAPTUM_METHODS",
    "DEFAULT_BASELINE",
    "DEFAULT_CHUNK",
    "DEFAULT_EFFECT",
    "DEFAULT_GRANULARITY",
    "DEFAULT_LENS",
    "LENSES",
    "FIT_BATCH_TOKENS",
    "FIT_LR",
    "FIT_SEQUENCES",
    "FIT_SEQ_LEN",
    "FIT_STEPS",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_RECORDS",
    "DEFAULT_METHOD",
    "DEFAULT_N_STEPS",
    "DEFAULT_ONSET_FRAC",
    "DEFAULT_ONSET_RULE",
    "DEFAULT_SCOPE",
    "DEFAULT_UNITS",
    "EFFECTS",
    "GRANULARITIES",
    "METHODS",
    "ONSET_RULES",
    "SCOPES",
    "UNITS",
    "DEFAULT_N_BOOT",
    "VALIDATE_DONORS",
    "VALIDATE_MAX_NEW_TOKENS",
    "VALIDATE_THRESHOLD",
    "method_is_exact",
    "method_min_steps",
    "methods",
    "AttributionSettings",
    "GenerationSettings",
    "ReportSettings",
    "call_settings",
    "report_settings",
    "settings_from_record",
]

#: The exact estimator: each segment credited its observed change in ``f`` (no backward).
DEFAULT_METHOD = "prediction_aware"
#: Captum's approximation methods (``captum.attr._utils.approximation_methods``), the
#: gradient estimators of the paper's reference variant.
CAPTUM_METHODS: tuple[str, ...] = (
    "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")
#: The built-in estimators and the smallest ``n_steps`` each accepts (the rows of
#: :data:`~captum_iglens._core.estimators.ESTIMATORS` start from these; a gradient rule
#: needs two grid points per segment).
BUILTIN_MIN_STEPS: dict[str, int] = {DEFAULT_METHOD: 1, **dict.fromkeys(CAPTUM_METHODS, 2)}


def _live_rows() -> Optional[dict]:
    """The estimator registry where it is loaded (it imports torch), else ``None``."""
    module = sys.modules.get("captum_iglens._core.estimators")
    return None if module is None else getattr(module, "ESTIMATORS", None)


def methods() -> tuple[str, ...]:
    """Every ``method`` name now, ``register_estimator`` additions included.

    The live registry's names once it is loaded, the built-in names before (``iglens
    --help`` loads no torch).
    """
    rows = _live_rows()
    return tuple(rows) if rows is not None else tuple(BUILTIN_MIN_STEPS)


def method_min_steps(method: str) -> Optional[int]:
    """The smallest ``n_steps`` ``method`` accepts (its registry row), ``None`` if unknown."""
    rows = _live_rows()
    if rows is not None:
        return rows[method].min_steps if method in rows else None
    return BUILTIN_MIN_STEPS.get(method)


def method_is_exact(method: Optional[str]) -> bool:
    """Whether ``method``'s registry row is exact (its credits add up at any ``n_steps``).

    The live row once the registry is loaded, the built-in rows before (the default
    estimator is the exact one); ``False`` for an unknown name or ``None``.
    """
    rows = _live_rows()
    if rows is not None:
        return method in rows and bool(rows[method].exact)
    return method == DEFAULT_METHOD  # the one exact built-in row


class _LiveMethods(Sequence):
    """:func:`methods` as a tuple-like constant: read on every use, never a stale copy."""

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return methods()[index]

    def __len__(self) -> int:
        return len(methods())

    def __contains__(self, name: object) -> bool:
        return name in methods()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _LiveMethods))
                               else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(methods())


#: Every ``method`` name, live: a registered estimator appears here at once (see
#: :func:`methods`); ``tuple(METHODS)`` takes a snapshot.
METHODS: Sequence[str] = _LiveMethods()
#: Steps per path segment of the gradient estimators (Captum's default).
DEFAULT_N_STEPS = 50
#: Named residual-space baselines; ``"mean"`` is the causal running mean of ``h_1``.
BASELINES: tuple[str, ...] = ("mean", "zero", "embedding")
DEFAULT_BASELINE = "mean"
#: The readout ``f`` that is decomposed: the target's probability or its log (nats).
UNITS: tuple[str, ...] = ("probability", "log-probability")
DEFAULT_UNITS = "probability"
#: Path nodes: one per chosen block (``"block"``), or two, after its attention and after its
#: MLP (``"sublayer"``: attention and MLP credits that add up to the block's).
GRANULARITIES: tuple[str, ...] = ("block", "sublayer")
DEFAULT_GRANULARITY = "block"
#: What a credit measures: ``"readout"`` (the paper's: what the final norm and unembedding
#: read out of ``h_L`` beyond ``h_{L-1}``), ``"total"`` (the block's exact share of the
#: change of the model's own ``p(y)`` when every chosen update at the explained position
#: goes to its reference: gates integrated along one line) or ``"atp"`` (attribution
#: patching, the first-order estimate of each block's single-update removal: not additive).
EFFECTS: tuple[str, ...] = ("readout", "total", "atp")
DEFAULT_EFFECT = "readout"
#: Named per-layer readouts: the logit lens (the model's own readout at every layer) and the
#: fitted ones (``iglens fit-lens``; :mod:`captum_iglens.lens.translators`).
LENSES: tuple[str, ...] = ("logit", "tuned", "jacobian")
DEFAULT_LENS = "logit"
#: ``iglens fit-lens``: Adam steps of the tuned lens, its learning rate and token rows per step;
#: the corpus's chunks and their length in tokens.
FIT_STEPS = 120
FIT_LR = 1e-3
FIT_BATCH_TOKENS = 32
FIT_SEQUENCES = 40
FIT_SEQ_LEN = 64
#: Where a total-effect (or AtP) lens's gates act: ``"position"`` (the explained position's
#: updates only) or ``"sequence"`` (every position up to it, one shared gate per block).
SCOPES: tuple[str, ...] = ("position", "sequence")
DEFAULT_SCOPE = "position"
#: Onset rules: ``sustained`` (cumulative credit stays past ``frac * delta_p``) or ``mass``.
ONSET_RULES: tuple[str, ...] = ("sustained", "mass")
DEFAULT_ONSET_RULE = "sustained"
DEFAULT_ONSET_FRAC = 0.5
#: Longest generated answer.
DEFAULT_MAX_NEW_TOKENS = 64
#: Document mode: explained positions per forward pass.
DEFAULT_CHUNK = 512
#: ``iglens summarize --html``: records drawn in the page.
DEFAULT_MAX_RECORDS = 200
#: ``iglens validate``: answer tokens with ``p_final`` at least this are ablated.
VALIDATE_THRESHOLD = 0.2
#: ``iglens validate``: longest answer of the packaged short-answer prompts.
VALIDATE_MAX_NEW_TOKENS = 12
#: ``iglens validate``: resample-ablation donors per prompt.
VALIDATE_DONORS = 4
#: Cluster-bootstrap resamples of summaries and the validation's tables.
DEFAULT_N_BOOT = 1000


@dataclass(frozen=True)
class AttributionSettings:
    """What is decomposed, and how: every setting of one attribution, in one object.

    Built once where a user's keyword arguments (or the CLI's options) enter the package,
    then passed whole: ``IGLens.attribute(..., settings=...)``, ``explain``, the document
    and batched paths, ``iglens run`` and the validation take it. ``method`` and
    ``n_steps`` are checked against the estimator registry where the computation starts
    (:func:`captum_iglens._core.entry.attribute`), the one place that knows every
    registered estimator (and the lens checks ``units``, ``granularity``, ``effect``).

    Attributes:
        method (str): One of :data:`METHODS` (or a registered estimator). Default:
            ``"prediction_aware"`` (exact).
        n_steps (int): Steps per segment for the gradient estimators. Default: 50.
        baselines (str or Tensor): Where the path starts. Default: ``"mean"``.
        units (str): One of :data:`UNITS`. Default: ``"probability"`` (a lens's own units
            decide in :meth:`~captum_iglens.IGLens.attribute`; ``explain`` builds its lens
            with these).
        internal_batch_size (int, optional): Readout rows per chunk (memory, not numbers).
        granularity (str): One of :data:`GRANULARITIES` (the lens ``explain`` builds).
        effect (str): One of :data:`EFFECTS` (the lens ``explain`` builds).
        heads (bool): Per-head attention credits (the lens ``explain`` builds).
        scope (str): One of :data:`SCOPES`, for a lens with ``effect="total"`` or
            ``"atp"``: ``"position"`` (default) gates each block's update at the explained
            position only; ``"sequence"`` at every position up to it (one full forward and
            backward of the prefix per step, about ``i + 1`` times the cost; block
            granularity only). A readout lens refuses ``"sequence"``.
        grad_drop (bool): AtP* (Kramar et al. 2024, Section 3.1.2): attribution patching
            with GradDrop, for a lens with ``effect="atp"`` at position scope; the result
            records ``method="atp*"``. A switch, not a ``method`` name: ``method`` names
            the path-integral estimator (checked against the estimator registry), which
            attribution patching does not use. Default: False.
    """

    method: str = DEFAULT_METHOD
    n_steps: int = DEFAULT_N_STEPS
    baselines: Any = field(default=DEFAULT_BASELINE, compare=False)
    units: str = DEFAULT_UNITS
    internal_batch_size: Optional[int] = None
    granularity: str = DEFAULT_GRANULARITY
    effect: str = DEFAULT_EFFECT
    heads: bool = False
    scope: str = DEFAULT_SCOPE
    grad_drop: bool = False

    def __post_init__(self) -> None:
        """Refuse a value outside its field's choices (``method`` is the registry's to check).

        Raises:
            ValueError: ``units``, ``granularity``, ``effect`` or ``scope`` not one of its
                choices (:data:`UNITS`, :data:`GRANULARITIES`, :data:`EFFECTS`,
                :data:`SCOPES`).
            TypeError: ``heads`` or ``grad_drop`` not a bool.
        """
        for name, choices in (("units", UNITS), ("granularity", GRANULARITIES),
                              ("effect", EFFECTS), ("scope", SCOPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"AttributionSettings({name}={getattr(self, name)!r}): use one "
                                 f"of {choices}.")
        for name in ("heads", "grad_drop"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"AttributionSettings({name}=...) must be True or False, got "
                                f"{getattr(self, name)!r}.")

    def updated(self, **given: Any) -> AttributionSettings:
        """These settings with each keyword that is not ``None`` in place of its field.

        The public functions take their keyword arguments (``n_steps=...``) this way: a
        keyword given wins over ``settings``; one left at ``None`` keeps its field.
        """
        changed = {name: value for name, value in given.items() if value is not None}
        return replace(self, **changed) if changed else self

    def lens_options(self) -> dict[str, Any]:
        """The :class:`~captum_iglens.IGLens` keyword arguments these settings fix."""
        return {"units": self.units, "granularity": self.granularity, "effect": self.effect,
                "heads": self.heads}


def settings_from_record(record: Mapping[str, Any]) -> AttributionSettings:
    """The settings a results line (or run fingerprint) records; a missing key, its default.

    Lines written before a setting existed hold no key for it: they were made with its
    default, which this reads from :class:`AttributionSettings` (the one place it is
    written). Keys that are ``None`` count as missing.
    """
    names = {f.name for f in fields(AttributionSettings)}
    given = {k: v for k, v in record.items() if k in names and v is not None}
    return AttributionSettings(**given)


@dataclass(frozen=True)
class ReportSettings:
    """How a result is summarised.

    Attributes:
        onset_frac (float): Fraction of the onset rule, in (0, 1]. Default: 0.5.
        onset_rule (str): One of :data:`ONSET_RULES`. Default: ``"sustained"``.
        top_k (int): Logit-lens top tokens recorded per layer. Default: 0.
    """

    onset_frac: float = DEFAULT_ONSET_FRAC
    onset_rule: str = DEFAULT_ONSET_RULE
    top_k: int = 0


@dataclass(frozen=True)
class GenerationSettings:
    """How an answer is obtained: plain greedy decoding.

    Attributes:
        max_new_tokens (int): Longest answer. Default: 64.
        chat_template (bool): Wrap prompts in the tokenizer's chat template. Default: True.
        template_kwargs (dict, optional): Chat-template variables (``date_string``).
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    chat_template: bool = True
    template_kwargs: Optional[dict[str, Any]] = field(default=None, hash=False)


def call_settings(settings: Optional[AttributionSettings], lens: Any = None,
                  **given: Any) -> AttributionSettings:
    """The settings of a Captum-style call: ``settings``, or its keyword arguments.

    ``IGLens.attribute`` keeps Captum's positional arguments (``baselines``, ``n_steps``,
    ``method``, ``internal_batch_size``) with their defaults; ``settings=`` gives them in
    one object instead. Both at once would leave one of them unread, so it is refused.
    ``lens`` (the lens's spec: ``units``, ``granularity``, ``effect``, ``heads``) decides
    those four; a ``settings`` that sets one of them away from its default to another value
    than the lens's is refused rather than silently ignored.

    Raises:
        ValueError: ``settings`` together with any of ``given`` away from its default, or
            a lens field of ``settings`` that contradicts ``lens``.
    """
    chosen = _one_of(settings, AttributionSettings, "settings", given)
    if settings is None or lens is None:
        return chosen
    default = AttributionSettings().lens_options()
    clash = {k: v for k, v in settings.lens_options().items()
             if v != default[k] and v != getattr(lens, k)}
    if clash:
        built = {k: getattr(lens, k) for k in clash}
        raise ValueError(f"settings has {clash}, but this IGLens was built with {built}: these "
                         "fields choose the lens. Build IGLens(model, ...) with them, or use "
                         "explain(..., settings=...), which builds its lens from them.")
    return chosen


def report_settings(report: Optional[ReportSettings], **given: Any) -> ReportSettings:
    """``report``, or the :class:`ReportSettings` of ``onset_frac``, ``onset_rule``, ``top_k``.

    Raises:
        ValueError: ``report`` together with any of ``given`` away from its default.
    """
    return _one_of(report, ReportSettings, "report", given)


def _one_of(chosen: Any, kind: type, name: str, given: dict[str, Any]) -> Any:
    """``chosen`` when given (then every keyword must be at its default), else ``kind(**given)``."""
    if chosen is None:
        return kind(**given)
    if not isinstance(chosen, kind):
        raise TypeError(f"{name}= takes an object of {kind.__name__} (captum_iglens.settings), got "
                        f"{type(chosen).__name__}: build it with {kind.__name__}(...).")
    defaults = kind()
    moved = [key for key, value in given.items()
             if not (isinstance(value, (str, int, float, type(None)))
                     and value == getattr(defaults, key))]
    if moved:
        raise ValueError(f"{name}= was given together with {moved}: put them in the "
                         f"{name} (dataclasses.replace({name}, ...)) or pass them alone.")
    return chosen
