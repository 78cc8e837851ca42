#!/usr/bin/env python3
"""A busy machine and several decoding threads: prefill and decode speed by threads and by
how ggml's OpenMP threads wait (workbench/openmp.py).

Each setting runs in a fresh process (libgomp reads its settings once, when it loads):
OpenMP's waits as libgomp sets them (GOMP_SPINCOUNT=300,000, its own default, so that
importing workbench changes nothing) and as the workbench sets them (OMP_WAIT_POLICY=ACTIVE,
GOMP_SPINCOUNT=10,000).

* bench/bench_throughput.py, so llama-bench and the workbench run side by side under the
  same environment, at threads 1 and N (the cores this process may use), first on a quiet
  machine, then beside one busy-loop process per core (``python -c "while True: pass"``),
  which the bench starts and stops;
* two models: the workbench's decode speed (N threads, quiet) with a second model loaded
  that has decoded once (its loop thread then owns an OpenMP team), and after it is unloaded.

    python bench/bench_busy.py [--rounds 2] [--n-prompt 128] [--n-gen 32] [--json out.json]

Prints tokens/s per setting and phase (llama-bench's and ours); on a busy machine the
numbers move from run to run (the scheduler decides), so read them as factors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench.openmp import POLICY_ENV, SETTINGS, SPIN_ENV  # noqa: E402

HERE = Path(__file__).resolve().parent
WAITS = {"libgomp": {SPIN_ENV: "300000"},   # libgomp's own default, stated so workbench keeps it
         "workbench": SETTINGS}


def child_env(waits: str) -> dict[str, str]:
    # threads are the bench's to set: WORKBENCH_N_THREADS would change the two-model child's
    env = {k: v for k, v in os.environ.items() if k not in (SPIN_ENV, POLICY_ENV, "WORKBENCH_N_THREADS")}
    return {**env, **WAITS[waits]}


def throughput(threads: int, waits: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    env = child_env(waits)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.json"
        subprocess.run([sys.executable, str(HERE / "bench_throughput.py"), "--rounds", str(args.rounds),
                        "--threads", str(threads), "--n-prompt", str(args.n_prompt), "--n-gen", str(args.n_gen),
                        "--json", str(out)], env=env, check=True, capture_output=True)
        results = json.loads(out.read_text())["results"]
    return {k: {"llama_bench": v["llama_bench"], "workbench": v["workbench"]} for k, v in results.items()}


TWO_MODELS = """
import json, sys, workbench as wb
def speed(m):
    return wb.complete(m, [100], response_tokens=65, ignore_eos=True, cache=False).stats.decode_tps
a = wb.load_model(model_id="busy-a", n_seq_max=1)
speed(a)
alone = max(speed(a) for _ in range(3))
b = wb.load_model(model_id="busy-b", n_seq_max=1)
speed(b)
beside = max(speed(a) for _ in range(3))
wb.unload(b)
after = max(speed(a) for _ in range(3))
print(json.dumps({"alone": alone, "second_loaded": beside, "after_unload": after}))
"""


def two_models(waits: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", TWO_MODELS], env=child_env(waits), check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))   # the cores, whatever WORKBENCH_N_THREADS says
    settings = [(t, w) for t in sorted({1, cores}) for w in WAITS]
    rows = []
    for phase in ("quiet", "busy"):
        procs = burners(cores) if phase == "busy" else []
        try:
            for threads, waits in settings:
                got = throughput(threads, waits, args)
                rows.append({"phase": phase, "threads": threads, "waits": waits, **got})
                p, d = got["prefill"], got["decode"]
                print(f"{phase:<6} threads {threads:>2}, {waits:<9} waits: prefill {p['llama_bench']:7.1f} "
                      f"(llama-bench) {p['workbench']:7.1f} (ours), decode {d['llama_bench']:6.1f} "
                      f"{d['workbench']:6.1f} tok/s", flush=True)
        finally:
            for b in procs:
                b.kill()
                b.wait()
    pairs = {}
    for waits in WAITS:
        pairs[waits] = two_models(waits)
        t = pairs[waits]
        print(f"two models, {waits:<9} waits: decode alone {t['alone']:6.1f}, a second model loaded "
              f"{t['second_loaded']:6.1f}, after its unload {t['after_unload']:6.1f} tok/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cores": cores, "rounds": args.rounds, "n_prompt": args.n_prompt,
                                         "n_gen": args.n_gen, "rows": rows,
                                         "two_models": pairs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
