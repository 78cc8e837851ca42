"""LoRA adapters at run time: output changes, scale 0 is the base model, the cache never crosses sets.

The adapter is written here with the `gguf` package for the default model: rank-8 A/B
matrices for every attention query and output projection (30 layers). Random values of
the size used below perturb the logits enough to change greedy output, so "the output
changed" shows the adapter is applied; scale 0 must give back the base tokens exactly.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import workbench as wb
from workbench.errors import InvalidOption, ModelFileError

pytestmark = pytest.mark.model

PROMPT = ("<|im_start|>system\nYou are a poet.<|im_end|>\n"
          "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n")


def write_lora(path: Path, seed: int, rank: int = 8, std: float = 0.08) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    for layer in range(30):
        for name in ("attn_q", "attn_output"):
            # numpy shapes are ggml's ne reversed: A is ne [576, r], B is ne [r, 576]
            a = (rng.standard_normal((rank, 576)) * std).astype(np.float32)
            b = (rng.standard_normal((576, rank)) * std).astype(np.float32)
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
            w.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.load(n_seq_max=2)
def test_adapter_changes_output_scale_zero_restores_base_and_cache_splits(fresh_model, tmp_path):
    m = fresh_model
    base = wb.complete(m, PROMPT, response_tokens=20)
    handle = wb.load_adapter(m, str(write_lora(tmp_path / "lora.gguf", seed=1)))
    assert wb.list_adapters(m) == [{"adapter": handle, "scale": 1.0, "path": str(tmp_path / "lora.gguf"),
                                    "sha256": wb.list_adapters(m)[0]["sha256"]}]
    tuned = wb.complete(m, PROMPT, response_tokens=20)
    assert tuned.tokens != base.tokens
    assert tuned.stats.cache_hit_kind == "cold"          # base rows never serve the adapter set
    assert wb.complete(m, PROMPT, response_tokens=20).tokens == tuned.tokens   # its own rows do
    wb.set_adapter_scale(m, handle, 0.0)
    zero = wb.complete(m, PROMPT, response_tokens=20)
    assert zero.tokens == base.tokens
    wb.set_adapter_scale(m, handle, 1.0)
    again = wb.complete(m, PROMPT, response_tokens=20)
    assert again.tokens == tuned.tokens and again.stats.cache_hit_kind == "exact"
    wb.unload_adapter(m, handle)
    wb.unload_adapter(m, handle)                          # idempotent
    assert wb.list_adapters(m) == []
    assert wb.complete(m, PROMPT, response_tokens=20, cache=False).tokens == base.tokens


@pytest.mark.load(n_seq_max=2)
def test_running_request_keeps_its_adapter_set(fresh_model, tmp_path):
    m = fresh_model
    base = wb.complete(m, PROMPT, response_tokens=40, ignore_eos=True, cache=False)
    s = wb.stream(m, PROMPT, response_tokens=40, ignore_eos=True, cache=False)
    next(iter(s))
    wb.load_adapter(m, str(write_lora(tmp_path / "lora.gguf", seed=2)))   # applies after s ends
    assert s.result().tokens == base.tokens
    assert wb.complete(m, PROMPT, response_tokens=40, ignore_eos=True, cache=False).tokens != base.tokens


def test_bad_adapters(model, tmp_path, model_path):
    with pytest.raises(ModelFileError):
        wb.load_adapter(model, str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFileError, match="not a LoRA adapter"):
        wb.load_adapter(model, str(model_path))          # a model, not an adapter
    with pytest.raises(InvalidOption):
        wb.set_adapter_scale(model, 999, 0.5)
    assert wb.complete(model, PROMPT, response_tokens=2).finish_reason in ("length", "stop")
