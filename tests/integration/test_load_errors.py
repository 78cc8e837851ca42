"""load_model rejects bad files and configs with distinct, specific errors."""

from __future__ import annotations

import os

import pytest

import workbench as wb
from workbench.errors import (AlreadyLoaded, InvalidOption, ModelFileError, UnknownOption)

pytestmark = pytest.mark.model


def test_nonexistent_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such file") as e:
        wb.load_model(model_path=str(tmp_path / "missing.gguf"))
    assert e.value.path.endswith("missing.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelFileError, match="is a directory"):
        wb.load_model({"model_path": str(tmp_path)})


def test_random_bytes(tmp_path):
    f = tmp_path / "random.gguf"
    f.write_bytes(os.urandom(1 << 16))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        wb.load_model(model_path=str(f))


def test_gguf_magic_then_garbage(tmp_path):
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00" + os.urandom(1 << 16))
    with pytest.raises(ModelFileError, match="not a valid GGUF file"):
        wb.load_model(model_path=str(f))


@pytest.mark.parametrize("keep", [100, 5_000_000, 97_000_000])
def test_truncated_model(tmp_path, model_path, keep):
    f = tmp_path / "cut.gguf"
    with open(model_path, "rb") as src:
        f.write_bytes(src.read(keep))
    with pytest.raises(ModelFileError):
        wb.load_model(model_path=str(f))
    assert wb.list_models() == [] or all(m["path"] != str(f) for m in wb.list_models())


def test_config_errors_are_distinct(model_path):
    with pytest.raises(UnknownOption, match="unknown config 'model_pth'"):
        wb.load_model({"model_pth": str(model_path)})
    with pytest.raises(InvalidOption, match="config 'n_ctx'"):
        wb.load_model({"model_path": str(model_path), "n_ctx": "big"})
    with pytest.raises(InvalidOption, match="config 'model_path'"):
        wb.load_model({"model_path": 12})
    with pytest.raises(InvalidOption, match="config"):
        wb.load_model("not a dict")  # type: ignore[arg-type]


def test_duplicate_model_id(model_path):
    mid = wb.load_model(model_path=str(model_path), model_id="dup", n_seq_max=1)
    try:
        with pytest.raises(AlreadyLoaded):
            wb.load_model(model_path=str(model_path), model_id="dup")
        assert wb.model_info("dup")["model_id"] == "dup"
        assert wb.model_info("dup")["fingerprint"] == (
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
    finally:
        wb.unload(mid)
    assert "dup" not in {m["model_id"] for m in wb.list_models()}


@pytest.mark.parametrize("layers", [0, 1000])
def test_metadata_that_makes_llama_cpp_abort(tmp_path, model_path, layers):
    """A well-formed GGUF whose metadata says 0 or 1,000 layers trips a GGML_ASSERT, which
    aborted the whole process; it is now tried in a child process and refused."""
    import shutil

    import gguf

    f = tmp_path / f"layers-{layers}.gguf"
    shutil.copy(model_path, f)
    reader = gguf.GGUFReader(f, "r+")
    field = reader.fields["llama.block_count"]
    field.parts[field.data[0]][0] = layers
    del reader
    with pytest.raises(ModelFileError, match=r"SIGABRT in a probe process: .*GGML_ASSERT\(hparams.n_layer_all > 0"):
        wb.load_model(model_path=str(f))
    ok = wb.load_model(model_path=str(model_path), n_seq_max=1)       # and this process goes on
    try:
        assert wb.complete(ok, "Hi", response_tokens=1).tokens
    finally:
        wb.unload(ok)


# --- placement, load mode and RoPE/YaRN options: refused before llama.cpp sees them ---------

BAD_LOAD_OPTIONS = [
    ({"split_mode": "bogus"}, "split_mode", "'none', 'layer', 'row'"),
    ({"split_mode": 1}, "split_mode", "'none', 'layer', 'row'"),
    ({"tensor_split": [1.0] * 17}, "tensor_split", "1 to 16"),
    ({"tensor_split": []}, "tensor_split", "1 to 16"),
    ({"tensor_split": [0, 0.0]}, "tensor_split", "not all zero"),
    ({"tensor_split": [1, -0.5]}, "tensor_split[1]", ">= 0"),
    ({"tensor_split": [float("nan")]}, "tensor_split[0]", "finite"),
    ({"tensor_split": "3,1"}, "tensor_split", "a list"),
    ({"main_gpu": 16}, "main_gpu", "[-1, 15]"),
    ({"main_gpu": -2}, "main_gpu", "[-1, 15]"),
    ({"main_gpu": True}, "main_gpu", "an integer"),
    ({"load_mode": "fast"}, "load_mode", "'mmap+mlock'"),
    ({"use_mlock": "yes"}, "use_mlock", "True or False"),
    ({"use_mlock": True, "load_mode": "mmap"}, "use_mlock", "load_mode 'mmap'"),
    ({"use_mmap": False, "load_mode": "mmap+mlock"}, "use_mmap", "load_mode 'mmap+mlock'"),
    ({"offload_kqv": 1}, "offload_kqv", "True or False"),
    ({"swa_full": None}, "swa_full", "True or False"),
    ({"rope_scaling_type": "cubic"}, "rope_scaling_type", "'yarn'"),
    ({"rope_freq_base": 0}, "rope_freq_base", "> 0"),
    ({"rope_freq_base": float("inf")}, "rope_freq_base", "> 0"),
    ({"rope_freq_scale": 0.0}, "rope_freq_scale", "[0.001, 1000.0]"),
    ({"rope_freq_scale": float("nan")}, "rope_freq_scale", "[0.001, 1000.0]"),
    ({"rope_freq_scale": "0.5"}, "rope_freq_scale", "[0.001, 1000.0]"),
    ({"yarn_ext_factor": 2.0}, "yarn_ext_factor", "[0.0, 1.0]"),
    ({"yarn_attn_factor": -1.0}, "yarn_attn_factor", "> 0"),
    ({"yarn_beta_fast": 0}, "yarn_beta_fast", "> 0"),
    ({"yarn_beta_slow": float("-inf")}, "yarn_beta_slow", "> 0"),
    ({"yarn_orig_ctx": 0}, "yarn_orig_ctx", "[1, 2097152]"),
    ({"yarn_orig_ctx": 2**40}, "yarn_orig_ctx", "[1, 2097152]"),
    ({"chat_template_cache": 0}, "chat_template_cache", "[1, 1024]"),
]


@pytest.mark.parametrize("opts, key, expected", BAD_LOAD_OPTIONS, ids=[k for _, k, _ in BAD_LOAD_OPTIONS])
def test_bad_placement_and_rope_options_are_refused(model_path, opts, key, expected):
    """Each bad value is an InvalidOption naming the option, the value and what was expected;
    nothing is loaded."""
    before = wb.list_models()
    with pytest.raises(InvalidOption) as e:
        wb.load_model(model_path=str(model_path), **opts)
    assert e.value.key == key
    assert expected in str(e.value) and f"config {key!r}" in str(e.value)
    assert wb.list_models() == before


def test_a_misspelt_load_option_is_named():
    with pytest.raises(UnknownOption, match="did you mean 'tensor_split'"):
        wb.load_model(tensorsplit=[1.0])
    with pytest.raises(UnknownOption, match="did you mean 'rope_freq_scale'"):
        wb.load_model(rope_freq_scal=0.5)
