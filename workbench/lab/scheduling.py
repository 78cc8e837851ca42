"""The scheduling lab: run one workload under several batch strategies and compare each
request's time to first token and inter-token latency.

    from workbench.lab import scheduling
    df = scheduling.compare_strategies(["decode_first", "prefill_first", "round_robin"])
    workbench.notebook.plots.strategy_latencies(df)

Each strategy gets a model of its own (``load_model(batch_strategy=...)``, loaded and
unloaded here) with a small batch, so that rows are scarce and the strategies' choices
show: with the default n_batch of 2048 a few requests fit in one batch whatever the order.
The requests are started together and read to the end; the figures come from each
request's own Stats (engine clock), not from when a reader thread saw the tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

import workbench as wb

# rows are scarce: a long prompt needs several ticks while short requests decode
SMALL_BATCH: dict[str, Any] = {"n_batch": 32, "n_ubatch": 32, "prefill_chunk_size": 16, "n_seq_max": 4,
                               "cache": False}
COLUMNS = ["strategy", "request", "kind", "prompt_tokens", "generated_tokens", "ttft_s", "itl_s"]


def mixed_workload(n_long: int = 2, n_short: int = 2) -> list[dict[str, Any]]:
    """Long prompts with short replies beside short prompts with longer replies (greedy,
    fixed lengths, so every strategy does exactly the same work)."""
    long = [{"prompt": f"Text {i}: " + "The history of the city, street by street. " * 10, "response_tokens": 4}
            for i in range(n_long)]
    short = [{"prompt": f"Count with me: {i}, {i + 1},", "response_tokens": 16} for i in range(n_short)]
    jobs = [job for pair in zip(short, long) for job in pair] + short[len(long):] + long[len(short):]
    return [dict(job, ignore_eos=True) for job in jobs]


def run_workload(model: str, jobs: Sequence[Mapping[str, Any]], strategy: str) -> pd.DataFrame:
    """Start every job at once on ``model``, wait for all; one row per request."""
    streams = [wb.stream(model, **job) for job in jobs]
    rows = []
    for i, s in enumerate(streams):
        st = s.result().stats
        n = st.generated_tokens
        rows.append({"strategy": strategy, "request": i, "kind": "long" if st.prompt_tokens > 32 else "short",
                     "prompt_tokens": st.prompt_tokens, "generated_tokens": n, "ttft_s": st.ttft_s,
                     "itl_s": st.decode_s / (n - 1) if n > 1 else None})
    return pd.DataFrame(rows, columns=COLUMNS)


def compare_strategies(strategies: Iterable[Any], jobs: Sequence[Mapping[str, Any]] | None = None, *,
                       model_path: str | None = None, load: Mapping[str, Any] | None = None,
                       repeats: int = 1) -> pd.DataFrame:
    """Per request and strategy: ttft_s, mean inter-token latency itl_s, prompt tokens.
    A strategy is a built-in name or a user's object; ``load`` overrides SMALL_BATCH."""
    jobs = list(jobs) if jobs is not None else mixed_workload()
    frames = []
    for strategy in strategies:
        name = strategy if isinstance(strategy, str) else type(strategy).__name__
        mid = wb.load_model(model_path=model_path, **{**SMALL_BATCH, **(load or {})}, batch_strategy=strategy)
        try:
            run_workload(mid, [dict(jobs[0], response_tokens=2)], name)   # first-call costs out of the figures
            frames += [run_workload(mid, jobs, name) for _ in range(repeats)]
        finally:
            wb.unload(mid)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
