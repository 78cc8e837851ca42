#!/usr/bin/env python3
"""The engine loop's own time per tick (issue 30), at 1, 4 and 16 streams.

A tick is ``Loop._tick``; inside it, llama.cpp's time is the native decode
(``Context.decode``) and the samplers' draw (``BatchResults.draw``: the native sampler or
argmax over the logits row). The loop's own time is the rest: commands, cancels, admission,
time limits, the strategy's plan and its check, building the native rows, applying the
results (KV bookkeeping, detokenising, stop strings, events). Each is timed by wrapping it in
this process (perf_counter_ns, one clock) while S greedy streams of a 16-token prompt decode
T tokens each (``ignore_eos``, cache off); the requests' events are read only after they
end, so no consumer thread competes for the GIL while the loop runs. Ticks that prefill are
left out (one per stream): the figures are decode ticks.

A second set of rounds ("warm") runs the same ticks on a second instance of the model with
llama_decode skipped after the prefill (the samplers draw from the prefill's logits): the
loop's own work with the CPU's caches warm, as where llama_decode does not run on the CPU
(a GPU). On a CPU, a decode streams the model's weights through the caches, and the Python
that follows refills them: ``cache_refill`` times a fixed piece of Python (100 small calls)
right after a 128 MiB memory sweep and again at once, the machine's factor for that.

    python bench/bench_tick.py [--widths 1,4,16] [--tokens 128] [--rounds 3] [--json out.json]

Prints, per width: ticks, ms per tick (total, decode, draw, own) and the own time's
breakdown by step, the median of the rounds, cold (real decodes) then warm. Targets
(issue 30): own <= 0.1 ms at 1 stream and <= 0.4 ms at 16.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workbench as wb  # noqa: E402
from workbench import registry  # noqa: E402

STEPS = ("_admit", "_plan", "apply")   # the loop's own steps timed apart (the rest: "other")


class Clock:
    """Nanoseconds spent in each wrapped call during decode ticks."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.ticks = 0
        self._tick: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        """Time ``owner.name`` under ``label``; returns the undo."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self._tick[label] += time.perf_counter_ns() - t0

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    def end_tick(self, prefilling: bool) -> None:
        if not prefilling and self._tick.get("tick"):
            self.ticks += 1
            for k, v in self._tick.items():
                self.ns[k] += v
        self._tick = defaultdict(int)


class TimedCtx:
    """The native context with ``decode`` timed (everything else passed through)."""

    def __init__(self, ctx: Any, clock: Clock) -> None:
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_clock", clock)
        object.__setattr__(self, "skip", False)   # warm rounds: no llama_decode

    def decode(self, *args: Any) -> int:
        t0 = time.perf_counter_ns()
        try:
            return 0 if self.skip else int(self._ctx.decode(*args))
        finally:
            self._clock._tick["decode"] += time.perf_counter_ns() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def instrument(engine: Any, clock: Clock, warm: bool = False) -> Callable[[], None]:
    loop, results, pool = engine.loop, engine.results, engine.pool
    undo = [clock.wrap(results, "draw", "draw")]
    undo += [clock.wrap(loop if step != "apply" else results, step, step) for step in STEPS]
    tick = loop._tick
    # the decode step sees a context whose decode is timed; the samplers get the real one
    real_ctx, decode, timed_ctx = pool.ctx, loop._decode, TimedCtx(pool.ctx, clock)

    def timed_tick() -> None:
        prefilling = any(r.phase == "prefilling" for r in engine.table.active)
        timed_ctx.skip = warm and not prefilling
        t0 = time.perf_counter_ns()
        try:
            tick()
        finally:
            clock._tick["tick"] += time.perf_counter_ns() - t0
            clock.end_tick(prefilling)

    loop._tick = timed_tick
    undo.append(lambda: setattr(loop, "_tick", tick))

    def timed_decode(batch: Any) -> int:
        pool.ctx = timed_ctx
        try:
            return int(decode(batch))
        finally:
            pool.ctx = real_ctx

    loop._decode = timed_decode
    undo.append(lambda: setattr(loop, "_decode", decode))
    return lambda: [u() for u in reversed(undo)]


def one_round(model: str, width: int, tokens: int, seed: int, warm: bool = False) -> dict[str, float]:
    engine = next(e for e in registry.engines() if e.model_id == model)
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 20_000) for _ in range(16)] for _ in range(width)]
    clock = Clock()
    undo = instrument(engine, clock, warm)
    try:
        streams = [wb.stream(model, p, response_tokens=tokens, ignore_eos=True, cache=False) for p in prompts]
        results = [s.result() for s in streams]
    finally:
        undo()
    assert all(len(r.tokens) == tokens for r in results)
    per = {k: v / clock.ticks / 1e6 for k, v in clock.ns.items()}
    own = per["tick"] - per.get("decode", 0.0) - per.get("draw", 0.0)
    apply_own = per.get("apply", 0.0) - per.get("draw", 0.0)
    out = {"ticks": clock.ticks, "tick_ms": per["tick"], "decode_ms": per.get("decode", 0.0),
           "draw_ms": per.get("draw", 0.0), "own_ms": own, "admit_ms": per.get("_admit", 0.0),
           "plan_ms": per.get("_plan", 0.0), "apply_own_ms": apply_own}
    out["other_ms"] = own - out["admit_ms"] - out["plan_ms"] - apply_own
    return out


def _python_work() -> list[tuple[int, str]]:
    """A fixed piece of Python: 50 loop steps, 100 small calls."""
    out = []
    for i in range(50):
        out.append((i, str(i)))
    return out


def cache_refill(sweep_mib: int = 128, reps: int = 200) -> dict[str, float]:
    """Microseconds of ``_python_work`` right after a memory sweep of ``sweep_mib`` MiB
    (as a decode streams a model's weights) and run again at once; the median of reps."""
    src, dst = bytearray(sweep_mib << 20), bytearray(sweep_mib << 20)
    after, again = [], []
    for _ in range(reps):
        dst[:] = src
        t0 = time.perf_counter_ns()
        _python_work()
        t1 = time.perf_counter_ns()
        _python_work()
        after.append(t1 - t0)
        again.append(time.perf_counter_ns() - t1)
    a, b = statistics.median(after) / 1e3, statistics.median(again) / 1e3
    return {"sweep_mib": sweep_mib, "after_sweep_us": a, "warm_us": b, "factor": a / b}


def rounds_by_width(model: str, widths: list[int], tokens: int, n: int, warm: bool) -> dict[int, dict[str, float]]:
    table = {}
    for width in widths:
        rounds = [one_round(model, width, tokens, seed=r, warm=warm) for r in range(n)]
        table[width] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return table


KEYS = ["ticks", "tick_ms", "decode_ms", "draw_ms", "own_ms", "admit_ms", "plan_ms", "apply_own_ms", "other_ms"]


def print_table(title: str, table: dict[int, dict[str, float]]) -> None:
    print(title)
    print("streams " + " ".join(f"{k:>12}" for k in KEYS))
    for width, row in table.items():
        print(f"{width:>7} " + " ".join(f"{row[k]:>12.0f}" if k == "ticks" else f"{row[k]:>12.3f}" for k in KEYS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    load = {"n_seq_max": max(widths), "n_ctx": max(4096, max(widths) * 256)}
    model = wb.load_model(**load)
    wb.complete(model, "warm up", response_tokens=8, ignore_eos=True, cache=False)
    cold = rounds_by_width(model, widths, args.tokens, args.rounds, warm=False)
    wb.unload(model)
    model = wb.load_model(**load, model_id="bench-tick-warm")   # its KV never holds the skipped tokens
    wb.complete(model, "warm up", response_tokens=8, ignore_eos=True, cache=False)
    warm = rounds_by_width(model, widths, args.tokens, args.rounds, warm=True)
    wb.unload(model)
    refill = cache_refill()
    print_table("cold (real decodes), ms a decode tick", cold)
    print_table("warm (llama_decode skipped), ms a decode tick", warm)
    print(f"cache refill: {refill['after_sweep_us']:.1f} us after a {refill['sweep_mib']} MiB sweep, "
          f"{refill['warm_us']:.1f} us warm ({refill['factor']:.1f}x)")
    if args.json:
        args.json.write_text(json.dumps({"tokens": args.tokens, "rounds": args.rounds, "by_streams": cold,
                                         "warm_by_streams": warm, "cache_refill": refill}, indent=1))


if __name__ == "__main__":
    main()
