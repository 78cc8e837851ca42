"""Tokenising with the work bounded before llama.cpp sees the text.

llama.cpp's special-token partition is quadratic in the number of special tokens in a text
(64,000 ``<|im_start|>`` took 5 to 7 s, a 1.7 M-character text over 20 s), so a text whose
tokens cannot fit where they are going is refused before it is tokenised. No text of n
UTF-8 bytes has fewer than ceil(n / max_piece_bytes) tokens (the model's longest token
piece, special tokens included), so the refusal never changes a result that would fit.
"""

from __future__ import annotations

from typing import Any

from ..errors import ContextOverflow


def at_least(native_model: Any, text: str) -> int:
    """A lower bound on the number of tokens of ``text`` (without BOS/EOS)."""
    n_bytes = len(text.encode("utf-8", "surrogatepass"))  # lone surrogates: the native call names them
    return -(-n_bytes // max(1, native_model.max_piece_bytes))


def tokenize_within(native_model: Any, text: str, add_special: bool, parse_special: bool, limit: int,
                    where: str) -> list[int]:
    """The tokens of ``text``; ContextOverflow without tokenising when they cannot number at
    most ``limit``. ``where``: what the limit is, for the message."""
    bound = at_least(native_model, text)
    if bound > limit:
        raise ContextOverflow(bound, limit, f"at least {bound} tokens: {where}; refused before tokenising")
    return native_model.tokenize(text, add_special, parse_special)
