"""A model file (and a LoRA adapter for it) is tried in a child process, with the settings
``load_model`` was given, before this process loads it.

llama.cpp checks a GGUF's hyperparameters and tensors with hundreds of GGML_ASSERTs, and an
assert aborts the process: a file whose metadata says 0 or 1,000 layers killed the loading
process (SIGABRT), i.e. the user's notebook kernel. Context settings can do the same
(`n_batch` below `n_seq_max`, an embedding batch that does not split evenly across its
sequences): options.py validates the relations it knows, and this catches the rest the only
general way there is. A child process loads the file as `load_model` would, creates the
context with the same settings (placement and load mode, n_ctx, n_batch, n_ubatch, n_seq_max, threads, flash
attention, KV types; the adapter attached), decodes a few tokens and one row per sequence,
and makes the embedding context and embeds once. If the child is killed by a signal (other
than SIGKILL, which is the OOM killer's) the load is refused, quoting llama.cpp's last
words (the failed assert): with ModelFileError when the file is at fault (it dies at load,
or also with small settings), with InvalidOption naming the settings when only they are.
Anything else (including a clean error, which this process then reports itself) lets it
through. A child running past the timeout is only logged: big files load slowly.

Verdicts are remembered in memory and under ``$WORKBENCH_HOME/model-probes`` (keyed by
llama.cpp's commit, the files' sha256 and the settings), so a file and its settings are
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
from typing import Any

from .. import _native
from ..child_probe import clear, cleared, signal_name
from ..errors import InvalidOption, ModelFileError
from ..machine import check_placement
from ..options import CONTEXT_KEYS, LoadConfig

log = logging.getLogger(__name__)

TIMEOUT_S = 300.0

_CHILD = r"""
import json, sys, types
from workbench import _native
from workbench.options import context_params, embed_params, model_params
spec = json.loads(sys.argv[1])
def stage(name):
    print("stage:" + name, flush=True)
cfg = types.SimpleNamespace(**spec["config"])  # as given: the child tries what validation let through
model = _native.Model(spec["model"], spec["n_gpu_layers"], cfg.use_mmap, False, model_params(cfg))
stage("loaded")
params = spec["ctx"] or context_params(cfg, model.n_ctx_train)
ctx = _native.Context(model, params)
adapters = [_native.Adapter(model, spec["adapter"])] if spec["adapter"] else []  # alive while ctx uses them
if adapters:
    _native.set_adapters(ctx, adapters, [1.0])
stage("context")
ids = (model.tokenize("The quick brown fox jumps over the lazy dog.", True, True) or [0])[:8]
n = len(ids)
for at in range(0, n, ctx.n_batch):                         # the prompt in n_batch chunks
    rows = ids[at:at + ctx.n_batch]
    ctx.decode(rows, list(range(at, at + len(rows))), [0] * len(rows), [0] * (len(rows) - 1) + [1], 0.0)
seqs = list(range(min(ctx.n_seq_max, ctx.n_batch)))        # one row per sequence, logits for each
ctx.decode([ids[-1]] * len(seqs), [n] + [0] * (len(seqs) - 1), seqs, [1] * len(seqs), 0.0)
stage("decoded")
if not spec["ctx"]:
    n_ctx, n_seq = embed_params(cfg, model.n_ctx_train)
    try:
        emb = _native.Embedder(model, "mean", n_ctx, n_seq, params["n_threads"])
    except ValueError:   # a refusal this process reports itself at embed()
        emb = None
    if emb is not None:
        emb.embed([ids[: max(1, n_ctx // n_seq)]] * min(n_seq, 4), True)
        stage("embedded")
print("ok")
"""

FOLDER = "model-probes"
# the settings that decide what llama.cpp builds (threads only change the schedule)
SETTINGS = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "n_threads_batch", "flash_attn", "type_k",
            "type_v", "n_gpu_layers", "use_mmap", "embed_n_ctx", "embed_n_seq_max", "split_mode", "main_gpu",
            "tensor_split", "use_mlock", "load_mode", *CONTEXT_KEYS)
# the fixed small context that tells a file at fault from settings at fault
SMALL_CTX = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_seq_max": 1, "n_threads": 1, "n_threads_batch": 1}


def _last_words(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    pick = [ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or "error" in ln.lower()]
    return (pick or lines or ["no message"])[-1][-300:]


def probe(model_path: Path, model_sha256: str, cfg: LoadConfig, *, adapter_path: Path | None = None,
          adapter_sha256: str | None = None) -> None:
    """Raise ModelFileError (the file) or InvalidOption (the settings) if loading the model
    (with the adapter) under ``cfg`` and running it kills a process. Cheap when this
    machine already probed the same files and settings. Placement is checked against the
    machine's GPUs first (InvalidOption)."""
    check_placement(cfg)
    settings = {k: getattr(cfg, k) for k in SETTINGS}
    settings["n_gpu_layers"] = cfg.n_gpu_layers if _native.cuda else 0
    key = hashlib.sha256(json.dumps([_native.llama_commit, model_sha256, adapter_sha256, settings,
                                     _native.cuda]).encode()).hexdigest()
    if cleared(FOLDER, key):
        return
    subject = adapter_path if adapter_path is not None else model_path
    done = _run_child(model_path, adapter_path, settings, None)
    if done is None:
        return
    if done.returncode < 0:
        _refuse(subject, model_path, adapter_path, settings, done)
    clear(FOLDER, key, persist=done.returncode == 0)


def _run_child(model_path: Path, adapter_path: Path | None, settings: dict[str, Any],
               ctx: dict[str, Any] | None) -> subprocess.CompletedProcess[str] | None:
    """The child's result; None when it could not tell (timeout, no child, the OOM killer)."""
    config = {k: v for k, v in settings.items() if k != "n_gpu_layers"}
    spec = {"model": str(model_path), "n_gpu_layers": settings["n_gpu_layers"], "config": config,
            "adapter": str(adapter_path) if adapter_path is not None else None,
            "ctx": None if ctx is None else dict(ctx, flash_attn=settings["flash_attn"], type_k=settings["type_k"],
                                                 type_v=settings["type_v"])}
    subject = adapter_path if adapter_path is not None else model_path
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=dict(os.environ, GGML_NO_BACKTRACE="1"), check=False)
    except subprocess.TimeoutExpired:
        log.warning("probing %s took longer than %g s; loading it unprobed", subject, TIMEOUT_S)
        return None
    except OSError as e:
        log.warning("could not probe %s in a child process (%s); loading it unprobed", subject, e)
        return None
    if done.returncode == -signal.SIGKILL:  # the OOM killer, most likely: not the file's fault
        log.warning("the probe of %s was killed (SIGKILL: out of memory?); loading it unprobed", subject)
        return None
    return done


def _refuse(subject: Path, model_path: Path, adapter_path: Path | None, settings: dict[str, Any],
            died: subprocess.CompletedProcess[str]) -> None:
    """The child died: blame the settings if the file survives small ones, else the file."""
    stages = [ln[6:] for ln in died.stdout.splitlines() if ln.startswith("stage:")]
    words = f"{signal_name(died.returncode)} in a probe process: {_last_words(died.stderr)}"
    if stages:  # the file loaded; does a small context survive?
        small = _run_child(model_path, adapter_path, settings, SMALL_CTX)
        if small is not None and small.returncode >= 0:
            where = "the embedding context" if stages[-1] == "decoded" else "the context"
            raise InvalidOption("config", {k: v for k, v in settings.items() if v is not None},
                                f"settings llama.cpp survives with this model: it dies running {where} "
                                f"with these ({words})", "config")
    raise ModelFileError(str(subject), f"llama.cpp dies loading or running it ({words})")
