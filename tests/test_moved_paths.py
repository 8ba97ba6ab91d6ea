"""Module paths named in README.md, the docs pages and the tutorials resolve; removed ones do not.

CHANGELOG.md is left out: it names removed paths too."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import captum_iglens
from captum_iglens._utils.lazy import alias_module

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(captum_iglens.__file__).parent
DOTTED = re.compile(r"captum_iglens(?:\.[A-Za-z_][A-Za-z0-9_]*)+")

#: The module paths of the layout before 0.2.0, deprecated aliases in 0.2.0, removed in 0.3.0.
REMOVED = ("ablation", "architectures", "batched", "document", "fingerprint", "generation",
           "patching", "readout", "records", "validate_tables", "validate_verdict")


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


@pytest.mark.parametrize("dotted", _named_paths())
def test_every_path_named_in_the_docs_resolves(dotted: str) -> None:
    assert _resolve(dotted) is not None


def test_no_deprecated_alias_module_is_left() -> None:
    assert not [p.name for p in PACKAGE.rglob("*.py") if "Deprecated path" in p.read_text()]


def test_the_removed_paths_do_not_import() -> None:
    # one fresh interpreter: nothing imported before can stand in for a removed module
    # (an editable install of another checkout maps module names to its own files: its
    # finder is dropped, so the package under test answers)
    code = (
        "import importlib, sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        "import captum_iglens\n"
        f"assert captum_iglens.__file__ == {str(PACKAGE / '__init__.py')!r}\n"
        "for old in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module('captum_iglens.' + old)\n"
        "    except ModuleNotFoundError as error:\n"
        "        assert error.name == 'captum_iglens.' + old, (old, error.name)\n"
        "    else:\n"
        "        raise AssertionError(old + ' still imports')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *REMOVED], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_an_alias_module_warns_once_and_is_the_new_module(monkeypatch) -> None:
    """The tool the deprecation policy keeps for the next moved path."""
    import captum_iglens.settings as new

    monkeypatch.delitem(sys.modules, "captum_iglens._moved_for_test", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias_module("captum_iglens._moved_for_test", "captum_iglens.settings")
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        "captum_iglens._moved_for_test moved to captum_iglens.settings; import it from there "
        "(this alias will be removed)"]
    assert sys.modules["captum_iglens._moved_for_test"] is new


def test_cli_error_is_a_deprecated_name_of_usage_error() -> None:
    import captum_iglens.cli as cli

    with pytest.warns(DeprecationWarning, match="CliError is now captum_iglens.cli.UsageError"):
        old = cli.CliError
    assert old is cli.UsageError
    assert "CliError" not in cli.__all__
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        cli.NoSuchName  # noqa: B018


def test_the_packages_own_deprecation_warnings_are_errors_in_the_suite() -> None:
    """pytest.ini: raised from a package module, or naming the package, it fails the test."""
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old name", DeprecationWarning, "x.py", 1,
                               module="captum_iglens.lens.spec")
    with pytest.raises(DeprecationWarning):
        warnings.warn("captum_iglens.cli.Old is now New", DeprecationWarning, stacklevel=1)
    # a third party's stays ignored
    warnings.warn_explicit("old name", DeprecationWarning, "x.py", 1, module="transformers.x")
