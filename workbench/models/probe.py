"""A model file (and a LoRA adapter for it) is tried in a child process before this process
loads it.

llama.cpp checks a GGUF's hyperparameters and tensors with hundreds of GGML_ASSERTs, and an
assert aborts the process: a file whose metadata says 0 or 1,000 layers killed the loading
process (SIGABRT), i.e. the user's notebook kernel. `files.check_model_file` catches files
that are not GGUF at all; this catches the rest the only general way there is: a child
process loads the file as `load_model` would, creates a small context with the same KV
settings (and attaches the adapter), and decodes a few tokens. If the child is killed by a
signal (other than SIGKILL, which is the OOM killer's), the file is refused with
ModelFileError quoting llama.cpp's last words (the failed assert); anything else
(including a clean error, which this process then reports itself) lets it through. A child running past the timeout is only logged: big files load slowly.

Verdicts are remembered in memory and under ``$WORKBENCH_HOME/model-probes`` (keyed by
llama.cpp's commit, the files' sha256 and the settings the probe used), so a file is
probed once per machine: about 0.5 s for the default model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from .. import _native
from ..child_probe import clear, cleared, signal_name
from ..errors import ModelFileError

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0

_CHILD = r"""
import json, sys
from workbench import _native
spec = json.loads(sys.argv[1])
model = _native.Model(spec["model"], spec["n_gpu_layers"], spec["use_mmap"], False)
ctx = _native.Context(model, spec["ctx"])
adapters = [_native.Adapter(model, spec["adapter"])] if spec["adapter"] else []  # alive while ctx uses them
if adapters:
    _native.set_adapters(ctx, adapters, [1.0])
ids = model.tokenize("The quick brown fox jumps over the lazy dog.", True, True)[:8] or [0]
if ctx.decode(ids, list(range(len(ids))), [0] * len(ids), [0] * (len(ids) - 1) + [1], 0.0) == 0:
    ctx.decode([ids[-1]], [len(ids)], [0], [1], 0.0)
print("ok")
"""

FOLDER = "model-probes"


def _last_words(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    pick = [ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or "error" in ln.lower()]
    return (pick or lines or ["no message"])[-1][-300:]


def probe(model_path: Path, model_sha256: str, *, flash_attn: str, type_k: str, type_v: str, n_gpu_layers: int,
          use_mmap: bool, adapter_path: Path | None = None, adapter_sha256: str | None = None) -> None:
    """Raise ModelFileError if loading the model (with the adapter) and decoding a few tokens
    kills a process. Cheap when this machine already probed the same files and settings."""
    spec = {"model": str(model_path), "n_gpu_layers": n_gpu_layers, "use_mmap": use_mmap,
            "adapter": str(adapter_path) if adapter_path is not None else None,
            "ctx": {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 1, "n_threads": 1,
                    "n_threads_batch": 1, "flash_attn": flash_attn, "type_k": type_k, "type_v": type_v}}
    key = hashlib.sha256(json.dumps([_native.llama_commit, model_sha256, adapter_sha256, flash_attn, type_k,
                                     type_v, n_gpu_layers, _native.cuda]).encode()).hexdigest()
    if cleared(FOLDER, key):
        return
    subject = adapter_path if adapter_path is not None else model_path
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=dict(os.environ, GGML_NO_BACKTRACE="1"))
    except subprocess.TimeoutExpired:
        log.warning("probing %s took longer than %g s; loading it unprobed", subject, TIMEOUT_S)
        return
    except OSError as e:
        log.warning("could not probe %s in a child process (%s); loading it unprobed", subject, e)
        return
    if done.returncode == -signal.SIGKILL:  # the OOM killer, most likely: not the file's fault
        log.warning("the probe of %s was killed (SIGKILL: out of memory?); loading it unprobed", subject)
        return
    if done.returncode < 0:
        raise ModelFileError(str(subject),
                             f"llama.cpp dies loading or running it ({signal_name(done.returncode)} in a probe "
                             f"process: {_last_words(done.stderr)})")
    clear(FOLDER, key, persist=done.returncode == 0)
