"""Summaries of a results file: pooled credits, onsets, report, plots, HTML.

The public names of ``captum_iglens.summary`` are imported on first use (PEP 562)
from :mod:`captum_iglens.summary.pool`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = ['N_SLOWEST', 'RunSummary', 'load_results', 'summarize']

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.summary.pool", __all__)
