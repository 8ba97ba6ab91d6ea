"""Public names imported on first use (PEP 562), and aliases of moved module paths.

Importing a package (``iglens --help``, ``iglens summarize``) then imports neither torch
nor Captum.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, Sequence, Union


def lazy_exports(
    package: str, source: Union[str, Mapping[str, str]], names: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for names defined in its submodules.

    Args:
        package (str): The package's ``__name__``.
        source (str or mapping): The module that defines every name in ``names``, or a
            mapping from each public name to the module that defines it.
        names (sequence of str): The public names when ``source`` is one module.

    Returns:
        ``(__getattr__, __dir__)``: assign them at the package's top level. A name is
        imported from its module on first access and cached in the package's namespace.

    Raises:
        AttributeError: (from ``__getattr__``) the name is not a public name of the package.
    """
    where = dict.fromkeys(names, source) if isinstance(source, str) else dict(source)
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__


def alias_module(old: str, new: str) -> None:
    """Make the module ``old`` (a path that moved) an alias of the module ``new``.

    Called from the one-line module left at a moved module's old path: it warns once with a
    ``DeprecationWarning`` and replaces itself in ``sys.modules`` with ``new``, so that every
    name (and any monkeypatch) of the old path is the new module's.
    """
    import sys
    import warnings

    warnings.warn(f"{old} moved to {new}; import it from there (this alias will be removed)",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
