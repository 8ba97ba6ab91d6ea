"""README.md: every ```python block runs on its own, and what it says `--plot` writes.

Running the blocks would load SmolLM2 and attribute with Captum (minutes), so each block is
compiled and its names are resolved statically: every name it reads must be a builtin or be
bound earlier in the same block (an import, an assignment, a ``def``, a loop target).
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

from captum_iglens.cli.explain import _write_plots

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, code)`` of each fenced ```python block."""
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


def _bound(node: ast.AST) -> set[str]:
    """Names that ``node`` binds anywhere inside it (all scopes)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(sub.name)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.alias):
            names.add((sub.asname or sub.name).split(".")[0])
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.add(sub.name)
    return names


def free_names(code: str) -> list[str]:
    """Names read by a top-level statement before the block binds them, builtins aside.

    Names a statement binds itself (a function's arguments, a comprehension's target)
    count as bound within that statement.
    """
    known = set(dir(builtins))
    free: list[str] = []
    for statement in ast.parse(code).body:
        local = _bound(statement)
        for sub in ast.walk(statement):
            if (isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)
                    and sub.id not in known and sub.id not in local and sub.id not in free):
                free.append(sub.id)
        known |= local
    return free


def test_free_names_finds_what_a_block_lacks() -> None:
    """The check itself: names read before any binding are found, bound ones are not."""
    assert free_names("print(report.plot())") == ["report"]
    assert free_names("import torch\nx = torch.ones(2)\nprint(x, len(x))") == []
    assert free_names("y = x + 1\nx = 2") == ["x"]  # bound too late
    assert free_names("def f(a):\n    return a + b\n") == ["b"]
    assert free_names("s = [i * i for i in range(3)]") == []


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_has_its_python_blocks() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_each_readme_block_is_self_contained(line: int, code: str) -> None:
    compile(code, f"README.md:{line}", "exec")
    assert free_names(code) == [], f"README.md block at line {line} needs earlier blocks"


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
def test_plot_paths_are_the_ones_the_readme_names(tmp_path, capsys, n, names) -> None:
    written: list[str] = []
    _write_plots([_Figure(written) for _ in range(n)], str(tmp_path / "fig.png"))
    capsys.readouterr()
    assert written == names
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "`PATH` itself for a single prompt" in text
    assert "`--plot fig.png` writes `fig-0.png`, `fig-1.png`" in text
