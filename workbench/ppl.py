"""Perplexity by llama.cpp's method (tools/perplexity, its ``perplexity()``), so the number
is the one ``llama-perplexity -f FILE -c N_CTX`` prints for the same model and text.

The text is tokenized with the model's BOS and split into chunks of ``n_ctx`` tokens (a
tail shorter than that is dropped); each chunk's first token is replaced by BOS when the
vocabulary adds one, the chunk is decoded from an empty context, and only its second half
is scored (every token after position ``n_ctx // 2``: the first half is context). PPL =
exp(mean negative logprob), with llama.cpp's uncertainty estimate.

The chunks are scoring requests (engine/scoring.py), run one at a time: the tool gives each
sequence a KV stream of its own, the engine one unified KV, and a chunk decoded beside
another attends over a range holding the other's (masked) cells, which moves ggml's CPU
flash attention's f16 accumulation: about 0.15% on the perplexity here (measured). One at a
time, each chunk's ubatches and attention range are the tool's, and so is the number, as
long as no other sequence of the model holds KV; the compute is the same (a 512-token chunk
fills a ubatch either way).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import registry
from .errors import InvalidOption
from .options import RequestOptions, build, check_int
from .scoring import run_scoring, text_tokens

DEFAULT_N_CTX = 512


@dataclass
class PerplexityResult:
    """``perplexity`` and its ``stderr`` (llama.cpp's "Final estimate: PPL = x +/- y"),
    ``estimates`` the running estimate after each chunk (the numbers llama-perplexity prints
    as it goes), the chunk size, the tokens scored and the wall time of the scoring."""

    model: str
    perplexity: float
    stderr: float
    n_ctx: int
    n_chunks: int
    n_scored: int
    estimates: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        """Tokens decoded (every token of every chunk) per second of wall time."""
        return self.n_chunks * self.n_ctx / self.seconds if self.seconds > 0 else math.nan

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"<PerplexityResult {self.model}: PPL = {self.perplexity:.4f} +/- {self.stderr:.5f} "
               f"({self.n_chunks} chunks of {self.n_ctx}, {self.n_scored} tokens scored, "
               f"{self.tokens_per_s:.0f} tok/s)>")


def perplexity(model: str, text: str, *, n_ctx: int = DEFAULT_N_CTX, n_chunks: int | None = None) -> PerplexityResult:
    """The perplexity of ``text`` by llama-perplexity's method with chunks of ``n_ctx``
    tokens (``n_chunks``: only the first so many, as its ``--chunks``)."""
    eng = registry.get(model)
    if not isinstance(text, str):
        raise InvalidOption("text", text, "a string")
    n_ctx = check_int("n_ctx", n_ctx, 16, eng.ctx.n_ctx - 1)
    tokens = text_tokens(eng, text, True)
    if len(tokens) < 2 * n_ctx:
        raise InvalidOption("text", f"{len(tokens)} tokens", f"at least 2 * n_ctx = {2 * n_ctx} tokens "
                            "(llama-perplexity's rule)")
    count = len(tokens) // n_ctx
    if n_chunks is not None:
        count = min(count, check_int("n_chunks", n_chunks, 1))
    first = n_ctx // 2
    jobs = [(_chunk(eng, tokens, i, n_ctx), first, 0) for i in range(count)]
    opts = build(RequestOptions, None, response_tokens=0, cache=False)
    t0 = time.perf_counter()
    states = run_scoring(eng, jobs, opts, in_flight=1)   # one chunk at a time: see the module doc
    seconds = time.perf_counter() - t0
    return _result(model, [s.arrays()[1] for s in states], n_ctx, seconds)


def _chunk(eng: Any, tokens: list[int], i: int, n_ctx: int) -> list[int]:
    chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
    if eng.model.add_bos:
        chunk[0] = eng.model.bos
    return chunk


def _result(model: str, chunk_logprobs: list[Any], n_ctx: int, seconds: float) -> PerplexityResult:
    nll = nll2 = 0.0
    count = 0
    estimates = []
    for lp in chunk_logprobs:
        nll -= float(np.sum(lp))
        nll2 += float(np.sum(np.square(lp)))
        count += len(lp)
        estimates.append(math.exp(nll / count))
    mean, mean2 = nll / count, nll2 / count
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    stderr = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else math.nan
    return PerplexityResult(model, ppl, stderr, n_ctx, len(chunk_logprobs), count, estimates, seconds)
