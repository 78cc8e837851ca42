#!/usr/bin/env python3
"""Warm equals cold, counted: exact hits on rows saved after partial restores ("continued"
rows) against cold runs of the same prompts, on the default model.

N prompts share a system prefix (a few hundred tokens of varied text) and differ in their
question. Pass 1 stores them: the first cold, the others partial hits on the shared prefix,
each saving its prompt's row. Pass 2 asks again: every request is an exact hit. Each reply
(greedy) is compared with the same prompt run with ``cache=False``. Printed: hit kinds
and how many replies differ, per mode (the default, and ``deterministic=True``).

``--turns``: the same over a second turn instead: turn 1 runs with the cache, then turn 2
(turn 1's prompt + its reply + a new question) runs twice (a partial hit on what turn 1
stored, saving a continued row; then an exact hit on that row), each compared with turn 2
run with ``cache=False``. On a deterministic model turn 1 stores a finish row (its prompt
and its reply, whose KV one-row decodes computed) and turn 2 restores it; in the default
mode no row holds decoded KV, so turn 2 restores turn 1's prompt row and prefills the
reply. ``reused`` is the mean number of turn 2's prompt tokens restored, of ``turn2_tokens``.

``--shared-tier SECONDS``: two processes share one disk tier for that long, each asking the
prompts in its own random order (one stream each), so each finds the rows the other saved
(cold, partial and exact hits, across processes); afterwards every reply is compared with
its prompt run cold. Printed per mode: hit kinds and how many of each kind differ.

    python bench/warm_cold.py [--prompts 100] [--tokens 24] [--modes default,deterministic] [--turns]
                              [--shared-tier 60]
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


def second_turns(texts: list[str], replies: list[str], seed: int = 1) -> list[str]:
    """Each prompt, its reply and a new question (from ``prompts(.., seed)``): a chat's turn 2."""
    follow = prompts(len(texts), seed=seed)
    return [t + r + "<|im_end|>\n" + f.split("<|im_start|>user\n", 1)[1] for t, r, f in zip(texts, replies, follow)]


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
    turn2 = second_turns(texts, [r.reply for r in turn1])
    cold = [wb.complete(mid, t, response_tokens=tokens, cache=False).tokens for t in turn2]
    partial = [wb.complete(mid, t, response_tokens=tokens) for t in turn2]
    wb.wait_for_saves()
    exact = [wb.complete(mid, t, response_tokens=tokens) for t in turn2]
    out: dict[str, object] = {"mode": mode, "prompts": len(texts),
                              "turn2_tokens": round(sum(r.stats.prompt_tokens for r in partial) / len(texts), 1),
                              "reused": round(sum(r.stats.prompt_tokens - r.stats.prefilled_tokens
                                                  for r in partial) / len(texts), 1)}
    for name, results in (("turn2_first", partial), ("turn2_again", exact)):
        out[name] = dict(Counter(r.stats.cache_hit_kind for r in results))
        out[name + "_differ"] = sum(r.tokens != c for r, c in zip(results, cold))
    wb.unload(mid)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


PEER = """
import json, random, sys, time
import workbench as wb
root, mode, seed, seconds, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
texts = json.loads(sys.stdin.read())
wb.configure_cache([{"kind": "disk", "root": root, "budget_bytes": 1 << 30}])
m = wb.load_model(deterministic=mode == "deterministic")
rng, out, end = random.Random(seed), [], time.monotonic() + seconds
while time.monotonic() < end:
    i = rng.randrange(len(texts))
    r = wb.complete(m, texts[i], response_tokens=tokens)
    out.append([i, r.stats.cache_hit_kind, list(r.tokens)])
wb.wait_for_saves(60)
print(json.dumps(out))
"""


def run_shared_tier(mode: str, texts: list[str], tokens: int, seconds: float) -> dict[str, object]:
    """Two processes over one disk tier for ``seconds`` (see the module doc)."""
    import json
    import subprocess
    import tempfile
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        peers = [subprocess.Popen([sys.executable, "-c", PEER, root, mode, str(seed), str(seconds), str(tokens)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for seed in (1, 2)]
        outs = [p.communicate(json.dumps(texts), timeout=seconds + 600)[0] for p in peers]
    asked = [row for out in outs for row in json.loads(out)]
    wb.configure_cache([{"kind": "ram"}])
    mid = wb.load_model(model_id=f"warm-cold-peers-{mode}", deterministic=mode == "deterministic")
    cold = {i: list(wb.complete(mid, texts[i], response_tokens=tokens, cache=False).tokens)
            for i in sorted({row[0] for row in asked})}
    wb.unload(mid)
    kinds = Counter(kind for _, kind, _ in asked)
    differ = Counter(kind for i, kind, got in asked if got != cold[i])
    return {"mode": mode, "prompts": len(texts), "requests": len(asked), "kinds": dict(kinds),
            "differ": {k: differ.get(k, 0) for k in kinds}, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--modes", default="default,deterministic")
    ap.add_argument("--turns", action="store_true", help="a second turn over what the first stored (see above)")
    ap.add_argument("--shared-tier", type=float, default=0.0, metavar="SECONDS",
                    help="two processes sharing one disk tier for SECONDS (see above)")
    args = ap.parse_args()
    texts = prompts(args.prompts)
    for mode in args.modes.split(","):
        if args.shared_tier:
            print(run_shared_tier(mode, texts, args.tokens, args.shared_tier), flush=True)
        else:
            print((run_turns if args.turns else run)(mode, texts, args.tokens), flush=True)


if __name__ == "__main__":
    main()
