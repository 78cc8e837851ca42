#!/usr/bin/env python3
"""Continuous batching beside llama.cpp's llama-batched-bench, in one run.

1. Aggregate decode tokens/s with 1, 2, 4 and 8 concurrent streams. llama-batched-bench
   (same build, same model, context, batch sizes and threads) times ntg decode steps of
   npl sequences after their prompts; ours submits npl streams of npp random-token prompts
   at once and times from the first stream's first token to the last stream's last token.
2. Time to first token of a short request submitted while a 2,000-token prompt is being
   prefilled, with chunked prefill off, at the default chunk and at a small chunk.

    python bench/bench_batching.py [--npl 1,2,4,8] [--ntg 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import tool  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.options import default_threads  # noqa: E402

N_CTX = 8192


def batched_bench(model: Path, threads: int, npp: int, ntg: int, npl: list[int]) -> dict[int, float]:
    cmd = [str(tool("llama-batched-bench")), "-m", str(model), "-c", str(N_CTX), "-b", "2048", "-ub", "512",
           "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, npl)), "-t", str(threads),
           "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {int(r["pl"]): float(r["speed_tg"]) for r in rows}


def ours_aggregate(model: Path, threads: int, npp: int, ntg: int, npl: list[int], reps: int,
                   deterministic: bool = False) -> dict[int, float]:
    mid = wb.load_model(model_path=str(model), n_threads=threads, n_seq_max=max(npl), n_ctx=N_CTX,
                        deterministic=deterministic)
    rng = random.Random(5)
    n_vocab = wb.model_info(mid)["n_vocab"]
    out: dict[int, float] = {}
    try:
        wb.complete(mid, [rng.randrange(n_vocab) for _ in range(npp)], response_tokens=4)  # warm-up
        for n in npl:
            rates = []
            for _ in range(reps):
                streams = [wb.stream(mid, [rng.randrange(n_vocab) for _ in range(npp)],
                                     response_tokens=ntg + 1, ignore_eos=True) for _ in range(n)]
                for s in streams:
                    s.wait()
                reqs = [s._request for s in streams]
                first = min(r.first_token_at for r in reqs)
                last = max(r.last_token_at for r in reqs)
                rates.append(sum(len(r.generated) - 1 for r in reqs) / (last - first))
                for s in streams:
                    s.result()
            out[n] = statistics.mean(rates)
    finally:
        wb.unload(mid)
    return out


def ttft_under_prefill(model: Path, threads: int, chunk: int | None, long_tokens: int = 2000) -> float:
    mid = wb.load_model(model_path=str(model), n_threads=threads, n_seq_max=2, n_ctx=4096,
                        prefill_chunk_size=chunk)
    rng = random.Random(9)
    n_vocab = wb.model_info(mid)["n_vocab"]
    try:
        # cache off: each setting runs the same prompts (seed 9), and a hit on an earlier
        # setting's rows would time a restore, not the prefill beside a chunked one
        wb.complete(mid, [rng.randrange(n_vocab) for _ in range(16)], response_tokens=2, cache=False)  # warm-up
        long = wb.stream(mid, [rng.randrange(n_vocab) for _ in range(long_tokens)], response_tokens=2, cache=False)
        while wb.phase(mid) != "prefilling":
            time.sleep(0.001)
        time.sleep(0.05)
        short = wb.complete(mid, [rng.randrange(n_vocab) for _ in range(16)], response_tokens=2, cache=False)
        long.result()
        return short.stats.ttft_s
    finally:
        wb.unload(mid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--npl", default="1,2,4,8")
    ap.add_argument("--npp", type=int, default=16)
    ap.add_argument("--ntg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--deterministic", action="store_true", help="ours with load_model(deterministic=True)")
    args = ap.parse_args()
    model = wb.fetch_default_model()
    npl = [int(x) for x in args.npl.split(",")]
    ref = batched_bench(model, args.threads, args.npp, args.ntg, npl)
    got = ours_aggregate(model, args.threads, args.npp, args.ntg, npl, args.reps, args.deterministic)
    print(f"aggregate decode, {args.npp}-token prompts, {args.ntg} tokens each, {args.threads} threads")
    print(f"{'streams':>8}{'batched-bench tok/s':>22}{'workbench tok/s':>18}{'ratio':>8}")
    rows = {}
    for n in npl:
        rows[n] = {"batched_bench": ref[n], "workbench": got[n], "ratio": got[n] / ref[n]}
        print(f"{n:>8}{ref[n]:>22.1f}{got[n]:>18.1f}{got[n] / ref[n]:>8.3f}")
    print("\nTTFT of a 16-token request while a 2,000-token prompt is prefilled")
    ttft = {}
    for label, chunk in (("no chunking", None), ("chunk 512 (default)", -1), ("chunk 128", 128)):
        ttft[label] = ttft_under_prefill(model, args.threads, chunk)
        print(f"  {label:<22}{ttft[label] * 1000:>8.0f} ms")
    if args.json:
        args.json.write_text(json.dumps({"aggregate": rows, "ttft_s": ttft}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
