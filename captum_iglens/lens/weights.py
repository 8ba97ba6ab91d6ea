"""A content hash of a model's weights (what a fitted lens and a run fingerprint are keyed by)."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from captum_iglens.lens.architectures import unwrap_model

__all__ = ["weights_digest"]


def weights_digest(model: nn.Module) -> str:
    """A content hash of the model's parameters and persistent buffers (BLAKE2b, 16 hex).

    Names, dtypes, shapes and bytes of every tensor, in the model's own order: another
    checkpoint, a fine-tune or another dtype gives another digest. Tensors on the ``meta``
    device (offloaded) contribute their name, dtype and shape only. Costs one read of the
    weights (about 0.5 s per GB here).
    """
    inner = unwrap_model(model)
    digest = hashlib.blake2b(digest_size=8)
    tensors = list(inner.state_dict(keep_vars=True).items())
    for name, tensor in tensors:
        tensor = tensor.detach()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        if tensor.device.type != "meta" and tensor.numel():
            flat = tensor.cpu().contiguous().reshape(-1)
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
