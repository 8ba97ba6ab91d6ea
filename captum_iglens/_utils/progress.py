"""Progress bars for long work: tqdm on stderr, shown only once a step runs for a while.

Every loop that can take more than a few seconds (the gradient estimators' readout chunks,
Captum's layer runs in a comparison, document chunks, dataset records, validation) draws
its bar through :func:`progress_bar`. A bar appears only after :data:`DELAY_S` seconds, so
quick calls print nothing; :func:`progress_bars` switches every bar off (or on) for a block
of code (the CLI's ``--no-progress``), without threading a flag through each function.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterable, Iterator, Optional

from tqdm.auto import tqdm

__all__ = ["DELAY_S", "progress_bar", "progress_bars", "progress_enabled"]

#: Seconds a bar waits before it first draws (tqdm's ``delay``): shorter work shows nothing.
DELAY_S = 2.0

_ENABLED: ContextVar[bool] = ContextVar("captum_iglens_progress", default=True)


def progress_enabled() -> bool:
    """Whether progress bars are on in this context (default: on)."""
    return _ENABLED.get()


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Switch every progress bar of the package on or off inside the ``with`` block.

    Args:
        enabled (bool): ``False`` silences every bar (e.g. ``--no-progress``, logs).

    Examples::

        >>> with progress_bars(False):
        ...     lens.attribute(ids, method="gausslegendre", n_steps=256)
    """
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def progress_bar(iterable: Optional[Iterable[Any]] = None, *, total: Optional[int] = None,
                 desc: str, unit: str, enabled: bool = True, leave: bool = False) -> tqdm:
    """A tqdm bar on stderr that draws after :data:`DELAY_S` seconds, if bars are on.

    Args:
        iterable (iterable, optional): What to iterate over, as for ``tqdm``.
        total (int, optional): The number of steps (``bar.update(n)`` counts them).
        desc (str): What the work is, e.g. ``"gausslegendre readouts"``.
        unit (str): What one step is, e.g. ``"row"`` or ``"layer"``.
        enabled (bool, optional): ``False`` hides this bar whatever the context says.
            Default: True.
        leave (bool, optional): Keep the finished bar on screen. Default: False.

    Returns:
        tqdm: the bar (a context manager and an iterator).
    """
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave,
                delay=DELAY_S, disable=not (enabled and progress_enabled()))
