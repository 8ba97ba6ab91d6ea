"""IG-Lens side by side with Captum's layer methods: who adds up to what (DESIGN.md s. 3.8, 4).

:func:`compare_completeness` runs, on the same token ids, explained position, target token and
decoder layers:

- IG-Lens (arXiv:2606.29693), one path through the residual stream whose per-layer credits
  telescope to ``Δp = f(h_n) - f(b)``;
- Captum's :class:`~captum.attr.LayerIntegratedGradients`, one decoder layer at a time;
- Captum's :class:`~captum.attr.LayerConductance`, one decoder layer at a time, through an
  ``inputs_embeds`` forward;
- the logit-lens probability per layer (levels, for reference).

In a pre-norm residual transformer every block output is a full cut of the network, so each
Captum layer total is (up to discretisation) the whole ``F(x) - F(x')``: summed over ``k``
layers they give about ``k`` times the change, while IG-Lens's credits add up to its ``Δp``.
"""

from __future__ import annotations

import inspect
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
from captum.attr import LayerConductance, LayerIntegratedGradients
from torch import Tensor, nn

from captum_iglens.ig_lens import BaselineSpec, IGLens, LayerSpec
from captum_iglens.residual import model_state_preserved

__all__ = [
    "COMPARE_METHODS",
    "CompletenessReport",
    "MethodCompleteness",
    "compare_completeness",
    "input_baseline_ids",
    "residual_tap",
    "target_probability_forward",
]

#: Method names accepted by :func:`compare_completeness` (``methods=``).
COMPARE_METHODS: tuple[str, ...] = (
    "ig_lens",
    "ig_lens_gradient",
    "layer_integrated_gradients",
    "layer_conductance",
    "logit_lens",
)
DEFAULT_COMPARE_METHODS: tuple[str, ...] = (
    "ig_lens",
    "layer_integrated_gradients",
    "layer_conductance",
    "logit_lens",
)
_CAPTUM_METHODS = ("layer_integrated_gradients", "layer_conductance")
_LABELS = {
    "ig_lens": "IG-Lens",
    "ig_lens_gradient": "IG-Lens (grad)",
    "layer_integrated_gradients": "LayerIG",
    "layer_conductance": "LayerCond",
    "logit_lens": "lens p",
}


@dataclass
class MethodCompleteness:
    """One method's numbers in a :class:`CompletenessReport` (probability units throughout).

    Attributes:
        name (str): Method key (one of :data:`COMPARE_METHODS`).
        label (str): Short column label.
        per_layer (Tensor): ``[k]`` credit per layer (for ``logit_lens``: the level
            ``f(h_L)``, which is not a credit and does not add up).
        total (float): The method's own total change: ``F(x) - F(x')`` for the Captum
            methods, ``Δp = f(h_n) - f(b)`` for IG-Lens, ``p_final`` for the logit lens.
        convergence_deltas (Tensor, optional): Captum's convergence delta per layer run,
            ``[k]`` (``sum of that run's attributions - total``); for IG-Lens ``[1]``, the
            delta of its single path (``sum - Δp``); ``None`` for the logit lens.
        wall_time_s (float): Seconds spent on the method (all its layers).
        per_layer_time_s (list[float], optional): Seconds per layer run (Captum methods).
        is_credit (bool): ``False`` for levels (logit lens): no sum or gap is reported.
    """

    name: str
    label: str
    per_layer: Tensor
    total: float
    convergence_deltas: Optional[Tensor] = None
    wall_time_s: float = float("nan")
    per_layer_time_s: Optional[list[float]] = None
    is_credit: bool = True

    @property
    def layer_sum(self) -> float:
        """Sum of the per-layer credits over the chosen layers (NaN for levels)."""
        return float(self.per_layer.double().sum()) if self.is_credit else float("nan")

    @property
    def completeness_gap(self) -> float:
        """``|sum over layers - total|`` (NaN for levels)."""
        return abs(self.layer_sum - self.total) if self.is_credit else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes ``None``)."""
        return {
            "label": self.label,
            "per_layer": [float(x) for x in self.per_layer],
            "sum": _num(self.layer_sum),
            "total": float(self.total),
            "completeness_gap": _num(self.completeness_gap),
            "convergence_deltas": (
                None if self.convergence_deltas is None
                else [float(x) for x in self.convergence_deltas]
            ),
            "wall_time_s": _num(self.wall_time_s),
            "per_layer_time_s": self.per_layer_time_s,
            "is_credit": self.is_credit,
        }


@dataclass
class CompletenessReport:
    """The side-by-side result of :func:`compare_completeness`.

    Attributes:
        layer_indices (list[int]): The ``k`` hidden-state indices (0 = input of the first
            block, ``l`` = output of block ``l``).
        position (int): The explained position (non-negative).
        target_id (int): The target token id.
        target_token (str): The target token as text (``""`` without a tokenizer).
        input_ids (list[int]): The explained token ids.
        baseline_ids (list[int]): The Captum methods' input-space baseline token ids.
        baseline_description (str): Which filler token replaced how many positions.
        f_input (float): ``F(x)``, the model's probability of the target.
        f_baseline (float): ``F(x')``, the same at the baseline ids.
        n_steps (int): Integration steps of the Captum methods (and of IG-Lens's gradient
            estimator).
        lens_baseline (str): IG-Lens's residual-space baseline.
        methods (dict[str, MethodCompleteness]): Per method, in run order.
    """

    layer_indices: list[int]
    position: int
    target_id: int
    target_token: str
    input_ids: list[int]
    baseline_ids: list[int]
    f_input: float
    f_baseline: float
    n_steps: int
    lens_baseline: str
    baseline_description: str = ""
    methods: dict[str, MethodCompleteness] = field(default_factory=dict)
    model_name: str = ""

    @property
    def layer_names(self) -> list[str]:
        """``"emb"`` for index 0, ``"L<l>"`` for the output of block ``l``."""
        return ["emb" if i == 0 else f"L{i}" for i in self.layer_indices]

    def __getitem__(self, name: str) -> MethodCompleteness:
        return self.methods[name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: settings and, per method, per-layer credit, sum, total, gap,
        convergence deltas and wall time."""
        return {
            "model": self.model_name,
            "layers": [int(i) for i in self.layer_indices],
            "layer_names": self.layer_names,
            "position": int(self.position),
            "target_id": int(self.target_id),
            "target_token": self.target_token,
            "input_ids": [int(i) for i in self.input_ids],
            "baseline_ids": [int(i) for i in self.baseline_ids],
            "baseline_description": self.baseline_description,
            "F_input": float(self.f_input),
            "F_baseline": float(self.f_baseline),
            "n_steps": int(self.n_steps),
            "lens_baseline": self.lens_baseline,
            "units": "probability",
            "methods": {name: m.to_dict() for name, m in self.methods.items()},
        }

    def format_table(self) -> str:
        """The comparison as a text table: one row per layer, one column per method (and the
        Captum convergence delta of each layer run), then sum, own total, completeness gap
        and wall time per method."""
        cols: list[tuple[str, list[str]]] = []
        for m in self.methods.values():
            cols.append((m.label, [f"{float(x):+.6f}" for x in m.per_layer]))
            if m.name in _CAPTUM_METHODS:
                cols.append((f"δ {m.label}", [f"{float(x):+.1e}" for x in m.convergence_deltas]))
        widths = [max(12, len(label), *(len(v) for v in values)) for label, values in cols]
        names = self.layer_names
        first = max(11, *(len(n) for n in names))

        def row(label: str, cells: Sequence[str]) -> str:
            pairs = zip(cells, widths, strict=True)
            return f"{label:>{first}} |" + "".join(f" {c:>{w}} |" for c, w in pairs)

        head = row("layer", [label for label, _ in cols])
        lines = [
            f"target {self.target_token!r} (id {self.target_id}) at position {self.position}; "
            f"F(x) = {self.f_input:.6f}, F(x') = {self.f_baseline:.6f} "
            f"(Captum baseline: {self.baseline_description}); "
            f"IG-Lens baseline: {self.lens_baseline}; n_steps = {self.n_steps}",
            head,
            "-" * len(head),
        ]
        for j, name in enumerate(names):
            lines.append(row(name, [values[j] for _, values in cols]))
        lines.append("-" * len(head))
        footer = {"sum": [], "total": [], "|sum-total|": [], "time s": []}
        for m in self.methods.values():
            has_delta = m.name in _CAPTUM_METHODS
            footer["sum"].append(_fmt(m.layer_sum, "+.6f"))
            footer["total"].append(_fmt(m.total, "+.6f"))
            footer["|sum-total|"].append(_fmt(m.completeness_gap, ".2e"))
            footer["time s"].append(_fmt(m.wall_time_s, ".3f"))
            if has_delta:
                for values in footer.values():
                    values.append("")
        for label, cells in footer.items():
            lines.append(row(label, cells))
        lines.append(
            "total: each method's own change, F(x) - F(x') for the Captum methods, "
            "Δp = f(h_n) - f(b) for IG-Lens, p for the logit lens (levels, not credits)."
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()

    def plot(self, ax: Any = None, title: Optional[str] = None) -> Any:
        """Grouped bars per layer per method, each method's own total as a horizontal line.

        Delegates to :func:`captum_iglens.plot.plot_completeness`. Returns the matplotlib
        ``Figure`` (created without pyplot's global state unless ``ax`` is given).
        """
        from captum_iglens.plot import plot_completeness

        return plot_completeness(self, ax=ax, title=title)


def _num(x: float) -> Optional[float]:
    return None if isinstance(x, float) and math.isnan(x) else float(x)


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# ---------------------------------------------------------------------- forwards / baselines
def target_probability_forward(
    model: nn.Module,
    position: int,
    target: int,
    inputs_embeds: bool = False,
) -> Callable[..., Tensor]:
    """A Captum forward function: the target token's probability at ``position``.

    The returned ``forward(x, attention_mask=None)`` runs ``model(input_ids=x)`` (or
    ``model(inputs_embeds=x)`` when ``inputs_embeds=True``) with ``use_cache=False``, the
    attention mask, and ``position_ids`` derived from the mask for models that take them
    (left padding), and returns ``softmax(logits[:, position])[:, target]`` in float32
    (probability units, shape ``[N]``). ``position`` must be non-negative; models that take
    ``logits_to_keep`` unembed only the positions from ``position`` on.
    """
    params = inspect.signature(model.forward).parameters
    takes_position_ids = "position_ids" in params
    takes_logits_to_keep = "logits_to_keep" in params
    key = "inputs_embeds" if inputs_embeds else "input_ids"

    def forward(x: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        kwargs: dict[str, Any] = {key: x, "use_cache": False}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
            if takes_position_ids:
                kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        index = position
        if takes_logits_to_keep:  # unembed only the positions from `position` on
            kwargs["logits_to_keep"] = x.shape[1] - position
            index = 0
        logits = model(**kwargs).logits[:, index]
        return torch.softmax(logits.float(), dim=-1)[:, target]

    return forward


def _special_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or []) if tokenizer is not None else set()
    config = getattr(model, "config", None)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        ids.update(int(v) for v in values if v is not None)
    return ids


def _default_filler(model: nn.Module, tokenizer: Any) -> int:
    if tokenizer is not None:
        ids = list(tokenizer(" ", add_special_tokens=False)["input_ids"])
        if len(ids) == 1:
            return int(ids[0])
    config = getattr(model, "config", None)
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if value is not None:
            return int(value)
    raise ValueError("No tokenizer and no BOS/EOS id in the config: pass baselines=<token id>.")


def input_baseline_ids(
    model: nn.Module,
    input_ids: Tensor,
    baselines: Union[None, int, Tensor] = None,
    tokenizer: Any = None,
    keep_special: bool = True,
    attention_mask: Optional[Tensor] = None,
) -> Tensor:
    """The Captum methods' baseline in input space, as token ids shaped like ``input_ids``.

    By default the baseline keeps the *structure* of the input and blanks its content: the
    first attended position (position 0 without padding), padding, and every special token
    (the tokenizer's ``all_special_ids``, and the config's BOS / EOS / pad ids), i.e. the
    chat template's markers, stay as they are; every other
    position becomes a filler token: ``" "`` (a single space token) when a tokenizer is given,
    else the config's BOS (or EOS) id. Special tokens at content positions act as extra
    attention sinks with very large residual norms; a baseline made only of them (e.g. BOS at
    every position) gives Captum a path whose integral converges badly.

    Args:
        model (nn.Module): The causal LM.
        input_ids (Tensor): ``[1, S]`` token ids.
        baselines (int or Tensor, optional): ``None`` (default, see above); an int: that
            filler token id (structure still kept when ``keep_special``); a tensor of ids
            shaped like ``input_ids``: used as given.
        tokenizer (optional): For the special ids and the default filler.
        keep_special (bool, optional): Keep the first attended position and special tokens.
            Default: True.
        attention_mask (Tensor, optional): ``[1, S]``; masked positions (left padding) are
            kept as they are and the first attended position counts as position 0.

    Returns:
        Tensor: ``[1, S]`` int64 baseline ids.

    Raises:
        ValueError: if the shape is wrong, an id is outside the vocabulary, or a baseline token
            at a position that differs from the input has a (near) zero input embedding. A
            zero embedding (often the pad token) makes the pre-norm RMSNorm/LayerNorm act near
            ``1/sqrt(eps)``: the path starts where the norm's gradient explodes and Captum's
            estimate does not converge (DESIGN.md section 3, item 8).
    """
    if isinstance(baselines, Tensor):
        base = baselines.to(input_ids.device).long()
        if base.shape != input_ids.shape:
            raise ValueError(
                f"baselines has shape {tuple(base.shape)}; give token ids shaped like the "
                f"inputs {tuple(input_ids.shape)} or one token id."
            )
    elif baselines is None or (isinstance(baselines, int) and not isinstance(baselines, bool)):
        filler = _default_filler(model, tokenizer) if baselines is None else int(baselines)
        base = torch.full_like(input_ids, filler)
        if keep_special:
            special = torch.tensor(sorted(_special_ids(model, tokenizer)), dtype=torch.long,
                                   device=input_ids.device)
            keep = torch.isin(input_ids, special)
            if attention_mask is not None:
                attended = attention_mask.to(input_ids.device).bool()
                keep |= ~attended
                first = attended.long().argmax(-1)
            else:
                first = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
            keep[torch.arange(input_ids.shape[0], device=input_ids.device), first] = True
            base = torch.where(keep, input_ids, base)
    else:
        raise TypeError(f"baselines must be None, a token id or a tensor of ids, got {baselines!r}")
    weight = model.get_input_embeddings().weight
    if base.min() < 0 or base.max() >= weight.shape[0]:
        raise ValueError(f"Baseline token ids must be in 0..{weight.shape[0] - 1}.")
    moving = base[base != input_ids]
    if moving.numel():
        with torch.no_grad():
            norms = weight[moving.unique()].float().norm(dim=-1)
            typical = weight[: min(weight.shape[0], 4096)].float().norm(dim=-1).median()
        if bool((norms <= 1e-3 * typical).any()):
            raise ValueError(
                "A baseline token has a (near) zero input embedding: the path would start where "
                "the pre-norm's gradient is ~1/sqrt(eps) and Captum's estimate would not "
                "converge. Pick another baseline token (e.g. a space), not a zero pad token."
            )
    return base


def _describe_baseline(base: Tensor, input_ids: Tensor, tokenizer: Any) -> str:
    changed = base != input_ids
    fillers = sorted(set(base[changed].tolist()))
    names = ", ".join(
        f"{tokenizer.decode([i])!r} (id {i})" if tokenizer is not None else f"id {i}"
        for i in fillers[:3]
    )
    return (f"{names or 'the input itself'} at {int(changed.sum())} of {base.shape[1]} "
            "positions, the others kept")


@contextmanager
def residual_tap(blocks: nn.ModuleList, index: int) -> Iterator[nn.Module]:
    """An ``nn.Identity`` through which the residual ``h_index`` flows, for Captum's layer hooks.

    Captum's layer methods hook a module's input or output. Decoder blocks are awkward
    targets: GPT-2 and Falcon blocks take extra positional arguments that are ``None``
    (Captum refuses them as layer inputs), and Bloom, MPT and GPT-Neo blocks return tuples
    whose other members are not in the graph (Captum's gradient fails on them). While the
    context is open, the residual stream at hidden-state index ``index`` (0: the input of the
    first block; ``l``: the output of block ``l``) is routed through the yielded identity
    module, whose input and output are that one ``[B, S, d]`` tensor; hooks are removed on exit.
    """
    tap = nn.Identity()
    if index == 0:

        def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                return (tap(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": tap(kwargs["hidden_states"])}

        handle = blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True)
    else:

        def hook(_m: nn.Module, _args: tuple, out: Any) -> Any:
            if isinstance(out, Tensor):
                return tap(out)
            if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
                return (tap(out[0]), *out[1:])
            raise TypeError(f"Cannot tap a decoder block output of type {type(out)}")

        handle = blocks[index - 1].register_forward_hook(hook)
    try:
        yield tap
    finally:
        handle.remove()


# ---------------------------------------------------------------------- the comparison
def compare_completeness(
    model: nn.Module,
    inputs: Tensor,
    target: Optional[int] = None,
    position: int = -1,
    layers: LayerSpec = None,
    baselines: Union[None, int, Tensor] = None,
    n_steps: int = 20,
    additional_forward_args: Optional[Tensor] = None,
    methods: Optional[Sequence[str]] = None,
    lens_baseline: BaselineSpec = "mean",
    gradient_method: str = "gausslegendre",
    captum_method: str = "gausslegendre",
    internal_batch_size: Optional[int] = None,
    tokenizer: Any = None,
) -> CompletenessReport:
    r"""Run IG-Lens and Captum's layer methods on the same prediction and compare completeness.

    All methods explain the probability (not the logit) of the same ``target`` token at the
    same ``position`` of the same ``inputs``, over the same decoder layers:

    - ``"ig_lens"``: :class:`~captum_iglens.IGLens` (default, exact estimator); its credits
      add up to ``Δp = f(h_n) - f(b)`` (arXiv:2606.29693, Proposition 1);
    - ``"ig_lens_gradient"`` (optional): IG-Lens with the gradient estimator
      ``gradient_method`` and ``n_steps``;
    - ``"layer_integrated_gradients"``: Captum's ``LayerIntegratedGradients``, **one decoder
      layer at a time** (with a list of layers Captum's hooks cut the earlier layers out);
      each run's total is the layer's credit;
    - ``"layer_conductance"``: Captum's ``LayerConductance``, one layer at a time, through a
      forward on ``inputs_embeds`` (it interpolates float inputs);
    - ``"logit_lens"``: the logit-lens probability ``f(h_L)`` per layer (levels, no sum).

    Captum's forward functions return ``softmax(logits[:, position])[:, target]`` with
    ``use_cache=False`` and the attention mask (:func:`target_probability_forward`). Each
    Captum run hooks the residual stream itself (:func:`residual_tap`): index 0 is the input
    of the first block, index ``l`` the output of block ``l``.

    **Baseline (Captum methods)** (:func:`input_baseline_ids`). By default the baseline input
    keeps the prompt's structure and blanks its content: the first attended position, padding
    and every special token (the chat template's markers) stay, every other position becomes a
    single space token ``" "`` (with a tokenizer; else the config's BOS id);
    ``LayerConductance`` starts from that sequence's input embeddings. Why not the usual
    pad-token baseline: a pad token often has a zero embedding, which starts the path where the
    pre-norm RMSNorm's gradient is ``~1/sqrt(eps)`` and wrecks Captum's convergence (such a
    baseline raises ``ValueError``). Why not BOS everywhere: special tokens act as attention
    sinks with huge residual norms, and on SmolLM2 a BOS-everywhere path left Captum's
    convergence deltas at 0.04-0.7 where the structure-keeping baseline gives about 0.005-0.01
    at 20 steps. IG-Lens's own baseline lives in residual space (``lens_baseline``, default
    ``"mean"``), so its total ``Δp`` differs from Captum's ``F(x) - F(x')``: each method is
    measured against its *own* total.

    Args:
        model (nn.Module): A Hugging Face causal LM (eval mode is used and restored).
        inputs (Tensor): Token ids ``[1, S]`` (one sequence).
        target (int, optional): Target token id. Default: ``None``, the model's argmax at
            ``position``.
        position (int, optional): Explained position (negative counts from the end).
            Default: -1.
        layers (int, nn.Module or sequence, optional): As for :class:`~captum_iglens.IGLens`
            (hidden-state indices ``0..n`` or decoder blocks; the last block is always
            included). Default: all ``n`` blocks.
        baselines (int or Tensor, optional): Captum baseline: a filler token id (first
            attended position, padding and special tokens kept) or ids ``[1, S]`` used as
            given. Default: ``None``, the space token as filler (see above).
        n_steps (int, optional): Integration steps per Captum layer run. Default: 20.
        additional_forward_args (Tensor, optional): Attention mask ``[1, S]``. Default: ones.
        methods (sequence of str, optional): Subset of :data:`COMPARE_METHODS`, in the order
            to run. Default: IG-Lens, LayerIntegratedGradients, LayerConductance, logit lens.
        lens_baseline (str or Tensor, optional): IG-Lens's residual baseline. Default: "mean".
        gradient_method (str, optional): Estimator of ``"ig_lens_gradient"``.
            Default: "gausslegendre".
        captum_method (str, optional): Captum's approximation method. Default: "gausslegendre".
        internal_batch_size (int, optional): Passed to Captum (steps per forward chunk).
        tokenizer (optional): For the default baseline (space filler, special ids) and to
            print the target token.

    Returns:
        CompletenessReport: per method the per-layer credit ``[k]``, its sum, the method's own
        total change, the completeness gap ``|sum - total|``, Captum's convergence delta per
        layer run, and the wall time; ``to_dict()``, ``format_table()``, ``plot()``.

    Raises:
        ValueError: ``inputs`` not ``[1, S]``, an unknown method, a bad position / target,
            a baseline token with a zero embedding, ``n_steps < 2``.

    Examples::

        >>> from captum_iglens.compare import compare_completeness
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> report = compare_completeness(model, ids, layers=[0, 10, 20, 30], n_steps=16)
        >>> print(report)                         # one table, one column per method
        >>> report["ig_lens"].completeness_gap    # <= 1e-6
        >>> report["layer_integrated_gradients"].completeness_gap  # ~ (k - 1) |F(x) - F(x')|
    """
    methods = tuple(DEFAULT_COMPARE_METHODS if methods is None else methods)
    unknown = [m for m in methods if m not in COMPARE_METHODS]
    if unknown or not methods:
        raise ValueError(f"Unknown methods {unknown}: use some of {COMPARE_METHODS}.")
    if n_steps < 2:
        raise ValueError(f"n_steps must be >= 2, got {n_steps}")
    if not isinstance(inputs, Tensor) or inputs.dim() != 2 or inputs.shape[0] != 1:
        shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs)
        raise ValueError(f"inputs must be token ids of shape [1, S], got {shape}")
    device = model.get_input_embeddings().weight.device
    inputs = inputs.to(device)
    seq_len = inputs.shape[1]
    pos = position + seq_len if position < 0 else position
    if not 0 <= pos < seq_len:
        raise ValueError(f"position {position} is outside the sequence of length {seq_len}")
    mask = additional_forward_args
    if mask is None:
        mask = torch.ones_like(inputs)
    if not isinstance(mask, Tensor) or mask.shape != inputs.shape:
        raise ValueError("additional_forward_args must be an attention mask shaped like inputs")
    mask = mask.to(device)

    lens = IGLens(model, layers=layers)
    indices = list(lens.layer_indices)
    blocks = lens.decoder_blocks
    base_ids = input_baseline_ids(model, inputs, baselines, tokenizer=tokenizer,
                                  attention_mask=mask)

    with model_state_preserved(model):
        if target is None:
            with torch.no_grad():
                logits = model(input_ids=inputs, attention_mask=mask, use_cache=False).logits
            target = int(logits[0, pos].argmax())
        vocab = model.get_input_embeddings().weight.shape[0]
        if not 0 <= int(target) < vocab:
            raise ValueError(f"target {target} is outside the vocabulary (0..{vocab - 1})")
        target = int(target)
        f_ids = target_probability_forward(model, pos, target)
        f_emb = target_probability_forward(model, pos, target, inputs_embeds=True)
        with torch.no_grad():
            f_x = float(f_ids(inputs, mask)[0])
            f_b = float(f_ids(base_ids, mask)[0])

        report = CompletenessReport(
            layer_indices=indices,
            position=pos,
            target_id=target,
            target_token=tokenizer.decode([target]) if tokenizer is not None else "",
            input_ids=inputs[0].tolist(),
            baseline_ids=base_ids[0].tolist(),
            f_input=f_x,
            f_baseline=f_b,
            n_steps=n_steps,
            lens_baseline=lens_baseline if isinstance(lens_baseline, str) else "tensor",
            baseline_description=_describe_baseline(base_ids, inputs, tokenizer),
            model_name=str(getattr(getattr(model, "config", None), "_name_or_path", "")),
        )
        lens_out = None
        for name in methods:
            if name in ("ig_lens", "ig_lens_gradient", "logit_lens"):
                estimator = gradient_method if name == "ig_lens_gradient" else "prediction_aware"
                start = time.perf_counter()
                out = lens.attribute_details(
                    inputs, target=target, positions=[pos], baselines=lens_baseline,
                    additional_forward_args=mask, method=estimator, n_steps=n_steps,
                )
                elapsed = time.perf_counter() - start
                if name == "logit_lens":
                    if lens_out is not None:
                        out, elapsed = lens_out, float("nan")
                    report.methods[name] = MethodCompleteness(
                        name, _LABELS[name], out.lens_probs[0, 0].detach().cpu().float(),
                        float(out.p_final[0, 0]), None, elapsed, None, is_credit=False,
                    )
                    continue
                if name == "ig_lens":
                    lens_out = out
                report.methods[name] = MethodCompleteness(
                    name, _LABELS[name], out.attributions[0, 0].detach().cpu().float(),
                    float(out.delta_p[0, 0]),
                    out.convergence_delta[0, :1].detach().cpu().float(),
                    elapsed,
                )
                continue
            per_layer, deltas, times = [], [], []
            start = time.perf_counter()
            for index in indices:
                t0 = time.perf_counter()
                with residual_tap(blocks, index) as layer:
                    if name == "layer_integrated_gradients":
                        algo: Any = LayerIntegratedGradients(f_ids, layer)
                        x, xb = inputs, base_ids
                    else:
                        algo = LayerConductance(f_emb, layer)
                        embed = model.get_input_embeddings()
                        with torch.no_grad():
                            x, xb = embed(inputs), embed(base_ids)
                    attr, delta = algo.attribute(
                        x, baselines=xb, additional_forward_args=(mask,), n_steps=n_steps,
                        method=captum_method, internal_batch_size=internal_batch_size,
                        return_convergence_delta=True,
                    )
                if isinstance(attr, tuple):
                    attr = attr[0]
                per_layer.append(float(attr.detach().double().sum()))
                deltas.append(float(delta.detach().reshape(-1)[0]))
                times.append(time.perf_counter() - t0)
            elapsed = time.perf_counter() - start
            if name == "layer_integrated_gradients":
                total = f_x - f_b
            else:
                with torch.no_grad():
                    embed = model.get_input_embeddings()
                    total = float(f_emb(embed(inputs), mask)[0] - f_emb(embed(base_ids), mask)[0])
            report.methods[name] = MethodCompleteness(
                name, _LABELS[name], torch.tensor(per_layer, dtype=torch.float64),
                total, torch.tensor(deltas, dtype=torch.float64), elapsed, times,
            )
    return report
