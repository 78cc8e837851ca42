#!/usr/bin/env python3
"""Speculative decoding beside plain decoding and beside llama.cpp's own programs, one run.

Same model files, same vendored llama.cpp build, same threads, greedy decoding, the same
prompts (raw ChatML text, special tokens parsed), the same number of tokens to predict:

- n-grams on the default model: workbench `speculative={'ngram': 'cache'}` against
  `llama-lookup` (llama.cpp's n-gram-cache drafting), and `{'ngram': 'simple'}` against
  `llama-speculative-simple --spec-type ngram-simple`;
- with `--qwen-ngram`: the same n-gram sides on Qwen2.5-Coder-1.5B-Instruct, a model that
  echoes the code it edits (the default model rewrites it), where the code edit's 1.3x
  target can be reached;
- with `--pair`: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct
  (../shared/MODELS.md; fetched once): workbench `speculative={'draft': ...}` against
  `llama-speculative-simple --spec-type draft-simple`; `--draft-threads N` gives the draft
  model's engine N threads (the target keeps `--threads`).

Prompt classes: an input-grounded code edit (the reply repeats most of the input), a
summary, free generation. "echo" (on the plain line) is the share of the plain reply's
tokens inside a 4-gram of the prompt: how input-grounded the reply really is, per model.
Speed is the decode rate: ours `Stats.decode_tps` (first to last generated token),
llama.cpp's its "decoded N tokens in T seconds" line (after the prompt). Rounds alternate
the programs and ours; each figure is the median over rounds.

    python bench/bench_speculative.py [--rounds 3] [--n-predict 128] [--fixed | --both]
        [--no-default] [--qwen-ngram] [--pair [--draft-threads N]] [--classes code,summary,free] [--json out.json]
    python bench/bench_speculative.py --verify-rows [--qwen-ngram] [--rounds 9]

``--verify-rows`` answers what speculation can gain on this machine at best: one native
decode of k rows of one sequence (a verify of k - 1 draft tokens) against one of 1 row (a
plain step), after a 100-token prompt, median of --rounds; the speed-up over plain
decoding were every draft token accepted is k t(1) / t(k), and at a per-token acceptance a
it is (1 + a (1 - a^(k-1)) / (1 - a)) t(1) / t(k).

``--both`` measures each of our speculative sides twice, adaptive and fixed (always n_max),
and prints what adaptive decided (verified drafts, their mean length, drafts explored, off
switches, shadow drafts checked, steps deferred until the slack covers a draft engine's
catch-up prefill, the draft engine's seconds for the request) per class.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _paths import tool  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.options import default_threads  # noqa: E402

N_DRAFT = 8

CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0.0
    report = {"total": total, "count": count, "average": average}
    for key, value in report.items():
        print(f"{key}: {value}")
    return report
'''
TEXT = ("The lighthouse on the northern cape was built in 1871 to guide fishing boats past the reef. "
        "For ninety years a keeper lived in the cottage beside it, climbing the spiral stairs each evening "
        "to light the lamp and wind the clockwork that turned the lens. In 1962 the light was automated and "
        "the last keeper moved to the village, where he taught children to read the weather from the clouds. "
        "Today the cottage is a small museum, and the lamp, now electric, still flashes twice every ten seconds.")


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


CLASSES = {"code": "code edit (input-grounded)", "summary": "summary", "free": "free generation"}
PROMPTS = {
    "code edit (input-grounded)": chat(f"Rename the variable `total` to `paid_total` in this code and output "
                                       f"the whole code:\n```python\n{CODE}```"),
    "summary": chat(f"Summarise this text in three sentences:\n{TEXT}"),
    "free generation": chat("Write a short story about a fox who learns to sail."),
}

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+|-?nan)%")


def run_program(cmd: list[str]) -> dict[str, float]:
    """tok/s and acceptance from a llama.cpp example's log."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    m = _DECODED.search(log)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({out.returncode}):\n{log[-2000:]}")
    n, secs = int(m.group(1)), float(m.group(2))
    a = _ACCEPT.search(log)
    accept = float(a.group(1)) / 100 if a and "nan" not in a.group(1) else 0.0
    return {"tps": n / secs if secs > 0 else 0.0, "acceptance": accept}


def program_cmd(name: str, model: Path, prompt: str, n: int, threads: int, extra: list[str]) -> list[str]:
    return [str(tool(name)), "-m", str(model), "-p", prompt, "-n", str(n), "-t", str(threads), "--temp", "0",
            "--top-k", "1", "--seed", "1", "-c", "4096", "--spec-draft-n-max", str(N_DRAFT), *extra]


MODES = [True]  # adaptive values our speculative sides run with: --fixed [False], --both [True, False]


def echo_share(prompt: list[int], reply: list[int], n: int = 4) -> float:
    """The share of ``reply``'s tokens inside an n-gram that also occurs in ``prompt``."""
    grams = {tuple(prompt[i: i + n]) for i in range(len(prompt) - n + 1)}
    covered = [False] * len(reply)
    for i in range(len(reply) - n + 1):
        if tuple(reply[i: i + n]) in grams:
            covered[i: i + n] = [True] * n
    return sum(covered) / len(reply) if reply else 0.0


def ours(mid: str, prompt: str, n: int, spec: dict[str, Any] | None) -> dict[str, float]:
    r = wb.complete(mid, prompt, response_tokens=n, temperature=0, cache=False, speculative=spec)
    s = r.stats.speculative or {}
    out = {"tps": r.stats.decode_tps or 0.0, "acceptance": float(s.get("acceptance") or 0.0),
           "tokens": r.stats.generated_tokens, "steps": s.get("steps", 0), "explored": s.get("explored", 0),
           "mean_draft": s["drafted"] / s["steps"] if s.get("steps") else 0.0,
           "off": (s.get("decisions") or {}).get("off", 0), "shadows": s.get("shadows", 0),
           "deferred": s.get("deferred_steps", 0), "engine_s": float(s.get("draft_engine_s") or 0.0)}
    if spec is None:
        out["echo"] = echo_share(wb.tokenize(mid, prompt), list(r.tokens))
    return out


def spec_sides(name: str, mid: str, prompt: str, n: int, spec: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Our side for ``spec`` once per mode in MODES ('ours X', 'ours X fixed')."""
    def side(adaptive: bool) -> Callable[[], Any]:
        return lambda: ours(mid, prompt, n, {**spec, "adaptive": adaptive})
    return {f"{name}{'' if adaptive else ' fixed'}": side(adaptive) for adaptive in MODES}


def measure_class(label: str, rounds: int, sides: dict[str, Callable[[], dict[str, float]]]) -> dict[str, Any]:
    """Every side once per round, in turn; medians over rounds."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    for _ in range(rounds):
        for key, fn in sides.items():
            runs[key].append(fn())
    return {key: {"tps": statistics.median(r["tps"] for r in rs),
                  "acceptance": statistics.median(r["acceptance"] for r in rs),
                  "echo": statistics.median(r.get("echo", 0.0) for r in rs),
                  "decided": [(r.get("steps", 0), round(r.get("mean_draft", 0.0), 1), r.get("explored", 0),
                               r.get("off", 0), r.get("shadows", 0), r.get("deferred", 0),
                               round(r.get("engine_s", 0.0), 2)) for r in rs]}
            for key, rs in runs.items()}


def ngram_sides(mid: str, model: Path, prompt: str, n: int, threads: int) -> dict[str, Callable[[], Any]]:
    return {
        "plain": lambda: ours(mid, prompt, n, None),
        **spec_sides("ours ngram-cache", mid, prompt, n, {"ngram": "cache", "n_max": N_DRAFT}),
        "llama-lookup": lambda: run_program(program_cmd("llama-lookup", model, prompt, n, threads, [])),
        **spec_sides("ours ngram-simple", mid, prompt, n, {"ngram": "simple", "n_max": N_DRAFT}),
        "llama-speculative-simple ngram-simple": lambda: run_program(program_cmd(
            "llama-speculative-simple", model, prompt, n, threads, ["--spec-type", "ngram-simple", "-md", str(model)])),
    }


def pair_sides(mid: str, did: str, target: Path, draft: Path, prompt: str, n: int,
               threads: int, draft_threads: int) -> dict[str, Callable[[], Any]]:
    return {
        "plain": lambda: ours(mid, prompt, n, None),
        **spec_sides("ours draft", mid, prompt, n, {"draft": did, "n_max": N_DRAFT}),
        "llama-speculative-simple draft-simple": lambda: run_program(program_cmd(
            "llama-speculative-simple", target, prompt, n, threads,
            ["--spec-type", "draft-simple", "-md", str(draft), "-td", str(draft_threads)])),
    }


_PAIRS = (("ours ngram-cache", "llama-lookup"), ("ours ngram-simple", "llama-speculative-simple ngram-simple"),
          ("ours draft", "llama-speculative-simple draft-simple"))
PAIRS = _PAIRS + tuple((f"{a} fixed", b) for a, b in _PAIRS)


def report(title: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'prompt class':<28}{'side':<40}{'tok/s':>8}{'accept':>8}{'x plain':>9}{'x llama.cpp':>12}"
          f"  plain: echo; adaptive: (verified drafts, mean length, explored, off, shadows, deferred steps, "
          f"draft engine s) per round")
    for label, sides in results.items():
        plain = sides["plain"]["tps"]
        programs = {ours_key: prog for ours_key, prog in PAIRS if ours_key in sides}
        for key, r in sides.items():
            vs_plain = f"{r['tps'] / plain:.2f}" if plain and key != "plain" else ""
            prog = programs.get(key)
            vs_prog = f"{r['tps'] / sides[prog]['tps']:.2f}" if prog and sides[prog]["tps"] else ""
            decided = (r["decided"] if key.startswith("ours") and not key.endswith("fixed")
                       else f"echo {r['echo']:.2f}" if key == "plain" else "")
            print(f"{label:<28}{key:<40}{r['tps']:>8.1f}{r['acceptance']:>8.2f}{vs_plain:>9}{vs_prog:>12}  {decided}")
            label = ""


def run_ngram(args: argparse.Namespace, path: Path, model_id: str, prompts: dict[str, str]) -> dict[str, Any]:
    """The n-gram sides on one model, class by class."""
    mid = wb.load_model(model_path=str(path), model_id=model_id, n_threads=args.threads, n_seq_max=2, n_ctx=4096,
                        decode_budget_ms=args.decode_budget_ms)
    try:
        return {label: measure_class(label, args.rounds, ngram_sides(mid, path, p, args.n_predict, args.threads))
                for label, p in prompts.items()}
    finally:
        wb.unload(mid)


def run_pair(args: argparse.Namespace, target: Path, draft: Path, prompts: dict[str, str]) -> dict[str, Any]:
    """The draft-model sides: the target with --threads, its draft model's engine with --draft-threads."""
    budget = args.decode_budget_ms
    tid = wb.load_model(model_path=str(target), model_id="bench-target", n_threads=args.threads, n_ctx=4096,
                        decode_budget_ms=budget)
    did = wb.load_model(model_path=str(draft), model_id="bench-draft", n_threads=args.draft_threads, n_ctx=4096,
                        decode_budget_ms=budget)
    try:
        return {label: measure_class(label, args.rounds, pair_sides(tid, did, target, draft, p, args.n_predict,
                                                                    args.threads, args.draft_threads))
                for label, p in prompts.items()}
    finally:
        wb.unload(did)
        wb.unload(tid)


def time_rows(path: Path, threads: int, rounds: int) -> dict[int, float]:
    """Median seconds of one decode of k rows (all with logits) after a 100-token prompt."""
    import time

    from workbench import _native
    from workbench.options import LoadConfig, context_params, model_params

    cfg = LoadConfig(model_path=str(path), n_threads=threads, n_ctx=1024, n_seq_max=1)
    model = _native.Model(str(path), 0, True, False, model_params(cfg))
    ctx = _native.Context(model, context_params(cfg, model.n_ctx_train))
    try:
        prompt = (model.tokenize(TEXT * 2, True, False))[:100]
        n = len(prompt)
        ctx.decode(prompt, list(range(n)), [0] * n, [0] * (n - 1) + [1], 0.0)
        out: dict[int, float] = {}
        for k in (1, 2, 3, 4, 5, 6, 8, 12, 16):
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                ctx.decode(prompt[:k], list(range(n, n + k)), [0] * k, [1] * k, 0.0)
                times.append(time.perf_counter() - t0)
                ctx.seq_rm(0, n, -1)
            out[k] = statistics.median(times)
        return out
    finally:
        ctx.close()
        model.close()


def report_rows(name: str, rows: dict[int, float]) -> None:
    t1 = rows[1]
    print(f"\nverify rows, {name}: one decode of k rows vs one plain step ({t1 * 1e3:.1f} ms)")
    print(f"{'k':>3}{'ms':>8}{'x plain step':>14}{'all accepted':>14}{'at a=0.76':>11}{'at a=0.9':>10}")
    for k, t in rows.items():
        at = [(1 + (a * (1 - a ** (k - 1)) / (1 - a))) * t1 / t for a in (0.76, 0.9)]
        print(f"{k:>3}{t * 1e3:>8.1f}{t / t1:>14.2f}{k * t1 / t:>14.2f}{at[0]:>11.2f}{at[1]:>10.2f}")


def run_verify_rows(args: argparse.Namespace) -> dict[str, Any]:
    models = [wb.fetch_default_model()]
    if args.qwen_ngram:
        from tests.integration.heavy_models import QWEN_CODER_15B, fetch_chunked
        models.append(fetch_chunked(QWEN_CODER_15B))
    out = {}
    for path in models:
        out[path.name] = time_rows(path, args.threads, args.rounds)
        report_rows(path.name, out[path.name])
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--no-default", action="store_true", help="skip the default model's n-gram sides")
    ap.add_argument("--qwen-ngram", action="store_true", help="the n-gram sides on Qwen2.5-Coder 1.5B too (heavy)")
    ap.add_argument("--pair", action="store_true", help="also the Qwen2.5-Coder 1.5B + 0.5B pair (heavy)")
    ap.add_argument("--draft-threads", type=int, default=None, help="the draft model's threads (default: --threads)")
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"prompt classes, of {','.join(CLASSES)}")
    ap.add_argument("--fixed", action="store_true", help="speculate with adaptive=False (always n_max drafts)")
    ap.add_argument("--both", action="store_true", help="each of our speculative sides adaptive and fixed")
    ap.add_argument("--decode-budget-ms", type=int, default=30000,
                    help="the engines' bound on one native step (0 = off: a smoke run on a loaded machine)")
    ap.add_argument("--verify-rows", action="store_true",
                    help="only time a decode of k rows against a plain step (Qwen 1.5B too with --qwen-ngram)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.draft_threads = args.draft_threads or args.threads
    unknown = [c for c in args.classes.split(",") if c not in CLASSES]
    if unknown:
        ap.error(f"--classes: unknown {unknown}; expected some of {list(CLASSES)}")
    return args


def main() -> int:
    args = parse_args()
    MODES[:] = [True, False] if args.both else [not args.fixed]
    prompts = {CLASSES[c]: PROMPTS[CLASSES[c]] for c in args.classes.split(",")}
    out: dict[str, Any] = {"threads": args.threads, "draft_threads": args.draft_threads, "rounds": args.rounds,
                           "n_predict": args.n_predict}
    modes = "adaptive and fixed" if args.both else "fixed" if args.fixed else "adaptive"
    if args.verify_rows:
        out["verify_rows"] = run_verify_rows(args)
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
        return 0
    print(f"{args.threads} threads, {args.rounds} alternating rounds, {args.n_predict} tokens, greedy, "
          f"drafts of at most {N_DRAFT} ({modes}), llama.cpp {wb._native.llama_commit[:10]}")
    if not args.no_default:
        model = wb.fetch_default_model()
        out["ngram"] = run_ngram(args, model, "bench-default", prompts)
        report(f"n-gram self-speculation, {model.name}", out["ngram"])
    if args.qwen_ngram or args.pair:
        from tests.integration.heavy_models import QWEN_CODER_05B, QWEN_CODER_15B, fetch_chunked

        target = fetch_chunked(QWEN_CODER_15B)
        if args.qwen_ngram:
            out["qwen_ngram"] = run_ngram(args, target, "bench-qwen", prompts)
            report(f"n-gram self-speculation, {target.name}", out["qwen_ngram"])
        if args.pair:
            draft = fetch_chunked(QWEN_CODER_05B)
            out["pair"] = run_pair(args, target, draft, prompts)
            report(f"draft model: {target.name} drafted by {draft.name} ({args.draft_threads} draft threads)",
                   out["pair"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
