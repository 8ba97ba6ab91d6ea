"""Sphinx configuration of the captum_iglens documentation (offline: no intersphinx, no fetch).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout, not whatever is installed

from captum_iglens import __version__  # noqa: E402

project = "captum_iglens"
author = "the captum_iglens developers"
copyright = "2026, the captum_iglens developers"  # noqa: A001 (Sphinx's name)
version = release = __version__

extensions = [
    "myst_parser",  # the pages are Markdown (MyST)
    "sphinx.ext.autodoc",  # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # which are Google style
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# MyST: `#`-headings get anchors for links such as [x](cli.md#exit-status)
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# autodoc: members in the source order, every public name of a module's __all__
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# offline: no intersphinx inventories, no remote images, no link checks
intersphinx_mapping: dict = {}

html_theme = "alabaster"
html_static_path = ["_static"]
html_title = f"captum_iglens {__version__}"


# ---- every public name documented: the API page must cover each __all__ (else a warning,
# an error under -W). The public packages are the root and its subpackages with an __all__.
PUBLIC_PACKAGES = ["captum_iglens", "captum_iglens.results", "captum_iglens.text",
                   "captum_iglens.run", "captum_iglens.summary", "captum_iglens.compare",
                   "captum_iglens.validate", "captum_iglens.models", "captum_iglens.plot",
                   "captum_iglens.testing", "captum_iglens.cli", "captum_iglens.testing.plugin"]


def _documented(env) -> dict[str, set[str]]:  # noqa: ANN001
    """Page -> the names autodoc documented there, kept in the environment across builds."""
    if not hasattr(env, "iglens_documented"):
        env.iglens_documented = {}
    return env.iglens_documented


def _forget(app, env, docname) -> None:  # noqa: ANN001
    """A page about to be read again documents its names anew."""
    _documented(env).pop(docname, None)


def _record(app, what, name, obj, options, lines) -> None:  # noqa: ANN001
    """Note each documented name; give a re-exported constant its ``#:`` comment."""
    _documented(app.env).setdefault(app.env.docname, set()).add(name)
    if what == "data" and lines and getattr(obj, "__doc__", None) == type(obj).__doc__:
        lines[:] = _doc_comment(name.rpartition(".")[2], obj)  # not dict's or tuple's own doc


def _doc_comment(name: str, obj: object) -> list[str]:
    """The ``#:`` comment of ``name`` in the package module that defines ``obj`` under it."""
    from sphinx.pycode import ModuleAnalyzer

    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("captum_iglens") or getattr(module, name, None) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # noqa: BLE001 (a module without source: keep looking)
            continue
        if ("", name) in docs:
            return list(docs["", name])
    return []


def _check_public_names(app, env) -> None:  # noqa: ANN001
    """Warn for each public name that api.md neither documents nor shows as an alias."""
    import importlib

    from sphinx.util import logging

    def resolve(dotted: str) -> object:
        module, _, name = dotted.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name, None)
        except (ImportError, ValueError):  # a class member, or a package itself
            return None

    names = set().union(*_documented(env).values())
    documented = {id(resolve(name)) for name in names} - {id(None)}
    missing = [f"{package}.{name}" for package in PUBLIC_PACKAGES
               for name in importlib.import_module(package).__all__
               if f"{package}.{name}" not in names
               and id(getattr(importlib.import_module(package), name)) not in documented]
    if missing:
        logging.getLogger(__name__).warning(
            "api.md documents no entry for these public names: %s", ", ".join(missing))


def setup(app) -> None:  # noqa: ANN001
    """Connect the public-name check."""
    app.connect("env-purge-doc", _forget)
    app.connect("autodoc-process-docstring", _record)
    app.connect("env-check-consistency", _check_public_names)
