#!/usr/bin/env python3
"""What the OpenAI-compatible endpoint costs: the same concurrent streaming load in-process
(`wb.stream`, `async for`) and through `wb.serve()` with the official openai SDK's async
client, alternated in one run on one loaded model.

Each round: `--streams` requests at once, `--tokens` tokens each (ignore_eos, greedy, cache
off so every round prefills alike). Reported: the median wall time and tokens/s of each
side over `--rounds` rounds, their ratio, and the endpoint's median TTFT beside the engine's.

    python bench/bench_endpoint.py [--streams 16] [--tokens 48] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import workbench as wb


async def _direct(model: str, streams: int, tokens: int) -> list[float]:
    async def one(i: int) -> float:
        start = time.monotonic()
        ttft = None
        async for ev in wb.stream(model, f"Story number {i}:", response_tokens=tokens, ignore_eos=True, cache=False):
            if ttft is None and isinstance(ev, wb.Token):
                ttft = time.monotonic() - start
        return ttft or 0.0

    return list(await asyncio.gather(*[one(i) for i in range(streams)]))


async def _endpoint(url: str, model: str, streams: int, tokens: int) -> list[float]:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        async def one(i: int) -> float:
            start = time.monotonic()
            ttft = None
            s = await client.completions.create(model=model, prompt=f"Story number {i}:", max_tokens=tokens,
                                                temperature=0, stream=True,
                                                extra_body={"ignore_eos": True, "workbench": {"cache": False}})
            async for chunk in s:
                if ttft is None and chunk.choices and chunk.choices[0].text:
                    ttft = time.monotonic() - start
            return ttft or 0.0

        return list(await asyncio.gather(*[one(i) for i in range(streams)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    model = wb.load_model()
    srv = wb.serve()
    runs: dict[str, list[tuple[float, float]]] = {"direct": [], "endpoint": []}
    try:
        asyncio.run(_direct(model, 2, 4))  # warm-up
        for _ in range(args.rounds):
            for side in ("direct", "endpoint"):
                start = time.monotonic()
                coro = (_direct(model, args.streams, args.tokens) if side == "direct"
                        else _endpoint(srv.url, model, args.streams, args.tokens))
                ttfts = asyncio.run(coro)
                runs[side].append((time.monotonic() - start, statistics.median(ttfts)))
    finally:
        srv.stop()
    total = args.streams * args.tokens
    out: dict[str, Any] = {"streams": args.streams, "tokens": args.tokens, "rounds": args.rounds}
    for side, rs in runs.items():
        wall = statistics.median(r[0] for r in rs)
        out[side] = {"wall_s": round(wall, 3), "tok_s": round(total / wall, 1),
                     "ttft_median_s": round(statistics.median(r[1] for r in rs), 3)}
        print(f"{side:9s} {wall:7.2f} s  {total / wall:7.1f} tok/s  ttft {out[side]['ttft_median_s']:.3f} s")
    out["ratio_tok_s"] = round(out["endpoint"]["tok_s"] / out["direct"]["tok_s"], 3)
    print(f"endpoint / direct tokens/s: {out['ratio_tok_s']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
