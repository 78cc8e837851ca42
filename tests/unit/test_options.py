"""Option and config validation: unknown key, wrong type and out of range are distinct errors."""

import dataclasses
import math
import os

import pytest

from workbench.errors import InvalidOption, OptionError, UnknownOption
from workbench.options import (
    INT32_MAX,
    ChatOptions,
    LoadConfig,
    RequestOptions,
    build,
    check_number,
    context_params,
)


def test_defaults_follow_erllama():
    opts = build(RequestOptions, {})
    assert opts.response_tokens == 64
    assert opts.temperature == 0.0
    assert build(LoadConfig, {}).n_seq_max == 4


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(UnknownOption) as e:
        build(RequestOptions, {"respone_tokens": 3})
    assert e.value.key == "respone_tokens"
    assert "(did you mean 'response_tokens'" in str(e.value)  # the closest first


@pytest.mark.parametrize("key,meant", [
    ("max_tokens", "response_tokens"), ("n_predict", "response_tokens"), ("stop", "stop_sequences"),
    ("repeat_penalty", "repetition_penalty"), ("temprature", "temperature"), ("top-k", "top_k"),
])
def test_unknown_key_suggests_what_was_meant(key, meant):
    with pytest.raises(UnknownOption, match=rf"unknown option '{key}' \(did you mean '{meant}'\?\)"):
        build(RequestOptions, {key: 3})


def test_no_suggestion_for_a_name_like_none_and_aliases_only_where_known():
    with pytest.raises(UnknownOption) as e:
        build(RequestOptions, {"zzzz": 3})
    assert "did you mean" not in str(e.value)
    with pytest.raises(UnknownOption) as e:  # the alias' target is not an option of this call
        build(LoadConfig, {"max_tokens": 3}, "config")
    assert "response_tokens" not in str(e.value).split("; known")[0]
    with pytest.raises(UnknownOption, match=r"'ctx_size' \(did you mean 'n_ctx'\?\)"):
        build(LoadConfig, {"ctx_size": 3}, "config")


@pytest.mark.parametrize("key,value", [
    ("response_tokens", "64"), ("response_tokens", 3.5), ("response_tokens", True),
    ("temperature", "hot"), ("top_p", 1.5), ("seed", -1), ("stop_sequences", [1, 2]),
    ("stop_sequences", [""]), ("response_tokens", -1),
])
def test_wrong_type_or_range_is_invalid_option(key, value):
    with pytest.raises(InvalidOption) as e:
        build(RequestOptions, {key: value})
    assert e.value.key == key and e.value.value == value
    assert key in str(e.value) and repr(value) in str(e.value)


def test_distinct_error_classes_share_a_base():
    assert not issubclass(UnknownOption, InvalidOption)
    assert issubclass(UnknownOption, OptionError) and issubclass(InvalidOption, ValueError)


def test_config_errors_say_config():
    with pytest.raises(UnknownOption, match="unknown config 'n_ctxx'"):
        build(LoadConfig, {"n_ctxx": 5}, "config")
    with pytest.raises(InvalidOption, match="config 'flash_attn'"):
        build(LoadConfig, {"flash_attn": "yes"}, "config")


def test_stop_sequences_accept_one_string():
    assert build(RequestOptions, {"stop_sequences": "\n"}).stop_sequences == ("\n",)


# --- every integer fits what llama.cpp takes; every number is finite ------------------------

RECORDS = (LoadConfig, RequestOptions, ChatOptions)


def _fields(kind):
    return [(cls, f.name) for cls in RECORDS for f in dataclasses.fields(cls) if f.type in (kind, f"{kind} | None")]


@pytest.mark.parametrize("cls,key", _fields("int"))
@pytest.mark.parametrize("value", [2**40, 2**64, -(2**63)])
def test_every_int_option_is_bounded(cls, key, value):
    """n_ctx=2**40 reached pybind as a RuntimeError 'Unable to cast'."""
    with pytest.raises(InvalidOption) as e:
        build(cls, {key: value})
    assert e.value.key == key and e.value.value == value


@pytest.mark.parametrize("cls,key", [(c, k) for c, k in _fields("int") if k != "seed"])   # seed: uint32
def test_int_options_stop_at_int32(cls, key):
    with pytest.raises(InvalidOption) as e:
        build(cls, {key: INT32_MAX + 1})
    assert e.value.key == key and e.value.value == INT32_MAX + 1


@pytest.mark.parametrize("cls,key", _fields("float"))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_every_float_option_is_finite(cls, key, value):
    with pytest.raises(InvalidOption) as e:
        build(cls, {key: value})
    assert e.value.key == key


def test_the_int_and_float_sweeps_cover_the_options():
    assert {"n_ctx", "n_batch", "n_ubatch", "embed_n_ctx", "response_tokens", "top_k", "thinking_budget_tokens"} <= {
        k for _, k in _fields("int")}
    assert {"temperature", "top_p", "repetition_penalty"} <= {k for _, k in _fields("float")}


@pytest.mark.parametrize("value", [0, 0.0, 0.009, 1e-300, 100.5, 1e39])
def test_repetition_penalty_is_refused_outside_its_range(value):
    """0 passed and reached llama.cpp, which divided logits by it: the infinite logit then
    failed the request as InvalidOption('logit_bias'), an option never given (issue 24)."""
    with pytest.raises(InvalidOption) as e:
        build(RequestOptions, {"repetition_penalty": value})
    assert (e.value.key, e.value.value) == ("repetition_penalty", value)
    assert "in [0.01, 100.0]" in str(e.value) and "1.0 = off" in str(e.value)


@pytest.mark.parametrize("value", [0.01, 0.5, 1, 1.3, 100])
def test_repetition_penalty_in_range_is_kept(value):
    assert build(RequestOptions, {"repetition_penalty": value}).repetition_penalty == value


def test_reasoning_budget_tokens_are_bounded():
    with pytest.raises(InvalidOption, match="reasoning_budget"):
        build(RequestOptions, {"reasoning_budget": {"tokens": 2**31, "end": "</think>"}})


@pytest.mark.parametrize("value", [math.nan, math.inf, True, "1", None, 10**400])
def test_check_number_names_the_value(value):
    with pytest.raises(InvalidOption) as e:
        check_number("timeout_s", value, 0.0)
    assert e.value.key == "timeout_s" and repr(value)[:20] in str(e.value)


# --- relations between load settings (llama.cpp aborts on these) ----------------------------

@pytest.mark.parametrize("cfg,key", [
    ({"n_batch": 1}, "n_batch"), ({"n_batch": 3, "n_seq_max": 4}, "n_batch"),
    ({"n_ctx": 16, "n_seq_max": 17, "n_batch": 64}, "n_ctx"),
    ({"embed_n_ctx": 1000}, "embed_n_ctx"), ({"embed_n_ctx": 8, "embed_n_seq_max": 16}, "embed_n_ctx"),
])
def test_load_relations(cfg, key):
    with pytest.raises(InvalidOption) as e:
        build(LoadConfig, cfg, "config")
    assert e.value.key == key


def test_relations_with_the_model_default_context():
    cfg = build(LoadConfig, {"n_seq_max": 64, "n_batch": 64})
    assert cfg.context_params(2048)["n_ctx"] == 2048
    with pytest.raises(InvalidOption, match="n_ctx.*default"):
        cfg.context_params(32)                     # a model trained on 32 tokens: n_ctx defaults to 32
    assert build(LoadConfig, {"embed_n_seq_max": 3}).embed_params(999) == (999, 3)
    with pytest.raises(InvalidOption, match="embed_n_ctx"):
        build(LoadConfig, {"embed_n_seq_max": 16}).embed_params(1000)


@pytest.mark.parametrize("value", [[0], [-3], [1.5], [True], "12", [2**31], list(range(1, 4098)), None])
def test_cache_boundaries_are_a_bounded_list_of_positions(value):
    with pytest.raises(InvalidOption) as e:
        build(RequestOptions, {"cache_boundaries": value})
    assert e.value.key == "cache_boundaries" and "token positions" in str(e.value)


def test_cache_boundaries_are_kept_sorted_and_distinct():
    assert build(RequestOptions, {"cache_boundaries": [40, 12, 40]}).cache_boundaries == (12, 40)


def test_threads_default_to_the_environment_variable_then_to_the_cores(monkeypatch):
    cfg = build(LoadConfig, {})
    monkeypatch.delenv("WORKBENCH_N_THREADS", raising=False)
    assert context_params(cfg, 2048)["n_threads"] == len(os.sched_getaffinity(0))
    monkeypatch.setenv("WORKBENCH_N_THREADS", "1")
    params = context_params(cfg, 2048)
    assert params["n_threads"] == params["n_threads_batch"] == 1
    assert context_params(build(LoadConfig, {"n_threads": 3}), 2048)["n_threads"] == 3   # a load's own wins
    for bad in ("0", "two", "-1", "513", "1.5"):
        monkeypatch.setenv("WORKBENCH_N_THREADS", bad)
        with pytest.raises(InvalidOption) as e:
            context_params(cfg, 2048)
        assert e.value.key == "WORKBENCH_N_THREADS" and e.value.value == bad
        assert "environment variable 'WORKBENCH_N_THREADS'" in str(e.value) and "1 to 512" in str(e.value)
