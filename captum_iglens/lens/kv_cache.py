"""KV caches: read a forward's keys and values per block, and build a cache from them.

One home for the cache mechanics that position-local forwards need (the block ablation of
:mod:`captum_iglens.validate` and the total-effect gates of :mod:`captum_iglens._core`): a
causal model leaves the positions before ``i`` unchanged when only position ``i`` changes, so
position ``i`` can be recomputed alone, attending to the clean prefix's cached keys and values.
"""

from __future__ import annotations

import inspect

from torch import Tensor

__all__ = ["cache_tensors", "make_cache"]


def cache_tensors(cache: object) -> list[tuple[Tensor, Tensor]]:
    """Per block ``(keys, values)``, each ``[B, heads, S, head_dim]``, of a cache.

    Reads transformers' ``Cache.layers``, the older ``key_cache`` lists, or legacy tuples.

    Raises:
        TypeError: for any other cache object.
    """
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache, strict=True))  # type: ignore[attr-defined]
    if isinstance(cache, (tuple, list)):
        return [(kv[0], kv[1]) for kv in cache]
    raise TypeError(f"Cannot read keys and values from a cache of type {type(cache)}")


def make_cache(kv: list[tuple[Tensor, Tensor]]) -> object:
    """A fresh ``DynamicCache`` holding ``kv`` (per block ``(keys, values)``).

    The forward that uses it appends to new tensors, so ``kv`` itself is never modified.
    """
    from transformers import DynamicCache

    if "ddp_cache_data" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(ddp_cache_data=kv)
    return DynamicCache.from_legacy_cache(tuple(kv))  # type: ignore[attr-defined]  # transformers < 4.53
