"""The source distribution ships what its test suite needs, and the licence it declares.

Building the sdist takes about a second: setup.py's ``sdist`` into ``tmp_path`` (its
``egg_info`` too, so the checkout's own ``captum_iglens.egg-info`` is left alone).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ["conftest.py", "tiny_families.py", "_tolerance.py", "tiny_tokenizer.py"]


@pytest.fixture(scope="module")
def sdist_files(tmp_path_factory) -> set[str]:
    """Paths inside the sdist, relative to its top folder."""
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out),
                    "sdist", "--dist-dir", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    (archive,) = out.glob("captum_iglens-*.tar.gz")
    with tarfile.open(archive) as tar:
        return {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}


def test_sdist_ships_the_tests_and_what_they_need(sdist_files) -> None:
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py")}
    assert {f"tests/{name}" for name in HELPERS} <= tests  # the helpers are in this checkout
    missing = tests - sdist_files
    assert not missing, sorted(missing)
    for path in ("pytest.ini", "README.md", "LICENSE", "setup.py",
                 "captum_iglens/data/validation_prompts.jsonl"):
        assert path in sdist_files, path
    notebooks = {f"tutorials/{p.name}" for p in (ROOT / "tutorials").glob("*.ipynb")}
    assert notebooks and notebooks <= sdist_files  # tests/test_tutorials.py runs them


def test_sdist_ships_every_module(sdist_files) -> None:
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "captum_iglens").rglob("*.py")}
    assert modules and not modules - sdist_files, sorted(modules - sdist_files)


def test_license_is_bsd_3_clause_and_declared() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the captum_iglens developers" in text
    assert "Neither the name of the copyright holder nor the names of its" in text
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert 'license="BSD-3-Clause"' in setup and 'license_files=["LICENSE"]' in setup
