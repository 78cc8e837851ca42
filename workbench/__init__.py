"""llama-workbench: a research workbench for local LLM inference over llama.cpp.

    import workbench as wb
    m = wb.load_model()                      # the default model, fetched once
    print(wb.complete(m, "The capital of France is").reply)
    for ev in wb.stream(m, "Once upon a time", response_tokens=32):
        ...
"""

from . import _native
from .api import (cancel, complete, continue_session, counters, detokenize, end_session, last_cache_hit,
                  list_models, load_model, model_info, pending_len, phase, queue_depth, request_info,
                  requests, reset_session, sessions, stream, tokenize, unload)
from .engine.events import CompletionResult, Done, Error, Stats, Token, TokenId
from .engine.stream import Stream
from .models import DEFAULT_MODEL, default_model_path, fetch_default_model

__version__ = _native.__version__

__all__ = [
    "CompletionResult", "DEFAULT_MODEL", "Done", "Error", "Stats", "Stream", "Token", "TokenId",
    "cancel", "complete", "continue_session", "counters", "default_model_path", "detokenize",
    "end_session", "fetch_default_model", "last_cache_hit", "list_models", "load_model", "model_info",
    "pending_len", "phase", "queue_depth", "request_info", "requests", "reset_session", "sessions",
    "stream", "tokenize", "unload",
]
