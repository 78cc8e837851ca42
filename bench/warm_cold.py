#!/usr/bin/env python3
"""Warm equals cold, counted: exact hits on rows saved after partial restores ("continued"
rows) against cold runs of the same prompts, on the default model.

N prompts share a system prefix (a few hundred tokens of varied text) and differ in their
question. Pass 1 stores them: the first cold, the others partial hits on the shared prefix,
each saving its prompt's row. Pass 2 asks again: every request is an exact hit. Each reply
(greedy) is compared with the same prompt run with ``cache=False``. Printed: hit kinds
and how many replies differ, per mode (the default, and ``deterministic=True``).

``--turns``: the same over a second turn instead, where the prefix restored is a finish row
(the first turn's prompt and its generated reply, whose KV was computed by one-row decodes):
turn 1 runs with the cache, then turn 2 (turn 1's prompt + its reply + a new question) runs
twice (a partial hit on turn 1's finish row, saving a continued row; then an exact hit on
that row), each compared with turn 2 run with ``cache=False``.

    python bench/warm_cold.py [--prompts 100] [--tokens 24] [--modes default,deterministic] [--turns]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workbench as wb  # noqa: E402

WORDS = (Path(__file__).resolve().parents[1] / "docs" / "cache.md").read_text().split()


def prompts(n: int, seed: int = 0, system_words: int = 220) -> list[str]:
    """``n`` chat prompts under one system prompt (220 words: ~300 tokens), each with its own
    question (also tests/integration/test_warm_equals_cold.py's)."""
    rng = random.Random(seed)
    start = rng.randrange(len(WORDS) - 400)
    system = " ".join(WORDS[start:start + system_words])
    out = []
    for _ in range(n):
        s = rng.randrange(len(WORDS) - 60)
        question = " ".join(WORDS[s:s + rng.randrange(8, 50)])
        out.append(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nSummarise: {question}"
                   f"<|im_end|>\n<|im_start|>assistant\n")
    return out


def run(mode: str, texts: list[str], tokens: int) -> dict[str, object]:
    wb.configure_cache([{"kind": "ram"}])   # an empty cache
    mid = wb.load_model(model_id=f"warm-cold-{mode}", deterministic=mode == "deterministic")
    t0 = time.perf_counter()
    cold = [wb.complete(mid, t, response_tokens=tokens, cache=False).tokens for t in texts]
    pass1 = [wb.complete(mid, t, response_tokens=tokens) for t in texts]
    wb.wait_for_saves()
    pass2 = [wb.complete(mid, t, response_tokens=tokens) for t in texts]
    kinds1 = Counter(r.stats.cache_hit_kind for r in pass1)
    kinds2 = Counter(r.stats.cache_hit_kind for r in pass2)
    diff1 = sum(r.tokens != c for r, c in zip(pass1, cold))
    diff2 = sum(r.tokens != c for r, c in zip(pass2, cold) if r.stats.cache_hit_kind == "exact")
    wb.unload(mid)
    return {"mode": mode, "prompts": len(texts), "pass1": dict(kinds1), "pass1_differ": diff1,
            "pass2": dict(kinds2), "exact_differ": diff2, "seconds": round(time.perf_counter() - t0, 1)}


def run_turns(mode: str, texts: list[str], tokens: int) -> dict[str, object]:
    wb.configure_cache([{"kind": "ram"}])   # an empty cache
    mid = wb.load_model(model_id=f"warm-cold-turns-{mode}", deterministic=mode == "deterministic")
    t0 = time.perf_counter()
    turn1 = [wb.complete(mid, t, response_tokens=tokens) for t in texts]
    wb.wait_for_saves()
    follow = prompts(len(texts), seed=1)
    turn2 = [t + r.reply + "<|im_end|>\n" + f.split("<|im_start|>user\n", 1)[1]
             for t, r, f in zip(texts, turn1, follow)]
    cold = [wb.complete(mid, t, response_tokens=tokens, cache=False).tokens for t in turn2]
    partial = [wb.complete(mid, t, response_tokens=tokens) for t in turn2]
    wb.wait_for_saves()
    exact = [wb.complete(mid, t, response_tokens=tokens) for t in turn2]
    out: dict[str, object] = {"mode": mode, "prompts": len(texts)}
    for name, results in (("turn2_first", partial), ("turn2_again", exact)):
        out[name] = dict(Counter(r.stats.cache_hit_kind for r in results))
        out[name + "_differ"] = sum(r.tokens != c for r, c in zip(results, cold))
    wb.unload(mid)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--modes", default="default,deterministic")
    ap.add_argument("--turns", action="store_true", help="a second turn over a finish row (see above)")
    args = ap.parse_args()
    texts = prompts(args.prompts)
    for mode in args.modes.split(","):
        print((run_turns if args.turns else run)(mode, texts, args.tokens), flush=True)


if __name__ == "__main__":
    main()
