#!/usr/bin/env python3
"""Time to first token cold vs warm from each cache tier, whole rows and chunk storage, in one run.

For each flash attention setting and prompt length: a cold run (cache off: the whole prompt
is prefilled), then the prompt's KV is saved (prefill_only) and the same prompt is run warm,
an exact hit: restore, decode the last prompt token, sample.

* Whole rows (``storage='rows'``: the row's KV one chunk): saved into the shm tier with a
  RAM copy and run warm from RAM; the copy dropped, run warm from shm; demoted by eviction to
  the disk tier and run warm from there (page-cached: just written).
* Chunk storage, per chunk size: saved into a chunk directory under /dev/shm with RAM copies
  above it and run warm from the RAM copies; the copies dropped (``evict_bytes(.., 'ram')``)
  and run warm from the shm files; the directory copied to a disk directory, adopted by a
  new cache over it alone (its scan), and run warm from there (page-cached).

Where the warm time goes comes from the cache's own counters (lookup, read+verify, unpack
into llama.cpp: for chunks the join included) and the rest is the first decode and sampling.
Also reports the bytes stored for the row (the prompt but its last token) against its raw f16 KV.

    python bench/bench_cache.py [--sizes 2048] [--flash-attn on,off] [--storage both]
                                [--chunk-sizes 64,128,256] [--json out.json]
    python bench/bench_cache.py --chat [--chats 20] [--turns 3] [--reply-tokens 64]
    python bench/bench_cache.py --fleet [--agents 6]

--chat / --fleet: issue 14's storage traces (bench/cache_traces.py) through the engine, whole
rows and chunk storage at each chunk size side by side: stored bytes against the raw KV of
the distinct tokens of the rows saved.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import cache_traces

import workbench as wb
from workbench.options import default_threads

BIG = 8 * 2**30
TIERS = ("ram", "shm", "disk")


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


def rows_warm(model: str, prompt: list[int], root: Path, shm_root: Path) -> dict[str, Any]:
    """Whole rows: a RAM copy, then the shm file, then demoted to disk."""
    wb.configure_cache([{"kind": "ram", "budget_bytes": BIG},
                        {"kind": "shm", "root": str(shm_root / "rows"), "budget_bytes": BIG},
                        {"kind": "disk", "root": str(root / "rows"), "budget_bytes": BIG}], storage="rows")
    saved = wb.prefill_only(model, prompt)
    wb.wait_for_saves()                           # time the restore alone, not beside a write
    row = next(r for r in wb.cache_rows() if r["key"] == saved.finish_key)
    res: dict[str, Any] = {"ram": warm(model, prompt)}
    wb.evict_bytes(BIG, "ram")                    # drop the RAM copy: the shm file is left
    res["shm"] = warm(model, prompt)              # (promotes a copy back to ram)
    wb.evict_bytes(BIG, "ram")
    wb.evict_bytes(BIG, "shm")                    # demote to disk
    res["disk"] = warm(model, prompt)
    res["stored_bytes"] = sum(f.stat().st_size for f in (root / "rows").iterdir())  # its chunk and manifest
    res["payload_bytes"] = row["bytes"]
    return res


def chunks_warm(model: str, prompt: list[int], chunk_size: int, root: Path, shm_root: Path) -> dict[str, Any]:
    """Chunk storage: RAM copies over a shm directory, the shm files, a disk directory's files."""
    shm_dir, disk_dir = shm_root / f"chunks-{chunk_size}", root / f"chunks-{chunk_size}"
    wb.configure_cache([{"kind": "ram", "budget_bytes": BIG},
                        {"kind": "shm", "root": str(shm_dir), "budget_bytes": BIG}],
                       storage="chunks", chunk_size=chunk_size)
    wb.prefill_only(model, prompt)
    wb.wait_for_saves()
    res: dict[str, Any] = {"ram": warm(model, prompt)}
    wb.evict_bytes(BIG, "ram")                    # drop the RAM copies: read the shm files
    res["shm"] = warm(model, prompt)
    shutil.copytree(shm_dir, disk_dir)            # the same files on disk, page-cached
    wb.configure_cache([{"kind": "disk", "root": str(disk_dir), "budget_bytes": BIG}],
                       storage="chunks", chunk_size=chunk_size)
    res["disk"] = warm(model, prompt)
    res["stored_bytes"] = sum(f.stat().st_size for f in disk_dir.iterdir() if f.suffix in (".kvc", ".kvm"))
    res["n_chunks"] = sum(1 for f in disk_dir.iterdir() if f.suffix == ".kvc")
    return res


def ttft_run(args: argparse.Namespace, flash_attn: str, sizes: list[int], chunk_sizes: list[int]) -> dict[int, dict]:
    """Every size's cold run and warm runs for one flash attention setting, one model load."""
    root = Path(tempfile.mkdtemp(prefix="wb-bench-cache-"))
    shm_root = Path("/dev/shm") / root.name
    model = wb.load_model(n_threads=args.threads, n_ctx=max(sizes) + 256, n_seq_max=1,
                          cold_checkpoint_interval=None, flash_attn=flash_attn,
                          decode_budget_ms=0)  # a loaded machine's 512-token step may pass 30 s
    n_vocab = wb.model_info(model)["n_vocab"]
    rng = random.Random(11)
    results: dict[int, dict] = {}
    try:
        wb.complete(model, [rng.randrange(n_vocab) for _ in range(32)], response_tokens=2, cache=False)
        for n in sizes:
            prompt = [rng.randrange(n_vocab) for _ in range(n)]
            res: dict[str, Any] = {"cold_ms": wb.complete(model, prompt, response_tokens=1, cache=False).stats.ttft_s
                                   * 1000}
            if args.storage in ("rows", "both"):
                res["rows"] = rows_warm(model, prompt, root, shm_root)
            if args.storage in ("chunks", "both"):
                for cs in chunk_sizes:
                    res[f"chunks-{cs}"] = chunks_warm(model, prompt, cs, root, shm_root)
            results[n] = res
    finally:
        wb.unload(model)
        wb.configure_cache([{"kind": "ram"}])
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm_root, ignore_errors=True)
    return results


def print_ttft(flash_attn: str, threads: int, results: dict[int, dict]) -> None:
    print(f"\nflash_attn={flash_attn}, {threads} threads")
    print(f"{'tokens':>7}{'storage':>12}{'cold ms':>10}" + "".join(f"{t + ' ms':>10}{'x':>7}" for t in TIERS)
          + f"{'stored/raw':>12}")
    for n, res in results.items():
        for name, w in res.items():
            if name == "cold_ms":
                continue
            line = f"{n:>7}{name:>12}{res['cold_ms']:>10.0f}"
            for t in TIERS:
                line += f"{w[t]['ttft_ms']:>10.1f}{res['cold_ms'] / w[t]['ttft_ms']:>7.0f}"
            print(line + f"{w['stored_bytes'] / ((n - 1) * cache_traces.KV_BYTES_PER_TOKEN):>12.4f}")
    print("where the warm time goes (ms): lookup / read+verify / unpack (join included) / first decode+rest")
    for n, res in results.items():
        for name, w in res.items():
            if name == "cold_ms":
                continue
            for t in TIERS:
                p = w[t]
                print(f"{n:>7}{name:>12} {t:<5}{p['lookup_ns_ms']:>8.2f}{p['load_ns_ms']:>8.2f}"
                      f"{p['unpack_ns_ms']:>8.2f}{p['decode_and_rest_ms']:>8.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--chat", action="store_true", help="issue 14's chat trace: stored bytes, rows vs chunks")
    ap.add_argument("--fleet", action="store_true", help="issue 14's agent fleet trace (shared tool prefixes)")
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--agents", type=int, default=6, help="agents per tool group (two groups)")
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--chunk-sizes", default="64,128,256")
    ap.add_argument("--sizes", default="2048")
    ap.add_argument("--storage", default="both", choices=("rows", "chunks", "both"))
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--flash-attn", default="on,off", help="comma list of auto, on, off")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    chunk_sizes = [int(c) for c in args.chunk_sizes.split(",")]
    flash = args.flash_attn.split(",")
    out: dict[str, Any] = {}
    if args.chat or args.fleet:
        if args.chat:
            out["chats"] = cache_traces.storage_table(
                "chats", lambda m: cache_traces.chats(m, args.chats, args.turns, args.reply_tokens),
                chunk_sizes, args.threads, flash[0], args.storage)
        if args.fleet:
            out["fleet"] = cache_traces.storage_table(
                "fleet", lambda m: cache_traces.fleet(m, args.agents, args.reply_tokens),
                chunk_sizes, args.threads, flash[0], args.storage)
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        for fa in flash:
            out[fa] = ttft_run(args, fa, sizes, chunk_sizes)
            print_ttft(fa, args.threads, out[fa])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
