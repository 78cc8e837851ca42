#!/usr/bin/env python3
"""Scoring against llama.cpp's own tool, in one run: `wb.perplexity` beside
`llama-perplexity` (built by `make tools` from the same tree and flags) on the same file,
model, chunk size, batch and threads, and `wb.loglikelihood` on multiple-choice questions
with and without the prefix cache (a question's context prefilled once).

Perplexity: both numbers, their relative difference (target: within 0.1%) and the tokens/s
of each (every token of every chunk decoded, over the scoring's wall time: the tool's from
its log's clock, "calculating perplexity" to "Final estimate", ours from the first request
to the last; target: ours >= 0.9x). Loglikelihood: seconds and prefilled tokens for `--questions` questions of
`--choices` choices each, cache on and off, and whether both give the same answers.

    python bench/bench_eval.py [--file tests/integration/data/licenses.txt] [--n-ctx 512]
                               [--questions 12] [--choices 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from _paths import ROOT, tool

import workbench as wb

DEFAULT_FILE = ROOT / "tests" / "integration" / "data" / "licenses.txt"


def llama_perplexity(model_path: str, path: Path, n_ctx: int, threads: int) -> dict[str, Any]:
    cmd = [str(tool("llama-perplexity")), "-m", model_path, "-f", str(path), "-c", str(n_ctx), "-b", "2048",
           "-t", str(threads)]
    log = subprocess.run(cmd, capture_output=True, text=True, check=True)
    text = log.stdout + log.stderr
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", text).group(1))  # type: ignore[union-attr]
    chunks = len(re.findall(r"\[\d+\][0-9.]+,", text))
    # the log's own clock (minutes.seconds.ms.us since start): "calculating perplexity" to the estimate
    begin, end = (_log_seconds(text, key) for key in ("calculating perplexity", "Final estimate"))
    return {"perplexity": ppl, "chunks": chunks, "tokens_per_s": chunks * n_ctx / (end - begin),
            "command": " ".join(cmd[1:])}


def _log_seconds(text: str, key: str) -> float:
    # the timestamp right before the key: a line the tool ends without a newline ("... ETA")
    # runs into the next one
    m = re.search(r"(\d+)\.(\d+)\.(\d+)\.(\d+) I (?:\w+: )?" + re.escape(key), text)
    if m is None:
        raise SystemExit(f"llama-perplexity's log has no line with {key!r}")
    minutes, seconds, ms, us = (int(g) for g in m.groups())
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


def ours(model: str, path: Path, n_ctx: int) -> dict[str, Any]:
    r = wb.perplexity(model, path.read_text(), n_ctx=n_ctx)
    return {"perplexity": r.perplexity, "stderr": r.stderr, "chunks": r.n_chunks, "tokens_per_s": r.tokens_per_s}


def questions(text: str, n: int, choices: int) -> list[tuple[str, str]]:
    """n contexts of ~300 tokens cut from the text, each with `choices` continuations."""
    words = text.split()
    pairs = []
    for q in range(n):
        context = " ".join(words[q * 240:(q * 240) + 220]) + "\nQuestion: which word comes next? Answer:"
        pairs += [(context, " " + words[(q * 240) + 220 + c]) for c in range(choices)]
    return pairs


def loglikelihood(model: str, pairs: list[tuple[str, str]], cache: bool) -> dict[str, Any]:
    before = len(wb.history(model))
    t0 = time.perf_counter()
    out = wb.loglikelihood(model, pairs, cache=cache, cache_scope=f"bench-eval-{time.time_ns()}")
    seconds = time.perf_counter() - t0
    prefilled = sum(h["prefilled_tokens"] for h in wb.history(model)[before:])
    return {"seconds": seconds, "prefilled_tokens": prefilled, "answers": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--choices", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    path = str(wb.fetch_default_model())
    model = wb.load_model(model_path=path, n_threads=a.threads, decode_budget_ms=0)
    theirs = llama_perplexity(path, a.file, a.n_ctx, a.threads)
    mine = ours(model, a.file, a.n_ctx)
    pairs = questions(a.file.read_text(), a.questions, a.choices)
    cold, warm = loglikelihood(model, pairs, False), loglikelihood(model, pairs, True)   # default mode
    exact = wb.load_model(model_path=path, n_threads=a.threads, decode_budget_ms=0, deterministic=True,
                          model_id="bench-eval-deterministic")
    exact_cold, exact_warm = loglikelihood(exact, pairs, False), loglikelihood(exact, pairs, True)
    report = {
        "perplexity": {"workbench": mine, "llama-perplexity": theirs,
                       "relative_difference": abs(mine["perplexity"] / theirs["perplexity"] - 1),
                       "tokens_per_s_ratio": mine["tokens_per_s"] / theirs["tokens_per_s"]},
        "loglikelihood": {"pairs": len(pairs), "cache_off": {k: v for k, v in cold.items() if k != "answers"},
                          "cache_on": {k: v for k, v in warm.items() if k != "answers"},
                          "same_greedy": [g for _, g in cold["answers"]] == [g for _, g in warm["answers"]],
                          "max_abs_difference": max(abs(x[0] - y[0]) for x, y in zip(cold["answers"], warm["answers"])),
                          "speedup": cold["seconds"] / warm["seconds"]},
        "loglikelihood_deterministic": {
            "cache_off": {k: v for k, v in exact_cold.items() if k != "answers"},
            "cache_on": {k: v for k, v in exact_warm.items() if k != "answers"},
            "max_abs_difference": max(abs(x[0] - y[0]) for x, y in zip(exact_cold["answers"], exact_warm["answers"])),
            "speedup": exact_cold["seconds"] / exact_warm["seconds"]},
    }
    print(json.dumps(report, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
