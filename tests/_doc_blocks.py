"""The ```python blocks of a Markdown page, and the names a block reads before binding them.

Shared by tests/test_readme.py and tests/test_docs.py. A block's test mode is set by an HTML
comment on the line just before its fence (invisible in the rendered page):

- ``<!-- test: slow -->``: executed by the slow tests (it loads SmolLM2 or runs Captum on it);
- ``<!-- test: skip -->``: compiled and name-checked only (it needs a model that is installed
  separately, or is a fragment of a larger program);
- no comment: executed by the fast tests (tiny models or pure Python).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^(?:<!-- test: (?P<mode>slow|skip) -->\n)?```python\n(?P<code>.*?)^```",
                    flags=re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One ```python block: its first code line (1-based), its code and its test mode."""

    line: int
    code: str
    mode: str  # "fast", "slow" or "skip"


def python_blocks(text: str) -> list[Block]:
    """Every fenced ```python block of ``text``, in order."""
    return [Block(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("mode")
                  or "fast") for m in _FENCE.finditer(text)]


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
