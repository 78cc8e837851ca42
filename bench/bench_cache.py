#!/usr/bin/env python3
"""Time to first token cold vs warm from each cache tier, in one run.

For each prompt length: a cold run (cache off: the whole prompt is prefilled), then the
prompt's KV is saved (prefill_only) into the RAM tier and the same prompt is run warm
from RAM; the row is then demoted by eviction to the shm tier and run warm from there,
and demoted again to the disk tier (page-cached: just written) and run warm from there.
Each warm run is an exact hit: restore the row, decode the last prompt token, sample.
Where the warm time goes comes from the cache's own counters (lookup, read+verify,
unpack into llama.cpp) and the rest is the first decode and sampling. Also reports bytes
stored per cached token against the raw f16 KV size (storage amplification).

    python bench/bench_cache.py [--sizes 512,2048,4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import workbench as wb
from workbench.options import default_threads

KV_BYTES_PER_TOKEN = 23_040     # SmolLM2-135M, f16 K and V: 30 layers x 3 KV heads x 64 x 2 x 2 bytes


def cache_ns() -> dict[str, int]:
    c = wb.counters()
    return {k: c.get(f"cache_{k}", 0) for k in ("lookup_ns", "load_ns", "unpack_ns")}


def warm(model: str, prompt: list[int]) -> dict[str, float]:
    before = cache_ns()
    r = wb.complete(model, prompt, response_tokens=1)
    assert r.stats.cache_hit_kind == "exact", r.stats
    after = cache_ns()
    parts = {k: (after[k] - before[k]) / 1e6 for k in before}
    ttft = r.stats.ttft_s * 1000
    parts["decode_and_rest"] = ttft - sum(parts.values())
    return {"ttft_ms": ttft, **{f"{k}_ms": v for k, v in parts.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="512,2048,4096")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="wb-bench-cache-"))
    shm_root = Path("/dev/shm") / root.name
    big = 8 * 2**30
    wb.configure_cache([{"kind": "ram", "budget_bytes": big},
                        {"kind": "shm", "root": str(shm_root), "budget_bytes": big},
                        {"kind": "disk", "root": str(root / "disk"), "budget_bytes": big}])
    model = wb.load_model(n_threads=args.threads, n_ctx=max(sizes) + 256, n_seq_max=1,
                          cold_checkpoint_interval=None, flash_attn=args.flash_attn)
    n_vocab = wb.model_info(model)["n_vocab"]
    rng = random.Random(11)
    results: dict[int, dict] = {}
    try:
        wb.complete(model, [rng.randrange(n_vocab) for _ in range(32)], response_tokens=2, cache=False)
        for n in sizes:
            prompt = [rng.randrange(n_vocab) for _ in range(n)]
            cold = wb.complete(model, prompt, response_tokens=1, cache=False).stats.ttft_s * 1000
            saved = wb.prefill_only(model, prompt)
            row = next(r for r in wb.cache_rows() if r["key"] == saved.finish_key)
            res = {"cold_ms": cold, "ram": warm(model, prompt)}
            wb.evict_bytes(big, "ram")                    # demote to shm
            res["shm"] = warm(model, prompt)              # (promotes a copy back to ram)
            wb.evict_bytes(big, "ram")
            wb.evict_bytes(big, "shm")                    # demote to disk
            res["disk"] = warm(model, prompt)
            files = list((root / "disk").rglob(f"{saved.finish_key}*"))
            file_bytes = files[0].stat().st_size if files else 0
            res["payload_bytes_per_token"] = row["bytes"] / n
            res["file_bytes_per_token"] = file_bytes / n
            res["amplification"] = file_bytes / (n * KV_BYTES_PER_TOKEN) if file_bytes else None
            results[n] = res
            wb.evict_bytes(big, "ram")
    finally:
        wb.unload(model)
        wb.configure_cache([{"kind": "ram"}])
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm_root, ignore_errors=True)
    print(f"flash_attn={args.flash_attn}, {args.threads} threads")
    print(f"{'tokens':>7}{'cold ms':>10}" + "".join(f"{t + ' ms':>10}{'x':>7}" for t in ("ram", "shm", "disk")))
    for n, res in results.items():
        line = f"{n:>7}{res['cold_ms']:>10.0f}"
        for t in ("ram", "shm", "disk"):
            line += f"{res[t]['ttft_ms']:>10.1f}{res['cold_ms'] / res[t]['ttft_ms']:>7.0f}"
        print(line)
    print("\nwhere the warm time goes (ms): lookup / read+verify / unpack / first decode+rest")
    for n, res in results.items():
        for t in ("ram", "shm", "disk"):
            w = res[t]
            print(f"{n:>7} {t:<5}{w['lookup_ns_ms']:>8.2f}{w['load_ns_ms']:>8.2f}{w['unpack_ns_ms']:>8.2f}"
                  f"{w['decode_and_rest_ms']:>8.2f}")
    print("\nbytes per cached token: payload, file; amplification vs raw f16 KV (23,040 B/token)")
    for n, res in results.items():
        amp = res["amplification"]
        print(f"{n:>7}{res['payload_bytes_per_token']:>10.0f}{res['file_bytes_per_token']:>10.0f}"
              f"{amp if amp is None else round(amp, 4):>10}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
