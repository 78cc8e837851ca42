"""What the machine and a loaded model tell: vram_info (NoGPU on a CPU-only build, never a
made-up number), model_info's quant_tag / loaded_at / vram_estimate_b / last_cache_hit, and
option_names, from the one definition of each option set."""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench import _native
from workbench.errors import InvalidOption, NoGPU, UnknownOption, WorkbenchError
from workbench.machine import gpu_devices

pytestmark = pytest.mark.model

NO_GPU = "needs a GPU device (this build or machine has none)"


@pytest.mark.skipif(bool(gpu_devices()), reason="a GPU is present: vram_info answers")
def test_vram_info_on_a_cpu_only_build_raises_no_gpu():
    with pytest.raises(NoGPU) as e:
        wb.vram_info()
    assert isinstance(e.value, WorkbenchError)
    kinds = {d["kind"] for d in _native.devices()}
    assert kinds <= {"cpu", "accel"}                 # what llama.cpp sees: no GPU to report on
    assert "CPU" in str(e.value) and "WORKBENCH_CUDA" in str(e.value)


@pytest.mark.skipif(not gpu_devices(), reason=NO_GPU)
def test_vram_info_sums_the_gpus():
    info = wb.vram_info()
    assert info["devices"] and info["total_bytes"] > 0
    assert 0 <= info["free_bytes"] <= info["total_bytes"]
    assert info["used_bytes"] == info["total_bytes"] - info["free_bytes"]
    assert info["total_bytes"] == sum(d["total_bytes"] for d in info["devices"])


def test_model_info_tells_quantisation_load_time_vram_and_last_hit(model_path):
    before = time.time()
    m = wb.load_model(model_path=str(model_path), n_ctx=512, n_seq_max=1)
    try:
        info = wb.model_info(m)
        assert info["quant_tag"] == "Q4_1"                       # SmolLM2-135M-Instruct.Q4_1.gguf
        assert before <= info["loaded_at"] <= time.time()
        assert info["last_cache_hit"] is None                    # nothing asked yet
        assert info["deterministic"] is False                    # the load option's default
        if gpu_devices():
            assert info["vram_estimate_b"] > info["size_bytes"] // 2   # weights offloaded (n_gpu_layers=-1)
        else:
            assert info["vram_estimate_b"] == 0
        wb.complete(m, "Hello there, how are you today?", response_tokens=2)
        hit = wb.model_info(m)["last_cache_hit"]
        assert hit == wb.last_cache_hit(m) and hit["prompt_tokens"] > 0
        hit["kind"] = "changed by the caller"
        assert wb.model_info(m)["last_cache_hit"]["kind"] != "changed by the caller"   # a copy
    finally:
        wb.unload(m)


def test_option_names_are_what_each_call_accepts(model):
    for kind, call in (("load", lambda **kw: wb.load_model(**kw)),
                       ("request", lambda **kw: wb.complete(model, "Hi", **kw)),
                       ("chat", lambda **kw: wb.chat(model, [{"role": "user", "content": "Hi"}], **kw))):
        names = wb.option_names(kind)
        assert len(names) == len(set(names)) > 5
        with pytest.raises(UnknownOption) as e:
            call(not_an_option=1)
        assert set(e.value.allowed) <= set(names), kind   # every key the call knows is listed
    assert {"tensor_split", "rope_freq_scale", "load_mode", "chat_template_cache"} <= set(wb.option_names("load"))
    assert {"response_tokens", "temperature"} <= set(wb.option_names("request"))
    assert {"tool_choice", "response_tokens"} <= set(wb.option_names("chat"))


def test_option_names_select_a_users_options_for_each_call(model):
    """A caller forwarding a mixed dict keeps for each call what it takes, and the call runs."""
    user = {"n_ctx": 512, "n_seq_max": 1, "response_tokens": 3, "temperature": 0.0, "tool_choice": "none"}
    m = wb.load_model(**{k: v for k, v in user.items() if k in wb.option_names("load")})
    try:
        assert wb.model_info(m)["n_ctx"] == 512
        r = wb.complete(m, "Hi", **{k: v for k, v in user.items() if k in wb.option_names("request")})
        assert len(r.tokens) <= 3
        with pytest.raises(UnknownOption):
            wb.complete(m, "Hi", **user)
    finally:
        wb.unload(m)


@pytest.mark.parametrize("kind", ["bogus", None, 3, "LOAD"])
def test_option_names_of_an_unknown_kind(kind):
    with pytest.raises(InvalidOption) as e:
        wb.option_names(kind)
    assert e.value.key == "kind" and "'load', 'request', 'chat'" in str(e.value)


def test_memory_breakdown_counts_the_weights_and_the_kv_cache(model_path):
    """What vram_estimate_b sums: the weights (the model's size, give or take buffer padding)
    and a KV cache that grows with n_ctx, each on the device that holds it (here the host)."""
    from workbench import registry

    kv = {}
    for n_ctx in (512, 1024):
        m = wb.load_model(model_path=str(model_path), n_ctx=n_ctx, n_seq_max=1, cache=False)
        try:
            parts = _native.memory_breakdown(registry.get(m).ctx)
            size = wb.model_info(m)["size_bytes"]
            weights = sum(p["model"] for p in parts)
            assert size <= weights <= size * 1.05
            kv[n_ctx] = sum(p["context"] for p in parts)
            if not gpu_devices():
                assert all(p["host"] and p["kind"] == "cpu" for p in parts if p["model"] or p["context"])
        finally:
            wb.unload(m)
    assert kv[512] > 0 and kv[1024] == 2 * kv[512]
