"""llama-workbench: a research workbench for local LLM inference over llama.cpp.

    import workbench as wb
    m = wb.load_model()                      # the default model, fetched once
    print(wb.complete(m, "The capital of France is").reply)
    for ev in wb.stream(m, "Once upon a time", response_tokens=32):
        ...
"""

from . import openmp  # noqa: F401 - first: loads _native with OpenMP's wait settings
from . import _native
from .api import (cancel, continue_session, counters, detokenize, end_session, history, last_cache_hit, list_models,
                  load_model, model_info, pending_len, phase, queue_depth, request_info, requests, reset_session,
                  sessions, tokenize, unload)
from .generation import complete, stream
from .engine.events import CompletionResult, Done, Error, Stats, Token, TokenId
from .api import chat, chat_stream, embed, embed_batch, render_chat_template
from .chat import ChatDone, ChatResult, ChatStream, RenderedChat
from .engine.events import Thinking, ThinkingEnd
from .chat.raw_thinking import ThinkingResult
from .api import (cached_prefix, cached_prefix_len, evict, list_adapters, load_adapter, prefill_only,
                  set_adapter_scale, shutdown, unload_adapter)
from .cache_admin import (add_tier, cache_chunks, cache_info, cache_rows, configure_cache, evict_bytes, list_tiers,
                          pin_row, remove_tier, unpin_row, wait_for_saves)
from .engine.stream import Stream
from .speculative import draft_tokens, verify
from .scoring import ScoreResult, loglikelihood, loglikelihood_rolling, score
from .ppl import PerplexityResult, perplexity
from .pressure import pressure, pressure_sources, start_pressure_monitor, stop_pressure_monitor
from .models.default import DEFAULT_MODEL, default_model_path, fetch_default_model
from .machine import vram_info
from .options.kinds import option_names

__version__ = _native.__version__

__all__ = [
    "CompletionResult", "DEFAULT_MODEL", "Done", "Error", "Stats", "Stream", "Token", "TokenId",
    "cancel", "complete", "continue_session", "counters", "default_model_path", "detokenize", "history",
    "end_session", "fetch_default_model", "last_cache_hit", "list_models", "load_model", "model_info",
    "pending_len", "phase", "queue_depth", "request_info", "requests", "reset_session", "sessions",
    "stream", "tokenize", "unload",
    "ChatDone", "ChatResult", "ChatStream", "RenderedChat", "Thinking", "ThinkingEnd", "ThinkingResult", "chat",
    "chat_stream",
    "embed", "embed_batch", "render_chat_template",
    "add_tier", "cache_chunks", "cache_info", "cache_rows", "cached_prefix", "cached_prefix_len", "configure_cache",
    "evict", "evict_bytes", "list_tiers", "pin_row", "prefill_only", "remove_tier", "shutdown", "unpin_row",
    "wait_for_saves",
    "pressure", "pressure_sources", "start_pressure_monitor", "stop_pressure_monitor",
    "list_adapters", "load_adapter", "set_adapter_scale", "unload_adapter",
    "draft_tokens", "verify",
    "PerplexityResult", "ScoreResult", "loglikelihood", "loglikelihood_rolling", "perplexity", "score",
    "option_names", "vram_info",
]

# every public call runs through the middleware chain (workbench/middleware.py), wrapped here,
# where it is exported: each name above is imported from the module that defines it, so
# `wb.complete.__wrapped__` is that function. The module itself is `wb.middleware` (add /
# remove / clear / timing)
from . import middleware  # noqa: E402

middleware.wrap_namespace(globals(), __all__)


def __getattr__(name: str):  # noqa: ANN202 - `wb.cluster` imports Ray, `wb.lab` pandas, `wb.serve` uvicorn, when used
    import importlib

    if name in ("cluster", "lab"):
        return importlib.import_module(f".{name}", __name__)
    if name == "serve":  # wb.serve(...): an OpenAI-compatible endpoint (workbench/server, docs/serving.md)
        return importlib.import_module(".server", __name__).serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython):  # noqa: ANN001 - IPython's hook, `%load_ext workbench`
    """Register the notebook magics (%wb, %%generate, %%chat); see workbench.notebook."""
    from .notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # noqa: ANN001 - `%unload_ext workbench`
    from .notebook import unload_ipython_extension as unload

    unload(ipython)
