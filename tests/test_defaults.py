"""Each default is written once, in captum_iglens.settings: no signature, dataclass field or
``.get(key, default)`` elsewhere repeats a default's value as a literal."""

from __future__ import annotations

import ast
from pathlib import Path

import captum_iglens
from captum_iglens import settings

PACKAGE = Path(captum_iglens.__file__).parent
#: argument or field name -> the default it must take from settings
DEFAULTS = {
    "method": settings.DEFAULT_METHOD, "n_steps": settings.DEFAULT_N_STEPS,
    "baselines": settings.DEFAULT_BASELINE, "baseline": settings.DEFAULT_BASELINE,
    "units": settings.DEFAULT_UNITS, "onset_frac": settings.DEFAULT_ONSET_FRAC,
    "frac": settings.DEFAULT_ONSET_FRAC, "onset_rule": settings.DEFAULT_ONSET_RULE,
    "rule": settings.DEFAULT_ONSET_RULE, "max_new_tokens": settings.DEFAULT_MAX_NEW_TOKENS,
    "granularity": settings.DEFAULT_GRANULARITY, "donors": settings.VALIDATE_DONORS,
    "scope": settings.DEFAULT_SCOPE,
}


def _literal_defaults(tree: ast.AST) -> list[tuple[int, str, object]]:
    found = []
    for node in ast.walk(tree):
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs += list(zip([a.arg for a in positional[len(positional) - len(args.defaults):]],
                              args.defaults, strict=True))
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                      if d]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            pairs.append((node.target.id, node.value))  # dataclass fields
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and len(node.args) == 2
              and isinstance(node.args[0], ast.Constant)):
            pairs.append((node.args[0].value, node.args[1]))
        for name, value in pairs:
            if (name in DEFAULTS and isinstance(value, ast.Constant)
                    and not isinstance(value.value, bool) and value.value == DEFAULTS[name]):
                found.append((value.lineno, name, value.value))
    return found


def _repeated() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "settings.py":
            continue
        for line, name, value in _literal_defaults(ast.parse(path.read_text())):
            out.append(f"{path.relative_to(PACKAGE)}:{line}: {name}={value!r}")
    return out


def test_each_default_is_written_once_in_settings() -> None:
    assert _repeated() == []


def test_the_check_finds_a_repeated_default() -> None:
    planted = ast.parse("def f(x, n_steps: int = 50, *, method='prediction_aware'):\n"
                        "    return d.get('onset_rule', 'sustained')\n"
                        "def g(n_steps=DEFAULT_N_STEPS, top_k=50):\n    pass\n")
    assert [(n, v) for _, n, v in _literal_defaults(planted)] == [
        ("n_steps", 50), ("method", "prediction_aware"), ("onset_rule", "sustained")]
