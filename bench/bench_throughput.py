#!/usr/bin/env python3
"""Prefill and decode throughput of workbench beside llama.cpp's own llama-bench, one run.

Same model file, same vendored llama.cpp build, same threads, batch sizes, KV type and
flash-attention setting. llama-bench's pp512 times one llama_decode of 512 prompt tokens;
its tg128 times 128 single-token decodes. Ours: a 512-token prompt (random ids, like
llama-bench's) through ``complete`` timed from the start to the end of its prefill, and 128
generated tokens timed from the first to the last (sampling and Python included).

    python bench/bench_throughput.py [--reps 5] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import tool  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.options import default_threads  # noqa: E402


def llama_bench(model: Path, threads: int, reps: int, n_prompt: int, n_gen: int) -> dict[str, float]:
    cmd = [str(tool("llama-bench")), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen),
           "-t", str(threads), "-r", str(reps), "-fa", "auto", "-b", "2048", "-ub", "512", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    result = {}
    for row in rows:
        key = "prefill" if row["n_prompt"] > 0 else "decode"
        result[key] = float(row["avg_ts"])
    return result


def ours(model: Path, threads: int, reps: int, n_prompt: int, n_gen: int) -> dict[str, float]:
    mid = wb.load_model(model_path=str(model), n_threads=threads, n_batch=2048, n_ubatch=512,
                        flash_attn="auto", n_seq_max=1, prefill_chunk_size=None,
                        n_ctx=max(n_prompt, n_gen) + 256)
    rng = random.Random(1234)
    n_vocab = wb.model_info(mid)["n_vocab"]
    prefill, decode = [], []
    try:
        wb.complete(mid, [rng.randrange(n_vocab) for _ in range(64)], response_tokens=4)  # warm-up
        for _ in range(reps):
            prompt = [rng.randrange(n_vocab) for _ in range(n_prompt)]
            r = wb.complete(mid, prompt, response_tokens=1)
            prefill.append(n_prompt / r.stats.prefill_s)
            r = wb.complete(mid, [rng.randrange(n_vocab)], response_tokens=n_gen + 1, ignore_eos=True)
            decode.append(r.stats.decode_tps)
    finally:
        wb.unload(mid)
    return {"prefill": statistics.mean(prefill), "decode": statistics.mean(decode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    model = args.model or wb.fetch_default_model()
    ref = llama_bench(model, args.threads, args.reps, args.n_prompt, args.n_gen)
    got = ours(model, args.threads, args.reps, args.n_prompt, args.n_gen)
    print(f"model {model.name}, {args.threads} threads, {args.reps} reps, llama.cpp {wb._native.llama_commit[:10]}")
    print(f"{'test':<16}{'llama-bench tok/s':>20}{'workbench tok/s':>18}{'ratio':>8}")
    rows = {}
    for key, label in (("prefill", f"prefill pp{args.n_prompt}"), ("decode", f"decode tg{args.n_gen}")):
        ratio = got[key] / ref[key]
        rows[key] = {"llama_bench": ref[key], "workbench": got[key], "ratio": ratio}
        print(f"{label:<16}{ref[key]:>20.1f}{got[key]:>18.1f}{ratio:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "reps": args.reps, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
