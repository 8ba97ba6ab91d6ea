"""Module paths that README.md, the docs pages and the tutorials name keep working after the move.

CHANGELOG.md is left out: it names removed paths too."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import captum_iglens

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(captum_iglens.__file__).parent
ALIASES = sorted(p.stem for p in PACKAGE.glob("*.py") if "Deprecated path" in p.read_text())
DOTTED = re.compile(r"captum_iglens(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _named_paths() -> list[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "tutorials").glob("*.ipynb")),
             *sorted((ROOT / "tutorials").glob("*.py"))]
    return sorted({m.group(0) for p in texts for m in DOTTED.finditer(p.read_text())})


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then follow the attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_old_paths_are_the_aliases_kept() -> None:
    # exactly the module paths README.md and the tutorials named before the layout move
    assert set(ALIASES) == {"ablation", "architectures", "batched", "document", "fingerprint",
                            "generation", "patching", "readout", "records", "validate_tables",
                            "validate_verdict"}


@pytest.mark.parametrize("dotted", _named_paths())
def test_every_path_named_in_the_docs_resolves(dotted: str) -> None:
    assert _resolve(dotted) is not None


def test_each_old_path_warns_once_and_gives_the_new_modules_names() -> None:
    # one fresh interpreter: a module warns when it is first imported
    code = (
        "import importlib, sys, warnings\n"
        "for old in sys.argv[1:]:\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module('captum_iglens.' + old)\n"
        "    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)\n"
        "             and 'moved to' in str(w.message)]\n"
        "    assert len(moved) == 1, (old, [str(w.message) for w in caught])\n"
        "    names = getattr(module, '__all__', None)\n"
        "    assert names and all(hasattr(module, n) for n in names), old\n"
        "    print(old, module.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *ALIASES], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    homes = dict(line.split() for line in out.stdout.splitlines())
    assert set(homes) == set(ALIASES)
    # an alias is the new module itself (so a monkeypatch of the old path reaches it)
    assert all(homes[old] != f"captum_iglens.{old}" for old in ALIASES if old != "architectures")
