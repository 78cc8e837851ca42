"""Validated option and config records.

Each record is a frozen dataclass built from a plain dict by :func:`build`, which tells an
unknown key (:class:`~workbench.errors.UnknownOption`) from a value of the wrong type or
range (:class:`~workbench.errors.InvalidOption`) and names both. Defaults follow erllama
0.10 where it has one (``response_tokens`` = 64).

    rules.py    the value rules (check_*, the as_* field checkers), opt, build, amend
    load.py     LoadConfig and the llama.cpp context parameters it resolves to
    placement.py  placement over GPUs, the load mode, the KV-layout overrides (RoPE/YaRN)
    kinds.py    option_names(kind): the keys load_model / complete / chat accept; split_thinking /
                split_chat: a call's keyword options into its own record and the request options
    request.py  RequestOptions (with SpeculativeOptions), ThinkingOptions and ChatOptions
"""

from .load import (BATCH_STRATEGIES, DEFAULT_EMBED_N_CTX, DEFAULT_N_CTX, KV_CACHE_TYPES, LoadConfig, context_params,
                   embed_params)
from .kinds import split_chat, split_thinking
from .placement import CONTEXT_KEYS, ROPE_KEYS, model_params, resolved_load_mode
from .request import NGRAM_KINDS, ChatOptions, RequestOptions, SpeculativeOptions, ThinkingOptions
from .rules import (INT32_MAX, amend, build, check_bool, check_int, check_number, check_scope, check_session_id,
                    default_threads, opt, option_names)

__all__ = ["BATCH_STRATEGIES", "CONTEXT_KEYS", "ChatOptions", "DEFAULT_EMBED_N_CTX", "DEFAULT_N_CTX", "INT32_MAX",
           "KV_CACHE_TYPES", "LoadConfig", "NGRAM_KINDS", "ROPE_KEYS", "RequestOptions", "SpeculativeOptions",
           "ThinkingOptions", "amend", "build", "check_bool", "check_int", "check_number", "check_scope",
           "check_session_id", "context_params", "default_threads", "embed_params", "model_params", "opt",
           "option_names", "resolved_load_mode", "split_chat", "split_thinking"]
