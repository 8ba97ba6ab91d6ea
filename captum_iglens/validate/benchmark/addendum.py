"""The lens addendum of the pre-registration: ``prereg_lenses.json``, read like ``prereg.json``.

The addendum (issue 31) pre-states two predictors, the readout credit under a tuned lens and
under a Jacobian lens, and two hypotheses, L1 and L2, with their own Bonferroni correction.
Every number it does not state is the pre-registration's (statistics, seeds, views, units,
tasks, families). :func:`load_lens_addendum` reads the shipped file, checks that it extends
the shipped ``prereg.json`` (by its SHA-256) and returns a
:class:`~captum_iglens.validate.benchmark.decide.Preregistration` whose ``data`` is
``prereg.json``'s with the addendum's hypotheses (and predictors added): the verdict code
(:func:`~captum_iglens.validate.benchmark.decide.decide`) applies the same rule at
``alpha / 18``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from captum_iglens.validate.benchmark.decide import (
    Preregistration,
    _freeze,
    load_preregistration,
)

__all__ = ["LensAddendum", "lens_predictor", "load_lens_addendum"]

_PACKAGE = "captum_iglens.validate.benchmark"
_FILE = "prereg_lenses.json"


@dataclass(frozen=True)
class LensAddendum(Preregistration):
    """The pre-registration as the addendum extends it.

    Attributes:
        data (mapping): ``prereg.json``'s object with ``hypotheses`` the addendum's (L1, L2),
            ``predictors`` extended by the addendum's and ``addendum`` the addendum's object.
        sha256 (str): SHA-256 (hex) of the addendum's bytes.
        source (str): Where they came from.
        base_sha256 (str): SHA-256 of the ``prereg.json`` it extends.
    """

    base_sha256: str = ""

    @property
    def addendum(self) -> Mapping[str, Any]:
        """The addendum's own object (read-only)."""
        return self.data["addendum"]


def load_lens_addendum(path: Union[str, Path, None] = None,
                       base: Optional[Preregistration] = None) -> LensAddendum:
    """Read the lens addendum: the package's ``prereg_lenses.json``, or another file.

    Args:
        path (str or Path, optional): A JSON file of the same schema. Default: the shipped
            file.
        base (Preregistration, optional): The pre-registration it extends. Default:
            :func:`~captum_iglens.validate.benchmark.decide.load_preregistration`.

    Returns:
        LensAddendum: frozen, with the SHA-256 of the bytes read.

    Raises:
        ValueError: not a JSON object, a key missing, an ``extends.sha256`` that is not the
            base's, a hypothesis naming a predictor neither file names, or ``n_cells`` not
            hypotheses x tasks x required families.
    """
    base = load_preregistration() if base is None else base
    if path is None:
        raw = (resources.files(_PACKAGE) / _FILE).read_bytes()
        source = f"{_PACKAGE}/{_FILE}"
    else:
        raw, source = Path(path).read_bytes(), str(path)
    data = json.loads(raw.decode("utf-8"))
    missing = [k for k in ("date", "written", "extends", "predictors", "hypotheses", "decision")
               if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{source}: not a lens addendum (missing {', '.join(missing)}).")
    if data["extends"].get("sha256") != base.sha256:
        raise ValueError(f"{source} extends a prereg.json with SHA-256 "
                         f"{data['extends'].get('sha256')}, not {base.source} ({base.sha256}).")
    merged = base.to_dict()
    merged["predictors"] = merged["predictors"] + list(data["predictors"])
    merged["hypotheses"] = list(data["hypotheses"])
    merged["addendum"] = data
    names = {p["name"] for p in merged["predictors"]}
    for h in data["hypotheses"]:
        if h["predictor"] not in names or h["versus"] not in names:
            raise ValueError(f"{source}: hypothesis {h['id']} names a predictor neither file "
                             "states.")
    out = LensAddendum(_freeze(merged), hashlib.sha256(raw).hexdigest(), source, base.sha256)
    if int(data["decision"].get("n_cells", -1)) != out.n_cells:
        raise ValueError(f"{source}: decision.n_cells is {data['decision'].get('n_cells')}, "
                         f"but its hypotheses x tasks x required families are {out.n_cells}.")
    return out


def lens_predictor(addendum: LensAddendum, kind: str) -> Mapping[str, Any]:
    """The addendum's predictor of a lens ``kind`` (``"tuned"``, ``"jacobian"``).

    Raises:
        ValueError: a kind the addendum does not pre-state.
    """
    for p in addendum.addendum["predictors"]:
        if p["kind"] == kind:
            return p
    kinds = [p["kind"] for p in addendum.addendum["predictors"]]
    raise ValueError(f"lens kind {kind!r}: the addendum pre-states {', '.join(kinds)} only.")
