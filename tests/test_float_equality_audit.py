"""No test compares floats from different computations with ``==``.

Exact float equality holds only where both sides run the very same operations on the same
values in the same order (a copy, a wrapper making the same call). Anything else (another
summation order, a float32 subtraction against a float64 one, another BLAS kernel) differs
by rounding on some machine, and the README's test command fails there. This audit reads
every test's ``assert`` statements and flags an ``==`` / ``!=`` whose operands look like
computed floats (``float(...)``, ``.item()``, a float literal, or a name from the numeric
vocabulary below) unless the line, or the comment line just above it, says why the two
sides are bitwise the same: ``# exact: <reason>``. Compare with a derived tolerance
(``tests/_tolerance.py``) or ``pytest.approx`` otherwise.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

#: Attribute / variable names that hold computed floats in this suite.
FLOAT_NAMES = frozenset({
    "total", "f_input", "f_baseline", "f_reference", "delta", "deltas", "delta_p", "credit",
    "credits", "completeness_gap", "layer_sum", "per_layer", "convergence_deltas",
    "probability", "probabilities", "prob", "probs", "change", "max_abs_convergence_delta",
})


def _is_approx(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "approx")
        or (isinstance(node.func, ast.Name) and node.func.id == "approx"))


def _terminal_name(node: ast.AST) -> str:
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _looks_float(node: ast.AST) -> bool:
    """A float literal, ``float(...)`` / ``.item()``, a numeric name, or arithmetic on one."""
    if isinstance(node, ast.UnaryOp):
        return _looks_float(node.operand)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float)
    if isinstance(node, ast.BinOp):
        return _looks_float(node.left) or _looks_float(node.right)
    if isinstance(node, ast.Call):
        return _terminal_name(node.func) in {"float", "item"}
    return _terminal_name(node) in FLOAT_NAMES


def _justified(lines: list[str], lineno: int) -> bool:
    """An ``# exact:`` comment on the line, or above the run of asserts the line is in."""
    if "# exact:" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip().startswith("assert "):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("# exact:")


def float_equalities(path: Path) -> list[str]:
    """``path:line: source`` for every unjustified ``==``/``!=`` between computed floats."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in ast.walk(node.test):
            if not isinstance(cmp, ast.Compare):
                continue
            if not any(isinstance(op, (ast.Eq, ast.NotEq)) for op in cmp.ops):
                continue
            operands = [cmp.left, *cmp.comparators]
            if any(_is_approx(o) for o in operands) or not any(_looks_float(o) for o in operands):
                continue
            if not _justified(lines, cmp.lineno):
                found.append(f"{path.name}:{cmp.lineno}: {lines[cmp.lineno - 1].strip()}")
    return found


def test_no_unjustified_float_equality() -> None:
    found = [hit for path in sorted(TESTS.glob("**/*.py")) for hit in float_equalities(path)]
    assert not found, (
        "== between computed floats (use a derived tolerance, or say why both sides are "
        "the same operations with '# exact: <reason>'):\n" + "\n".join(found))


def test_the_audit_catches_the_machine_dependent_equality(tmp_path: Path) -> None:
    # The assertion that failed on another machine: a float32 subtraction against a
    # float64 one of the same two values.
    bad = tmp_path / "test_bad.py"
    bad.write_text("def test_x(lc, report):\n"
                   "    assert lc.total == report.f_input - report.f_baseline\n"
                   "    assert float(a.sum()) == 0.25\n"
                   "    assert n_layers == 4\n"
                   "    # exact: the same call on the same tensor\n"
                   "    assert float(x) == float(y)\n"
                   "    assert float(x) != float(z)\n"
                   "    x = 1\n"
                   "    assert float(x) == 1.0\n")
    hits = float_equalities(bad)
    assert [h.split(":")[1] for h in hits] == ["2", "3", "9"]
