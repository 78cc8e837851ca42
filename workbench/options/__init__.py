"""Validated option and config records.

Each record is a frozen dataclass built from a plain dict by :func:`build`, which tells an
unknown key (:class:`~workbench.errors.UnknownOption`) from a value of the wrong type or
range (:class:`~workbench.errors.InvalidOption`) and names both. Defaults follow erllama
0.10 where it has one (``response_tokens`` = 64).

    rules.py    the value rules (check_*, the as_* field checkers), opt, build
    load.py     LoadConfig and the llama.cpp context parameters it resolves to
    request.py  RequestOptions (with SpeculativeOptions) and ChatOptions
"""

from .load import (BATCH_STRATEGIES, DEFAULT_EMBED_N_CTX, DEFAULT_N_CTX, KV_CACHE_TYPES, LoadConfig, context_params,
                   embed_params)
from .request import NGRAM_KINDS, ChatOptions, RequestOptions, SpeculativeOptions, ThinkingOptions
from .rules import (INT32_MAX, build, check_bool, check_int, check_number, check_scope, check_session_id,
                    default_threads, opt, option_names)

__all__ = ["BATCH_STRATEGIES", "DEFAULT_EMBED_N_CTX", "DEFAULT_N_CTX", "INT32_MAX", "KV_CACHE_TYPES", "NGRAM_KINDS",
           "ChatOptions", "LoadConfig", "RequestOptions", "SpeculativeOptions", "ThinkingOptions", "build", "check_bool", "check_int",
           "check_number", "check_scope", "check_session_id", "context_params", "default_threads", "embed_params",
           "opt", "option_names"]
