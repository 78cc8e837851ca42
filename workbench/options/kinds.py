"""The option sets of the facade's calls, from the one definition of each option record:
``option_names(kind)`` (the keys a call accepts, for callers that forward a user's options:
LlamaCppEx's request_option_keys / start_option_keys), and the split of a call's keyword
options into its own record and the request options (``split_thinking`` for stream /
complete, ``split_chat`` for chat / chat_stream / render_chat_template)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import InvalidOption, UnknownOption
from .load import LoadConfig
from .request import ChatOptions, RequestOptions, ThinkingOptions
from .rules import build
from .rules import option_names as fields_of

T = TypeVar("T")

# stream / complete take the request options and thinking on the raw stream; chat /
# chat_stream their own (thinking included) and every request option
OPTION_SETS: dict[str, tuple[type, ...]] = {"load": (LoadConfig,), "request": (RequestOptions, ThinkingOptions),
                                            "chat": (ChatOptions, RequestOptions)}


def option_names(kind: Any) -> tuple[str, ...]:
    """The keys ``load_model`` ('load'), ``complete`` / ``stream`` ('request') or ``chat`` /
    ``chat_stream`` ('chat': its own and the request options) accept, in declaration order,
    each once."""
    if not isinstance(kind, str) or kind not in OPTION_SETS:
        raise InvalidOption("kind", kind, "one of " + ", ".join(repr(k) for k in OPTION_SETS))
    return tuple(dict.fromkeys(name for cls in OPTION_SETS[kind] for name in fields_of(cls)))


def split_thinking(opts: Mapping[str, Any]) -> tuple[ThinkingOptions, dict[str, Any]]:
    """stream() / complete()'s options: the thinking options as a ThinkingOptions, and the
    rest, which must be request options (UnknownOption naming every key the call takes).
    ``thinking_budget_tokens`` / ``thinking_markers`` are refused unless ``thinking=True``."""
    topts, rest = _split(ThinkingOptions, "request", opts)
    if not topts.thinking:
        for key in ("thinking_budget_tokens", "thinking_markers"):
            if getattr(topts, key) is not None:
                raise InvalidOption(key, getattr(topts, key), "None unless thinking=True")
    return topts, rest


def split_chat(opts: Mapping[str, Any]) -> tuple[ChatOptions, dict[str, Any]]:
    """A chat call's options: its own as a ChatOptions, and the rest, which must be request
    options (UnknownOption naming every key the call takes)."""
    return _split(ChatOptions, "chat", opts)


def _split(own: type[T], kind: str, opts: Mapping[str, Any]) -> tuple[T, dict[str, Any]]:
    """``opts`` split into the record ``own`` (built from its keys) and the request options
    as given (the caller builds its RequestOptions from them, once)."""
    own_keys, request_keys = fields_of(own), fields_of(RequestOptions)
    rest = {k: v for k, v in opts.items() if k not in own_keys}
    for k in rest:
        if k not in request_keys:
            raise UnknownOption(k, option_names(kind))
    return build(own, {k: v for k, v in opts.items() if k in own_keys}), rest
