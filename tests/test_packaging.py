"""The sdist and the wheel ship what users and the test suite need; the metadata is one source.

Building the sdist or the wheel takes about a second each: setup.py's ``sdist`` /
``bdist_wheel`` into ``tmp_path`` (``egg_info`` and ``build`` there too, so the checkout is
left alone); the metadata itself lives in pyproject.toml (setup.py is a shim). ``python -m
build`` (isolated, from the package registry) runs in .ci/run.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ["conftest.py", "tiny_families.py", "_tolerance.py", "tiny_tokenizer.py",
           "_doc_blocks.py"]


def pyproject() -> dict:
    """pyproject.toml, parsed (tomllib: Python 3.11+; tomli where installed on 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


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
    for path in ("pytest.ini", "README.md", "LICENSE", "setup.py", "pyproject.toml",
                 "CHANGELOG.md", "captum_iglens/py.typed", "docs/conf.py", "docs/index.md",
                 "docs/_static/vietnam.png", "captum_iglens/data/validation_prompts.jsonl",
                 "captum_iglens/validate/benchmark/prereg.json",
                 "captum_iglens/validate/benchmark/prereg_lenses.json"):
        assert path in sdist_files, path
    notebooks = {f"tutorials/{p.name}" for p in (ROOT / "tutorials").glob("*.ipynb")}
    assert notebooks and notebooks <= sdist_files  # tests/test_tutorials.py runs them
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and pages <= sdist_files  # tests/test_docs.py runs their examples


def test_sdist_ships_every_module(sdist_files) -> None:
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "captum_iglens").rglob("*.py")}
    assert modules and not modules - sdist_files, sorted(modules - sdist_files)


def test_license_is_bsd_3_clause_and_declared() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, the captum_iglens developers" in text
    assert "Neither the name of the copyright holder nor the names of its" in text
    project = pyproject()["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from this checkout without touching it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out),
                    "build", "--build-base", str(out / "build"), "bdist_wheel",
                    "--dist-dir", str(out), "--bdist-dir", str(out / "bdist")],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    (path,) = out.glob("captum_iglens-*.whl")
    return path


def test_the_version_has_one_source() -> None:
    import captum_iglens

    config = pyproject()
    assert config["project"]["dynamic"] == ["version"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "captum_iglens.__version__"}
    assert captum_iglens.__version__ == "0.3.0.dev0"
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    release = captum_iglens.__version__.split(".dev")[0]
    if release == captum_iglens.__version__:
        assert f"## [{release}]" in changelog  # every release has its section
    else:  # a development version: its changes gather under [Unreleased]
        assert "## [Unreleased]" in changelog and f"## [{release}]" not in changelog
    assert "version=" not in (ROOT / "setup.py").read_text(encoding="utf-8")


def test_the_wheel_ships_py_typed_the_data_and_the_entry_points(wheel) -> None:
    import captum_iglens

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"captum_iglens-{captum_iglens.__version__}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "captum_iglens").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert {"captum_iglens/py.typed", "captum_iglens/data/validation_prompts.jsonl",
            "captum_iglens/data/patching_pairs.jsonl",
            "captum_iglens/validate/benchmark/prereg.json",
            "captum_iglens/validate/benchmark/prereg_lenses.json"} <= names
    assert not any(name.startswith(("tests/", "docs/")) for name in names)
    assert metadata["Version"] == captum_iglens.__version__
    assert metadata["License-Expression"] == "BSD-3-Clause"
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"test", "docs", "tutorials", "qwen-coder-0-5b", "qwen-coder-1-5b"} <= extras
    assert "iglens = captum_iglens.cli:main" in entry_points
    assert "[pytest11]\niglens = captum_iglens.testing.plugin" in entry_points


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_with_py_typed(wheel, tmp_path) -> None:
    """``pip install`` of the wheel (no dependencies) in a new venv: py.typed, version, data."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = ("import importlib.resources as r, captum_iglens as c; "
            "print(c.__version__, r.files('captum_iglens').joinpath('py.typed').is_file(), "
            "c.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout.split()
    import captum_iglens

    assert out[:2] == [captum_iglens.__version__, "True"]
    assert out[2].startswith(str(venv))  # the installed copy, not this checkout


def test_the_pytest_plugin_costs_nothing_where_unused(tmp_path) -> None:
    """``pytest --help`` in a project that uses none of the plugin imports no torch stack.

    The plugin is registered under ``pytest11``, so pytest loads it in every session; the
    project's conftest writes ``sys.modules`` at exit, in the same process.
    """
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "conftest.py").write_text(
        "import atexit, sys\n\n\n"
        "def _dump():\n"
        "    with open('modules.txt', 'w') as f:\n"
        "        f.write('\\n'.join(sorted(sys.modules)))\n\n\n"
        "atexit.register(_dump)\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "--iglens-families" in out.stdout  # the plugin was loaded
    modules = set((tmp_path / "modules.txt").read_text(encoding="utf-8").split())
    assert "captum_iglens.testing.plugin" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in {"torch", "transformers", "captum"})
    assert not heavy, heavy[:10]


def test_the_type_checker_runs_in_ci_with_its_stated_strictness() -> None:
    config = pyproject()["tool"]["mypy"]
    assert config["files"] == ["captum_iglens"]
    for flag in ("disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs"):
        assert config[flag] is True, flag
    assert not pyproject()["tool"]["mypy"].get("overrides")  # the same strictness everywhere
    assert any(dep.startswith("mypy") for dep in pyproject()["project"]["optional-dependencies"]
               ["test"])
    steps = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert steps.index("python -m mypy captum_iglens") > steps.index(
        "python -m ruff check captum_iglens tests benchmarks tutorials")
