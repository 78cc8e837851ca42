"""``option_names(kind)``: the option keys a call accepts, from the one definition of each
option set, for callers that forward a user's options (LlamaCppEx's request_option_keys /
start_option_keys)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidOption
from .load import LoadConfig
from .request import ChatOptions, RequestOptions, ThinkingOptions
from .rules import option_names as fields_of

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
