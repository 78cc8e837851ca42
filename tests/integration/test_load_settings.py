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
