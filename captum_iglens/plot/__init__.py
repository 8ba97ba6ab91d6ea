"""Figures of IG-Lens results: credit heatmaps, trajectories, completeness, top-K.

The public names of ``captum_iglens.plot`` are imported on first use (PEP 562)
from :mod:`captum_iglens.plot.credits`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = ['plot_result', 'plot_heatmap', 'plot_completeness', 'plot_top_k', 'result_to_captum']

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.plot.credits", __all__)
