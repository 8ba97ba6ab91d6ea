"""The package's modules never import each other in a circle (data flows one way)."""

from __future__ import annotations

import ast
from pathlib import Path

import captum_iglens

ROOT = Path(captum_iglens.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str, modules: set[str],
             type_only: bool = False) -> set[str]:
    """Package modules imported anywhere (functions included), except under TYPE_CHECKING
    (included with ``type_only``)."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative import
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + [node.module])
            # ``from pkg import submodule`` imports the submodule; any other name comes
            # from ``pkg`` itself (its __init__).
            subs = {f"{base}.{alias.name}" for alias in node.names}
            found.update(subs & modules)
            if subs - modules:
                found.add(base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = _imports(ast.parse(path.read_text()), package, set(files), type_only)
        graph[name] = {m for m in found | _parents(found) if m in files and m != name
                       and not name.startswith(m + ".")}
    return graph


def _parents(modules: set[str]) -> set[str]:
    """The packages whose ``__init__`` Python runs before a module: ``a.b.c`` -> ``a.b``.

    The root package is left out: a module inside it is already past its ``__init__``."""
    return {".".join(m.split(".")[:i]) for m in modules for i in range(2, m.count(".") + 1)}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_detector_finds_a_planted_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    graph = _graph()
    assert "captum_iglens.ig_lens" in graph and graph["captum_iglens.ig_lens"]
    cycle = _cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_no_import_circle_through_type_only_imports() -> None:
    # a TYPE_CHECKING import that closes a circle is a circle the type checker sees: the
    # shared type belongs below both (lens.changes.BuiltLens, _utils.views)
    cycle = _cycle(_graph(type_only=True))
    assert not cycle, "type-only import circle: " + " -> ".join(cycle)


def test_importing_a_subpackage_module_counts_its_package_init() -> None:
    # plot -> results.explanation runs results/__init__ first: a circle through an __init__
    # that a module-by-module graph missed
    assert _parents({"captum_iglens.results.explanation"}) == {"captum_iglens.results"}
    graph = {"p.plot": {"p.results.explanation"} | _parents({"p.results.explanation"}),
             "p.results": {"p.plot"}, "p.results.explanation": set()}
    assert _cycle(graph) == ["p.plot", "p.results", "p.plot"]


def test_help_and_summarize_import_neither_torch_nor_captum() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom captum_iglens.cli import main\n"
            "for argv in (['--help'], ['summarize', '--help'], ['run', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'captum', 'transformers', 'scipy', 'matplotlib')"
            " if m in sys.modules]\nprint('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "HEAVY []" in out, out[-500:]


def test_settings_agree_with_the_registries() -> None:
    from captum.attr._utils.approximation_methods import SUPPORTED_METHODS

    from captum_iglens import settings
    from captum_iglens._core.baselines import BASELINES
    from captum_iglens._core.estimators import METHODS, UNITS

    assert set(settings.CAPTUM_METHODS) == set(SUPPORTED_METHODS)
    assert set(settings.METHODS) == set(METHODS) and settings.UNITS == UNITS
    assert settings.BASELINES == BASELINES


#: The one-way order of the package's parts: a part imports only parts of its rank or lower.
RANKS = {
    **dict.fromkeys(("_utils", "settings", "results", "plot"), 0),
    "lens": 1, "models": 1, "_core": 2, "ig_lens": 3, "text": 4,
    **dict.fromkeys(("llm_attr", "run", "validate", "compare", "testing"), 5),
    "summary": 6, "cli": 7, "__main__": 8,
}


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else "__main__"  # the root: top rank


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in graph.items() for b in deps
                  if _part(a) in RANKS and _part(b) in RANKS
                  and RANKS[_part(b)] > RANKS[_part(a)])


def test_every_part_of_the_package_has_a_rank() -> None:
    # A new top-level module or subpackage must be placed in the order (old paths kept as
    # deprecated aliases are the exception: they import their new home and nothing else).
    parts = {_part(m) for m in _graph()} - {"__main__"}
    aliases = {p.stem for p in ROOT.glob("*.py")
               if "alias" in p.read_text() and "Deprecated path" in p.read_text()}
    assert parts - set(RANKS) - aliases == set()


def test_data_flows_one_way() -> None:
    assert _upward(_graph()) == []


def test_one_way_check_finds_an_upward_import() -> None:
    assert _upward({"p.results.x": {"p.text.y"}, "p.text.y": {"p.results.x"}}) == [
        ("p.results.x", "p.text.y")]
