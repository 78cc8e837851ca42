"""Option and config validation: unknown key, wrong type and out of range are distinct errors."""

import pytest

from workbench.errors import InvalidOption, OptionError, UnknownOption
from workbench.options import LoadConfig, RequestOptions, build


def test_defaults_follow_erllama():
    opts = build(RequestOptions, {})
    assert opts.response_tokens == 64
    assert opts.temperature == 0.0
    assert build(LoadConfig, {}).n_seq_max == 4


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(UnknownOption) as e:
        build(RequestOptions, {"respone_tokens": 3})
    assert e.value.key == "respone_tokens"
    assert "response_tokens" in str(e.value)


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
