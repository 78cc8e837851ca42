#!/usr/bin/env python3
"""Concurrent requests under one long, not yet cached prefix: the workbench's endpoint beside
llama-server, one run (issue 30's benchmark).

The workload, per round: a system prompt of `--prefix-tokens` (2,000) tokens no side has seen,
and `--requests` (8) distinct questions of `--question-tokens` (64) tokens after it, all sent
at once (one client thread each) to `/v1/completions` as token ids, `--response-tokens` (64)
tokens out each (greedy, ignore_eos). A round's wall time runs from the first send to the last
reply; its prefill tokens are what each side computed: the workbench's `wb.history()`
`prefilled_tokens` summed, llama-server's "prompt eval" tokens from its log. Each round uses a
new prefix (the same for every side), so nothing is cached when it starts; a warm-up of
unrelated prompts comes first.

Sides (each a server process of its own, loaded one at a time, the same model file, build
tree, threads, context and batch sizes; flags printed and recorded in `--json`):

    workbench           wb.load_model(n_ctx=C, n_seq_max=S, ...) + wb.serve(): live prefix
                        sharing on (the default)
    workbench-noshare   the same with share_prefixes=False (each request restores what the
                        prefix cache holds at its admission, or prefills)
    llama-server        -c C -np S --kv-unified -cb ... --cache-prompt --cache-ram 1024
                        --cache-reuse 256 (the closest settings it has: a slot reuses only its
                        own earlier prompt, or the RAM prompt cache's, neither of which holds a
                        prefix no request has finished yet)

Targets (issue 30): workbench prefill tokens <= prefix + requests x question + requests; wall
time <= 0.5 x llama-server's.

`--part samples` (run first with `both`), in this process: `wb.complete(prompt, n=requests)`
of a `--sample-prompt-tokens` (1,000) prompt, `--response-tokens` each (temperature 1,
ignore_eos), against one prefill of such a prompt plus a `requests`-stream decode of the same
length at the same depth (`requests` sessions each holding a prompt of that length, then
one more token and the decode, timed), and against `requests` separate requests of one prompt on a
model loaded with share_prefixes=False (each prefills it: nothing is cached when they are
admitted together). Targets: n samples <= 1.15 x (prefill + decode); >= 3x faster than the
separate requests. Each round uses new prompts.

    python bench/bench_share.py [--part share|samples|both] [--rounds 3] [--requests 8]
        [--prefix-tokens 2000] [--sides workbench,workbench-noshare,llama-server] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import CACHE_RAM_MIB, LlamaServer, WorkbenchServer  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.options import default_threads  # noqa: E402

VOCAB = (1000, 40000)   # plain token ids of the default model's vocabulary (no special tokens)


def tokens(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def workbench_options(args: argparse.Namespace, model: Path, share: bool) -> dict[str, Any]:
    return {"model_path": str(model), "n_ctx": args.n_ctx, "n_seq_max": args.requests, "n_threads": args.threads,
            "n_threads_batch": args.threads, "n_batch": 2048, "n_ubatch": 512, "flash_attn": "auto",
            "type_k": "f16", "type_v": "f16", "share_prefixes": share}


def server_flags(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    return ["-m", str(model), "-c", str(args.n_ctx), "-np", str(args.requests), "--kv-unified", "-cb",
            "-t", str(args.threads), "-tb", str(args.threads), "-b", "2048", "-ub", "512", "-fa", "auto",
            "-ctk", "f16", "-ctv", "f16", "--cache-prompt", "--cache-ram", str(CACHE_RAM_MIB),
            "--cache-reuse", "256", "--fit", "off", "--no-webui", "--host", "127.0.0.1", "--port", str(port)]


def start(side: str, args: argparse.Namespace, model: Path) -> Any:
    if side == "llama-server":
        return LlamaServer(args, model, flags=lambda port: server_flags(args, model, port))
    return WorkbenchServer(args, model, workbench_options(args, model, share=side == "workbench"))


def send_all(url: str, prompts: list[list[int]], n_out: int) -> tuple[float, list[dict[str, Any]]]:
    """Every prompt at once, one thread each; (wall seconds, the replies' JSON)."""
    import httpx

    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    out: list[dict[str, Any]] = [{} for _ in prompts]
    failed: list[BaseException] = []
    go = threading.Event()

    def one(i: int) -> None:
        go.wait()
        body = {"model": model, "prompt": prompts[i], "max_tokens": n_out, "temperature": 0, "ignore_eos": True}
        try:
            r = httpx.post(url + "/v1/completions", json=body, timeout=600)
            r.raise_for_status()
            out[i] = r.json()
        except BaseException as e:  # noqa: BLE001 - reported below, on the main thread
            failed.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"{len(failed)} of {len(prompts)} requests to {url} failed: {failed[0]!r}")
    return time.perf_counter() - t0, out


def round_prompts(args: argparse.Namespace, r: int) -> list[list[int]]:
    rng = random.Random(args.seed * 1000 + r)
    prefix = tokens(args.prefix_tokens, rng)
    return [prefix + tokens(args.question_tokens, rng) for _ in range(args.requests)]


def prefill_total(server: Any) -> float:
    """llama-server's prompt tokens evaluated so far (its log)."""
    return float(server.timings()["prompt_eval_tokens"])


def reply_facts(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workbench's reading of each reply's request (its `workbench` field)."""
    return [req for x in replies for req in x.get("workbench", {}).get("requests", [])]


def run_side(side: str, args: argparse.Namespace, model: Path) -> list[dict[str, Any]]:
    server = start(side, args, model)
    rounds = []
    try:
        warm = random.Random(12345)
        send_all(server.url, [tokens(200, warm) for _ in range(args.requests)], 8)
        for r in range(args.rounds):
            before = prefill_total(server) if side == "llama-server" else 0.0
            wall, replies = send_all(server.url, round_prompts(args, r), args.response_tokens)
            n_out = sum(int(x.get("usage", {}).get("completion_tokens", 0)) for x in replies)
            wb_facts = reply_facts(replies)
            computed = (prefill_total(server) - before if side == "llama-server"
                        else float(sum(f["prefilled_tokens"] for f in wb_facts)))
            rounds.append({"wall_s": wall, "prefill_tokens": computed, "completion_tokens": n_out,
                           "hit_kinds": [f["cache_hit_kind"] for f in wb_facts]})
            print(f"round {r + 1} {side}: {wall:.2f} s, {rounds[-1]['prefill_tokens']:.0f} prompt tokens computed, "
                  f"{n_out} generated (load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        end = server.stop()
    if side != "llama-server":
        counters = end.get("counters", {})
        rounds[-1]["counters"] = {k: counters.get(k) for k in ("hits_shared", "shared_tokens", "share_waits",
                                                                "share_waits_expired", "hits_cold", "hits_partial")}
    return rounds


# --- n samples of one prompt, in process ----------------------------------------------------------

def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def at_once(model: str, prompts: list[list[int]], n_out: int, **opts: Any) -> list[Any]:
    streams = [wb.stream(model, p, response_tokens=n_out, ignore_eos=True, **opts) for p in prompts]
    return [s.result() for s in streams]


def decode_at_depth(model: str, prompts: list[list[int]], n_out: int, sampling: dict[str, Any]) -> float:
    """Seconds of a ``len(prompts)``-stream decode of ``n_out`` tokens at the prompts' depth:
    each prompt is prefilled first into a session of its own (not timed), then every session
    takes one more token and decodes ``n_out`` (timed, all at once)."""
    for i, p in enumerate(prompts):
        wb.complete(model, p, response_tokens=1, session_id=f"depth-{i}", cache=False)
    t0 = time.perf_counter()
    streams = [wb.stream(model, p + [VOCAB[0] + i], response_tokens=n_out, ignore_eos=True, session_id=f"depth-{i}",
                         cache=False, **sampling) for i, p in enumerate(prompts)]
    for s in streams:
        s.result()
    took = time.perf_counter() - t0
    for i in range(len(prompts)):
        wb.end_session(model, f"depth-{i}")
    return took


def samples_round(share: str, alone: str, args: argparse.Namespace, r: int) -> dict[str, float]:
    """One round: n samples vs one prefill + an n-stream decode vs n separate requests (a
    model without sharing), each on a prompt nothing has cached."""
    rng = random.Random(args.seed * 1000 + 500 + r)
    k, n_out = args.requests, args.response_tokens
    sampling: dict[str, Any] = {"temperature": 1.0, "seed": r}
    p_samples, p_prefill, p_alone = (tokens(args.sample_prompt_tokens, rng) for _ in range(3))
    deep = [tokens(args.sample_prompt_tokens, rng) for _ in range(k)]
    out: dict[str, float] = {}
    out["samples_s"] = timed(lambda: wb.complete(share, p_samples, n=k, response_tokens=n_out, ignore_eos=True,
                                                 **sampling))
    out["prefill_s"] = timed(lambda: wb.complete(share, p_prefill, response_tokens=1))
    out["decode_s"] = decode_at_depth(share, deep, n_out, sampling)
    out["separate_s"] = timed(lambda: at_once(alone, [p_alone] * k, n_out, **sampling))
    return out


def run_samples(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    opts = workbench_options(args, model, True)
    share = wb.load_model(**opts, model_id="bench-share")
    alone = wb.load_model(**{**opts, "share_prefixes": False}, model_id="bench-share-off")
    try:
        warm = random.Random(7)
        at_once(share, [tokens(200, warm) for _ in range(2)], 4)
        at_once(alone, [tokens(200, warm) for _ in range(2)], 4)
        rounds = []
        for r in range(args.rounds):
            rounds.append(samples_round(share, alone, args, r))
            x = rounds[-1]
            print(f"samples round {r + 1}: n={args.requests} samples {x['samples_s']:.2f} s; one prefill "
                  f"{x['prefill_s']:.2f} s + {args.requests}-stream decode at that depth {x['decode_s']:.2f} s; "
                  f"{args.requests} separate requests {x['separate_s']:.2f} s "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        wb.unload(share)
        wb.unload(alone)
    med = {key: statistics.median(x[key] for x in rounds) for key in rounds[0]}
    vs_parts = med["samples_s"] / (med["prefill_s"] + med["decode_s"])
    speedup = med["separate_s"] / med["samples_s"]
    print(f"target n samples <= 1.15 x (one prefill + an {args.requests}-stream decode): {vs_parts:.3f} "
          f"({'met' if vs_parts <= 1.15 else 'NOT met'})")
    print(f"target n samples >= 3x faster than {args.requests} separate requests: {speedup:.2f}x "
          f"({'met' if speedup >= 3 else 'NOT met'})")
    return {"rounds": rounds, "median": med, "vs_parts": vs_parts, "speedup": speedup,
            "targets": {"vs_parts": vs_parts <= 1.15, "speedup": speedup >= 3}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8, help="concurrent requests = n_seq_max = llama-server -np")
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--response-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=20480, help="KV cells of the unified KV (both sides)")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--sides", default="workbench,workbench-noshare,llama-server")
    ap.add_argument("--part", choices=("share", "samples", "both"), default="both",
                    help="share: the servers under one prefix; samples: n samples in process")
    ap.add_argument("--sample-prompt-tokens", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    model = args.model or wb.fetch_default_model()
    sides = [s.strip() for s in args.sides.split(",")]
    print(f"model {model.name}, llama.cpp {wb._native.llama_commit[:12]}, {args.threads} threads, "
          f"{args.requests} requests at once, prefix {args.prefix_tokens} + question {args.question_tokens} tokens, "
          f"{args.response_tokens} out, n_ctx {args.n_ctx}, load average {os.getloadavg()[0]:.2f}")
    options = workbench_options(args, model, True)
    print("workbench    wb.load_model(" + ", ".join(f"{k}={v!r}" for k, v in options.items() if k != "model_path")
          + ") + wb.serve()")
    print("llama-server " + " ".join(server_flags(args, model, 0)[2:-2]), flush=True)
    sampled = run_samples(args, model) if args.part in ("samples", "both") else None
    if args.part == "samples":
        if args.json:
            args.json.write_text(json.dumps({"model": model.name, "samples": sampled}, indent=1, default=str))
        return 0
    runs = {side: run_side(side, args, model) for side in sides}
    summary = {side: {"wall_s": statistics.median(r["wall_s"] for r in rounds),
                      "prefill_tokens": statistics.median(r["prefill_tokens"] for r in rounds)}
               for side, rounds in runs.items()}
    bound = args.prefix_tokens + args.requests * args.question_tokens + args.requests
    print()
    for side, s in summary.items():
        print(f"{side:18s} median wall {s['wall_s']:7.2f} s, prefill tokens {s['prefill_tokens']:7.0f}")
    verdict: dict[str, Any] = {}
    if "workbench" in summary:
        ok = summary["workbench"]["prefill_tokens"] <= bound
        verdict["prefill_tokens"] = {"value": summary["workbench"]["prefill_tokens"], "bound": bound, "met": ok}
        print(f"target prefill tokens <= {bound}: {summary['workbench']['prefill_tokens']:.0f} "
              f"({'met' if ok else 'NOT met'})")
        if "llama-server" in summary:
            ratio = summary["workbench"]["wall_s"] / summary["llama-server"]["wall_s"]
            verdict["wall_ratio"] = {"value": ratio, "bound": 0.5, "met": ratio <= 0.5}
            print(f"target wall time workbench / llama-server <= 0.5: {ratio:.3f} "
                  f"({'met' if ratio <= 0.5 else 'NOT met'})")
    if args.json:
        args.json.write_text(json.dumps({
            "model": model.name, "llama_commit": wb._native.llama_commit, "threads": args.threads,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "workbench_options": {k: v for k, v in workbench_options(args, model, True).items() if k != "model_path"},
            "llama_server_flags": server_flags(args, model, 0)[2:-2], "runs": runs, "summary": summary,
            "targets": verdict, "samples": sampled}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
