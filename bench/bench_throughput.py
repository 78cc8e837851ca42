#!/usr/bin/env python3
"""Prefill and decode throughput of workbench beside llama.cpp's own llama-bench, one run.

Same model file, same vendored llama.cpp build, same threads, batch sizes, KV type and
flash-attention setting. llama-bench's pp512 times one llama_decode of 512 prompt tokens;
its tg128 times 128 single-token decodes. Ours: a 512-token prompt (random ids, like
llama-bench's) through ``complete`` timed from the start to the end of its prefill, and 128
generated tokens timed from the first to the last (sampling and Python included).

Rounds alternate (llama-bench with one repetition, then ours once) and the ratio reported
is the median of the per-round ratios, so a drift of a shared machine hits both sides.

    python bench/bench_throughput.py [--rounds 5] [--threads N] [--deterministic] [--json out.json]
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


class Ours:
    """The default model loaded once, as llama-bench sets up its context."""

    def __init__(self, model: Path, threads: int, n_prompt: int, n_gen: int, deterministic: bool = False) -> None:
        self.mid = wb.load_model(model_path=str(model), n_threads=threads, n_batch=2048, n_ubatch=512,
                                 flash_attn="auto", n_seq_max=1, prefill_chunk_size=None,
                                 n_ctx=max(n_prompt, n_gen) + 256, deterministic=deterministic)
        self.n_prompt, self.n_gen = n_prompt, n_gen
        self.rng = random.Random(1234)
        self.n_vocab = wb.model_info(self.mid)["n_vocab"]
        wb.complete(self.mid, self._ids(64), response_tokens=4, cache=False)  # warm-up

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(self.n_vocab) for _ in range(n)]

    def measure(self) -> dict[str, float]:
        r = wb.complete(self.mid, self._ids(self.n_prompt), response_tokens=1, cache=False)
        prefill = self.n_prompt / r.stats.prefill_s
        r = wb.complete(self.mid, self._ids(1), response_tokens=self.n_gen + 1, ignore_eos=True, cache=False)
        return {"prefill": prefill, "decode": r.stats.decode_tps}

    def close(self) -> None:
        wb.unload(self.mid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5,
                    help="alternating rounds: llama-bench (one repetition) then workbench (one)")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--deterministic", action="store_true", help="ours with load_model(deterministic=True)")
    args = ap.parse_args()
    model = args.model or wb.fetch_default_model()
    ours = Ours(model, args.threads, args.n_prompt, args.n_gen, args.deterministic)
    rounds = []
    try:
        for _ in range(args.rounds):
            # alternate, so a drift of the machine (other jobs, clocks) hits both sides alike
            ref = llama_bench(model, args.threads, 1, args.n_prompt, args.n_gen)
            got = ours.measure()
            rounds.append({k: (ref[k], got[k]) for k in ("prefill", "decode")})
    finally:
        ours.close()
    print(f"model {model.name}, {args.threads} threads, {args.rounds} alternating rounds, "
          f"llama.cpp {wb._native.llama_commit[:10]}")
    print(f"{'test':<16}{'llama-bench tok/s':>20}{'workbench tok/s':>18}{'ratio':>8}{'ratio range':>16}")
    rows = {}
    for key, label in (("prefill", f"prefill pp{args.n_prompt}"), ("decode", f"decode tg{args.n_gen}")):
        refs = [r[key][0] for r in rounds]
        gots = [r[key][1] for r in rounds]
        ratios = [g / f for f, g in zip(refs, gots)]
        ratio = statistics.median(ratios)
        rows[key] = {"llama_bench": statistics.median(refs), "workbench": statistics.median(gots),
                     "ratio": ratio, "ratios": ratios}
        print(f"{label:<16}{rows[key]['llama_bench']:>20.1f}{rows[key]['workbench']:>18.1f}{ratio:>8.3f}"
              f"{min(ratios):>8.3f}-{max(ratios):.3f}")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "results": rows},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
