"""The GGUF cache is built once when two loads start together: the second waits on the
entry's file lock (its own FileLock instance, as another process would), then reads the
first one's entry instead of de-quantising the model a second time."""

from __future__ import annotations

import threading
import time

import torch

from captum_iglens.models import gguf_cache as _gguf_cache
from captum_iglens.models.loading import load_model


def test_two_loads_at_once_dequantise_the_model_once(tmp_path, monkeypatch):
    from tiny_families import make_family
    from tiny_tokenizer import word_tokenizer

    calls = []
    start = threading.Barrier(2)

    def slow_from_gguf(gguf):  # a de-quantisation that takes long enough to overlap
        calls.append(threading.get_ident())
        time.sleep(1.0)
        return make_family("llama"), word_tokenizer()

    make_family("llama")  # transformers' lazy imports done before the threads race on them
    monkeypatch.setattr(_gguf_cache, "_from_gguf", slow_from_gguf)
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF tiny stand-in")
    models, failures = [], []

    def load():
        start.wait()
        try:
            models.append(load_model(str(gguf))[0])
        except Exception as err:  # reported below: a thread's exception is otherwise lost
            failures.append(err)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == [] and len(models) == 2
    assert len(calls) == 1, f"the model was de-quantised {len(calls)} times"
    entry = _gguf_cache.cache_dir_for(gguf)
    assert (entry / "config.json").is_file() and entry.with_name(entry.name + ".lock").exists()
    first, second = (dict(m.named_parameters()) for m in models)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # the same saved weights
