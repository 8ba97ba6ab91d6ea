"""Dataset runs: records in, one results line out per record; resumable and sharded.

The public names of ``captum_iglens.run`` are imported on first use (PEP 562) from
:mod:`captum_iglens.run.runner` and :mod:`captum_iglens.run.settings`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = ["RunReport", "RunSettings", "run_records"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "RunReport": "captum_iglens.run.settings",
    "RunSettings": "captum_iglens.run.settings",
    "run_records": "captum_iglens.run.runner",
})
