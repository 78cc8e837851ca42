"""What the engine tells: a model id from its file name, a user's exception in a message,
the facts of a loaded model (``model_info``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import _native
from ..machine import vram_estimate_b
from .scheduler import strategy_name


def describe(e: Exception) -> str:
    try:
        return f"{type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - a user's exception whose str() raises
        return type(e).__name__


def model_id_for(path: Path, taken: set[str]) -> str:
    base = path.name.removesuffix(".gguf")
    base = base.lower() or "model"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    return candidate


def model_facts(eng: Any, live: dict[str, int]) -> dict[str, Any]:
    """``model_info()`` of an Engine; ``live``: its sequence counts, read under its lock."""
    m, c = eng.model, eng.ctx
    return {
        "model_id": eng.model_id,
        "path": str(eng.path),
        "fingerprint": eng.fingerprint,
        "desc": m.desc,
        "quant_tag": m.quant_tag,
        "loaded_at": eng.loaded_at,
        "vram_estimate_b": vram_estimate_b(c),
        "last_cache_hit": None if eng.last_hit is None else dict(eng.last_hit),
        "n_params": m.n_params,
        "size_bytes": m.size,
        "n_vocab": m.n_vocab,
        "n_ctx_train": m.n_ctx_train,
        "n_ctx": c.n_ctx,
        "n_batch": c.n_batch,
        "n_ubatch": c.n_ubatch,
        "n_seq_max": c.n_seq_max,
        "n_threads": c.n_threads,
        "flash_attn": eng.ctx_params["flash_attn"],
        "type_k": eng.ctx_params["type_k"],
        "type_v": eng.ctx_params["type_v"],
        "prefill_chunk_size": eng.chunk,
        "batch_strategy": strategy_name(eng.strategy),
        "deterministic": bool(eng.cfg.deterministic),
        **live,
        "phase": eng.phase,
        "queue_depth": len(eng.table.active),
        "pending_len": len(eng.table.pending),
        "grammar_cache": eng.grammars.stats(),
        "adapters": [a.info() for a in eng.adapter_list()],
        "has_chat_template": m.chat_template is not None,
        "gpu": bool(_native.cuda),
    }
