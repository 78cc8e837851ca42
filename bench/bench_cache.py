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
    python bench/bench_cache.py --chat [--turns 4] [--chunk-sizes 256,64,16]
    python bench/bench_cache.py --fleet [--agents 6]

--chat: a multi-turn chat on the engine's row cache (a disk tier), then the same rows stored
as manifests over KV chunks (workbench.cache.chunk_store, cut by engine/kv_chunks): stored
bytes of each against the raw KV of the distinct tokens of all rows (issue 14). --fleet: the
same for agents sharing one system prompt and tool set, two turns each.
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


CHAT_TURNS = [
    "I am planning a two-week trip through the north of Italy in late spring, starting in Milan "
    "and ending in Venice. I like old towns, small museums, long walks and local food, and I do "
    "not want to rent a car. Which towns would you put on the route, in which order, and how "
    "many nights would you spend in each? Please explain the trains between them as well.",
    "That sounds good. Could you now write a day-by-day plan for the first week only, with one "
    "museum or church and one walk each day, and say which days are best for a market? Also "
    "tell me which regional dishes I should try in each town and when restaurants open there.",
    "Thank you. For the second week, I would rather spend more time near the lakes than in the "
    "cities. Rework the plan so that I stay three nights on Lake Como and two on Lake Garda, "
    "keep Venice at the end, and list the ferries and trains I would take between the places.",
    "Last question: write a short packing list for this trip, a rough daily budget for food, "
    "trains, museums and rooms in mid-range hotels, and three phrases in Italian that would be "
    "useful in restaurants and at train stations, with how to pronounce them.",
    "One more thing: which two towns on the route would you skip if I had only ten days?",
    "And if it rains for three days, which indoor places would you suggest on the way?",
]


def distinct_tokens(rows: list[list[int]]) -> int:
    """Positions of the trie of all rows: the tokens whose KV is distinct."""
    trie: dict = {}
    n = 0
    for toks in rows:
        node = trie
        for t in toks:
            if t not in node:
                node[t] = {}
                n += 1
            node = node[t]
    return n


TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {p: {"type": "string", "description": f"the {p}"}
                                                    for p in params}, "required": list(params)}}}
    for name, desc, params in [
        ("search_flights", "Search flights between two airports on a date.", ("origin", "destination", "date")),
        ("book_hotel", "Book a hotel room in a city for a range of nights.", ("city", "check_in", "check_out")),
        ("convert_currency", "Convert an amount between two currencies.", ("amount", "source", "target")),
        ("weather", "The forecast for a city on a date.", ("city", "date")),
        ("translate", "Translate a sentence into a language.", ("text", "language")),
    ]]
FLEET_TASKS = ["Find me a flight from Milan to Vienna on May 3.", "What will the weather be in Como on May 5?",
               "Convert 250 euros to Swiss francs.", "Book a hotel in Verona from May 7 to May 9.",
               "Translate 'where is the station' into Italian.", "Find a flight from Venice to Paris on May 14."]


def fleet_conversations(model: str, args: argparse.Namespace) -> None:
    """Agents sharing one system prompt and tool set, each on its own task, two turns."""
    system = {"role": "system", "content": "You are a travel agent's assistant. Use the tools when they help."}
    for task in FLEET_TASKS[:args.agents]:
        messages = [system, {"role": "user", "content": task}]
        r = wb.chat(model, messages, tools=TOOLS, response_tokens=args.reply_tokens, temperature=0.0)
        messages += [{"role": "assistant", "content": r.content or "(a tool call)"},
                     {"role": "user", "content": "Thanks. Anything else I should know?"}]
        wb.chat(model, messages, tools=TOOLS, response_tokens=args.reply_tokens, temperature=0.0)


def chat_conversation(model: str, args: argparse.Namespace) -> None:
    messages: list[dict] = []
    for text in CHAT_TURNS[:args.turns]:
        messages.append({"role": "user", "content": text})
        r = wb.chat(model, messages, response_tokens=args.reply_tokens, temperature=0.0)
        messages.append({"role": "assistant", "content": r.content})


def storage_scenario(args: argparse.Namespace, converse) -> dict:
    """Stored bytes vs the raw KV of the distinct tokens, whole rows and chunked."""
    root = Path(tempfile.mkdtemp(prefix="wb-bench-chat-"))
    wb.configure_cache([{"kind": "disk", "root": str(root / "rows"), "budget_bytes": 8 * 2**30}])
    model = wb.load_model(n_threads=args.threads, n_ctx=8192, n_seq_max=1, flash_attn=args.flash_attn)
    try:
        converse(model, args)
        wb.wait_for_saves()
        out = measure_rows(root, wb.model_info(model)["path"], args)
    finally:
        wb.unload(model)
        wb.configure_cache([{"kind": "ram"}])
        shutil.rmtree(root, ignore_errors=True)
    print(f"{out['rows']} rows of {out['tokens']} tokens, {out['distinct_tokens']} distinct tokens, "
          f"raw KV {out['raw_kv_bytes'] / 1e6:.1f} MB")
    print(f"whole rows: {out['row_bytes'] / 1e6:.1f} MB = {out['row_x']:.2f}x the raw KV")
    for cs, c in out["chunked"].items():
        print(f"chunks of {cs:>4}: {c['bytes'] / 1e6:.1f} MB = {c['x']:.2f}x ({c['chunks']} chunks; "
              f"{c['joins_equal_to_rows']} of {out['rows']} joins equal to the row's state)")
    return out


def measure_rows(root: Path, model_path: str, args: argparse.Namespace) -> dict:
    """The engine's row files under root/rows, then the same rows stored as KV chunks."""
    from workbench import _native
    from workbench.cache.chunk_store import ChunkStore
    from workbench.cache.format import read_row
    from workbench.cache.keys import chunk_keys, tokens_from_bytes
    from workbench.engine import kv_chunks

    files = sorted((root / "rows").glob("*.kv"))
    rows = [read_row(f) for f in files]
    toks = [tokens_from_bytes(r.meta.tokens) for r in rows]
    raw = distinct_tokens(toks) * KV_BYTES_PER_TOKEN
    row_bytes = sum(f.stat().st_size for f in files)
    out: dict = {"rows": len(rows), "tokens": [len(t) for t in toks], "distinct_tokens": distinct_tokens(toks),
                 "raw_kv_bytes": raw, "row_bytes": row_bytes, "row_x": row_bytes / raw, "chunked": {}}
    m = _native.Model(model_path, 0, True, False)
    ctx = _native.Context(m, {"n_ctx": 8192, "n_seq_max": 1, "n_threads": args.threads})
    for cs in (int(c) for c in args.chunk_sizes.split(",")):
        store = ChunkStore(root / f"chunks-{cs}", chunk_size=cs)
        exact = 0
        for r in rows:
            ks = chunk_keys(r.meta.namespace, r.meta.tokens, cs)
            first = store.missing(r.meta.namespace, r.meta.tokens)
            pieces = kv_chunks.cut_state(ctx, r.payload, ks, cs, first)
            store.put_row(r.meta.namespace, r.meta.fingerprint, r.meta.tokens, pieces, r.meta.reason)
        for r in rows:
            _, served_by, back = store.read_row(r.meta.key)
            exact += kv_chunks.join(ctx, back, served_by, r.meta.n_tokens) == r.payload
        out["chunked"][cs] = {"bytes": store.used, "x": store.used / raw, "chunks": len(store.chunks),
                              "joins_equal_to_rows": exact}
    ctx.close()
    m.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chat", action="store_true", help="the multi-turn chat storage scenario")
    ap.add_argument("--fleet", action="store_true", help="the agent fleet storage scenario (shared tool prefix)")
    ap.add_argument("--agents", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--reply-tokens", type=int, default=160)
    ap.add_argument("--chunk-sizes", default="256,64,16")
    ap.add_argument("--sizes", default="512,2048,4096")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.chat or args.fleet:
        res = storage_scenario(args, chat_conversation if args.chat else fleet_conversations)
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
        return 0
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
