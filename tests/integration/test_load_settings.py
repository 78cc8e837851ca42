"""load_model settings inside each option's own range whose combination made llama.cpp
abort (GGML_ASSERT) are refused with InvalidOption, and the process goes on.

Each case runs in a child process, so a regression shows up as a failed test with the
child's exit status (-6 = SIGABRT) instead of ending the whole test run. Before the checks,
n_batch=1 (with the default 4 sequences), n_batch=3 with n_seq_max=4 and n_ctx=16 with
n_seq_max=17 died in llama_context's output_reserve (n_outputs_max), and embed_n_ctx=1000
at the first embed() in ggml_can_mul_mat.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.model

CHILD = textwrap.dedent(r'''
    import json, sys
    import workbench as wb

    path, cases = sys.argv[1], json.loads(sys.argv[2])
    out = []
    for kw in cases:
        try:
            m = wb.load_model(model_path=path, **kw)
        except Exception as e:
            out.append([type(e).__name__, getattr(e, "key", None), str(e)])
            continue
        try:  # the load went through: use it as a user would
            wb.complete(m, "Hello", response_tokens=2)
            wb.embed(m, "Hello")
            out.append(["ok", None, ""])
        except Exception as e:
            out.append([type(e).__name__, getattr(e, "key", None), str(e)])
        finally:
            wb.unload(m)
    m = wb.load_model(model_path=path, n_seq_max=1)      # and this process goes on
    alive = bool(wb.complete(m, "Hi", response_tokens=1).tokens)
    print(json.dumps({"cases": out, "alive": alive}))
''')


def run_child(model_path, cases, tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(model_path), json.dumps(cases)], capture_output=True,
                          text=True, timeout=600, env=_env(tmp_path), check=False)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env(tmp_path):
    import os

    return dict(os.environ, WORKBENCH_HOME=str(tmp_path / "home"))   # no probe verdicts from earlier runs


ISSUE_CASES = [
    ({"n_batch": 1}, "n_batch"),
    ({"n_batch": 3, "n_seq_max": 4}, "n_batch"),
    ({"n_ctx": 16, "n_seq_max": 17}, "n_ctx"),
    ({"embed_n_ctx": 1000, "n_ubatch": 9000}, "embed_n_ctx"),
    ({"embed_n_ctx": 17, "embed_n_seq_max": 16}, "embed_n_ctx"),
    ({"embed_n_seq_max": 3}, "embed_n_ctx"),     # the default (2,048: the model states 8,192) is not a multiple
    ({"n_ctx": 2**40}, "n_ctx"),
    ({"n_batch": 2**32}, "n_batch"),
    ({"embed_n_ctx": 2**33}, "embed_n_ctx"),
    ({"n_gpu_layers": 2**31}, "n_gpu_layers"),
    ({"decode_budget_ms": 2**1100}, "decode_budget_ms"),
]


def test_issue_settings_are_refused_and_the_process_lives(model_path, tmp_path):
    got = run_child(model_path, [kw for kw, _ in ISSUE_CASES], tmp_path)
    assert got["alive"]
    for (kw, key), (kind, got_key, msg) in zip(ISSUE_CASES, got["cases"]):
        assert (kind, got_key) == ("InvalidOption", key), (kw, kind, msg)


def test_settings_at_the_edge_of_the_relations_load_and_run(model_path, tmp_path):
    """The checks are the real constraints, not stricter: the smallest allowed values work."""
    cases = [{"n_batch": 1, "n_seq_max": 1, "n_ctx": 16}, {"n_batch": 4, "n_seq_max": 4, "n_ubatch": 1},
             {"n_ctx": 17, "n_seq_max": 17, "n_batch": 17}, {"embed_n_ctx": 1008, "n_ubatch": 9000},
             {"embed_n_ctx": 24, "embed_n_seq_max": 3}]
    got = run_child(model_path, cases, tmp_path)
    assert got["alive"]
    assert [c[0] for c in got["cases"]] == ["ok"] * len(cases), got["cases"]


PROBE_CHILD = textwrap.dedent(r'''
    import json, sys
    from pathlib import Path
    from workbench.models import fingerprint
    from workbench.models.probe import probe
    from workbench.options import LoadConfig

    path, bad = Path(sys.argv[1]), json.loads(sys.argv[2])
    cfg = LoadConfig(model_path=str(path))
    for k, v in bad.items():   # a relation options.py does not know: skip its validation
        object.__setattr__(cfg, k, v)
    try:
        probe(path, fingerprint(path), cfg)
        print(json.dumps(["ok", None, ""]))
    except Exception as e:
        print(json.dumps([type(e).__name__, getattr(e, "key", None), str(e)]))
''')


@pytest.mark.parametrize("bad, stage", [({"n_batch": 3, "n_seq_max": 4}, "running the context"),
                                        ({"embed_n_ctx": 1000}, "running the embedding context")])
def test_the_probe_tries_the_settings_asked_for(model_path, tmp_path, bad, stage):
    """What validation misses is caught in the probe's child: it makes the context and the
    embedding context with the user's settings; the settings (not the file) are refused."""
    done = subprocess.run([sys.executable, "-c", PROBE_CHILD, str(model_path), json.dumps(bad)],
                          capture_output=True, text=True, timeout=600, env=_env(tmp_path), check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, key, msg = json.loads(done.stdout.strip().splitlines()[-1])
    assert (kind, key) == ("InvalidOption", "config"), msg
    assert stage in msg and "SIGABRT" in msg and "GGML_ASSERT" in msg


# --- placement, load mode, RoPE/YaRN: passed through to llama.cpp ------------------------------

import workbench as wb  # noqa: E402
from workbench.errors import InvalidOption  # noqa: E402
from workbench.machine import gpu_devices  # noqa: E402

PROMPT = "The old lighthouse keeper walked along the shore every morning, counting the boats, and"
SMALL = {"n_ctx": 512, "n_seq_max": 1, "n_batch": 256}


def _greedy(m, **opts):
    return wb.complete(m, PROMPT, response_tokens=10, **opts).tokens


@pytest.fixture(scope="module")
def base():
    """The default model's greedy reply to PROMPT with every option at its default."""
    m = wb.load_model(cache=False, **SMALL)
    try:
        yield _greedy(m)
    finally:
        wb.unload(m)


@pytest.fixture
def load():
    """load_model(**opts) with the default model in a small context; unloaded after the test."""
    loaded = []

    def make(**opts):
        mid = wb.load_model(**{**SMALL, **opts})
        loaded.append(mid)
        return mid

    yield make
    for mid in loaded:
        wb.unload(mid)


def test_rope_freq_scale_changes_the_output_and_the_models_own_does_not(load, base):
    assert _greedy(load(cache=False, rope_freq_scale=1.0)) == base      # SmolLM2's trained scale: same model
    assert _greedy(load(cache=False, rope_freq_base=100000.0)) == base  # its trained base frequency
    assert _greedy(load(cache=False, rope_freq_scale=0.25)) != base
    assert _greedy(load(cache=False, rope_freq_base=500.0)) != base


def test_yarn_scaling_changes_the_output(load, base):
    yarn = _greedy(load(cache=False, rope_scaling_type="yarn", rope_freq_scale=0.5, yarn_orig_ctx=2048,
                        yarn_ext_factor=1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0))
    assert yarn != base and len(yarn) > 0


def test_cached_rows_are_not_served_across_rope_settings(load):
    """RoPE overrides rotate K: a row saved with the model's RoPE must not seed a model
    loaded with another (warm would differ from cold), while a second plain instance hits."""
    prompt = " ".join([PROMPT] * 4)   # long enough for rows at a few save points
    plain = load()
    wb.complete(plain, prompt, response_tokens=4)
    assert wb.wait_for_saves()
    again = load()
    wb.complete(again, prompt, response_tokens=4)
    assert wb.last_cache_hit(again)["kind"] in ("exact", "partial")
    scaled = load(rope_freq_scale=0.25)
    warm = wb.complete(scaled, prompt, response_tokens=8).tokens
    assert wb.last_cache_hit(scaled)["kind"] == "cold"
    assert warm == wb.complete(load(rope_freq_scale=0.25, cache=False), prompt, response_tokens=8).tokens


@pytest.mark.parametrize("opts", [{"use_mmap": False}, {"use_mlock": True}, {"use_mmap": False, "use_mlock": True},
                                  {"load_mode": "none"}, {"load_mode": "mmap"}, {"load_mode": "mmap+mlock"},
                                  {"load_mode": "auto"}, {"load_mode": "dio"}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_every_load_mode_loads_the_same_model(load, base, opts):
    """However llama.cpp reads the file (mmap, read, mlock, direct I/O), the weights and so
    the greedy reply are the same."""
    assert _greedy(load(cache=False, **opts)) == base


def test_context_and_placement_switches_are_accepted(load, base):
    """swa_full, offload_kqv and the GPU placement options load and run here (a CPU build:
    the placement options are ignored, as n_gpu_layers is)."""
    cases = [{"swa_full": False}, {"offload_kqv": False}, {"split_mode": "none", "main_gpu": -1}]
    if not gpu_devices():  # with GPUs, shares past them are refused (test_placement_beyond_...)
        cases += [{"split_mode": "row", "tensor_split": [3, 1]}, {"split_mode": "layer", "tensor_split": [1.0] * 16}]
    for opts in cases:
        got = _greedy(load(cache=False, **opts))
        # on a GPU, moving work to the CPU may round differently: there it only has to run
        assert got == base if not gpu_devices() else len(got) > 0, opts


@pytest.mark.skipif(not gpu_devices(), reason="needs a GPU device (this build or machine has none)")
def test_placement_beyond_the_gpus_there_are_is_refused(model_path):
    n = len(gpu_devices())
    with pytest.raises(InvalidOption) as e:
        wb.load_model(model_path=str(model_path), split_mode="none", main_gpu=n)
    assert e.value.key == "main_gpu"
    if n < 16:
        with pytest.raises(InvalidOption) as e:
            wb.load_model(model_path=str(model_path), tensor_split=[1.0] * (n + 1))
        assert e.value.key == "tensor_split"


# --- settings that were hard-coded: the chat template cache, the cache's writer pool ----------

def test_chat_template_cache_keeps_as_many_templates_as_asked(load):
    from workbench import registry

    msgs = [{"role": "user", "content": "Hi"}]
    templates = ["{% for m in messages %}{{ m.content }}{% endfor %}",
                 "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"]
    for size, kept in ((1, 1), (8, 3)):
        m = load(chat_template_cache=size)
        for t in templates:
            assert "Hi" in wb.render_chat_template(m, msgs, chat_template=t).prompt
        wb.render_chat_template(m, msgs)  # the model's own
        assert len(registry.get(m).attachment("chat_templates", dict).by_source) == kept


def test_configure_cache_writer_pool(tmp_path):
    """A writer queue of one drops the saves fired while one is being written (each counted);
    the default queue of eight takes them all."""
    from workbench.cache import CacheNamespace
    from workbench.cache.shared import shared_cache

    payload = bytes(16 << 20)
    tiers = [{"kind": "disk", "root": str(tmp_path / "kv"), "budget_bytes": 1 << 30}]
    try:
        for queue, dropped in ((1, True), (8, False)):
            wb.configure_cache(tiers, writer_workers=1, writer_queue=queue, storage="rows")  # put_async of rows
            cache = shared_cache()
            ns = CacheNamespace(f"{queue:064x}")
            for i in range(4):
                cache.put_async(ns, list(range(i * 100, i * 100 + 32)), payload)
            assert wb.wait_for_saves(30)
            assert (wb.cache_info()["counters"].get("saves_dropped", 0) > 0) is dropped
        for bad in ({"writer_workers": 0}, {"writer_queue": 0}, {"writer_workers": True}, {"writer_queue": "8"}):
            with pytest.raises(InvalidOption) as e:
                wb.configure_cache(tiers, **bad)
            assert e.value.key == next(iter(bad))
    finally:
        wb.configure_cache([{"kind": "ram"}])


def test_yarn_rescaling_keeps_the_files_training_context(load):
    """llama.cpp rescales its copy of n_ctx_train to yarn_orig_ctx / rope_freq_scale when a
    context uses YaRN with another scale (8192 / 1000 = 8 here): the defaults derived from
    the training context (the embedding context's 2,048 tokens) keep the file's, where an
    8-token embedding context over 16 sequences made llama.cpp abort."""
    m = load(rope_scaling_type="yarn", rope_freq_scale=1000.0)
    assert wb.model_info(m)["n_ctx_train"] == 8192
    assert len(wb.embed(m, "Hello there")) == 576
    assert len(wb.complete(m, "Hello", response_tokens=3).tokens) > 0
