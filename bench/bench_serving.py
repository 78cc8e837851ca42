#!/usr/bin/env python3
"""Serving under open-loop load: the workbench's endpoint beside llama-server, one run.

Both sides run the same model file on the same vendored llama.cpp build tree and flags
(`make server-tool` builds llama-server there), with the same KV layout, context, number of
sequences, batch sizes, threads and a prompt cache of the same RAM budget, each in a process
of its own, loaded one at a time (never at once). The client is the same for both: the
workbench's open-loop load generator `lab.load_test`, in this process, driving each server's
streaming `/v1/completions` with token-id prompts.

The workload: `lab.traces.multi_turn_chats` (chats sharing 4 system prompts, each turn the
previous turn's prompt + a reply + a user message; segment lengths scaled down to what two
cores serve, see the --*-tokens flags), Poisson arrivals at `--rate` requests/s,
`--response-tokens` tokens each (ignore_eos, greedy). Without `--rate`, a short calibration
first measures each server's saturated request throughput on another trace of the same shape
(`--calibrate-requests` requests, at most `--seqs` in flight) and the rate is `--load` (0.7)
times the lower of the two.

Both servers are started once and stay up; the load goes to one at a time, in `--rounds`
rounds (each side `--duration / --rounds` seconds of arrivals per round, a new trace seed
each round, the same for both sides) whose order alternates, so a drift of a shared machine
hits both sides alike. Each side's figures are over all its rounds' requests.

The flags, side by side (every one is printed, and recorded in `--json`):

    workbench     wb.load_model(n_ctx=C, n_seq_max=S, n_threads=T, n_threads_batch=T, n_batch=2048,
                  n_ubatch=512, flash_attn='auto', type_k='f16', type_v='f16'), its prefix cache
                  on (the default RAM tier, 1 GiB), then wb.serve() (127.0.0.1)
    llama-server  -c C -np S --kv-unified -cb -t T -tb T -b 2048 -ub 512 -fa auto -ctk f16 -ctv f16
                  --cache-prompt --cache-ram 1024 --fit off --no-webui --host 127.0.0.1

The workbench's KV cache is always unified (one buffer of n_ctx cells shared by its
sequences, any of which may grow to n_ctx): `--kv-unified` with `-c C` is the same layout
(llama-server caps a slot at the model's training context, 8192 for the default model; the
prompts here stay far below it).

Reported for each side: p50 / p99 TTFT and TPOT, request and output-token throughput,
goodput under `--slo-ttft` / `--slo-tpot`, the prompt tokens served from each side's cache,
and the ratios workbench / llama-server against the issue's targets. The workbench's own
readings (`wb.history()`, the engine's clock) are matched to the client's rows by `ref` and
their medians compared.

    python bench/bench_serving.py [--rate R | --calibrate-requests 40] [--duration 120] [--rounds 3]
        [--seqs 8] [--n-ctx 16384] [--response-tokens 32] [--slo-ttft 2.0] [--slo-tpot 0.1]
        [--in-process] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _paths import tool  # noqa: E402

import workbench as wb  # noqa: E402
from workbench import lab  # noqa: E402
from workbench.options import default_threads  # noqa: E402

TARGETS = {"goodput": (">=", 1.2), "ttft_s_p99": ("<=", 0.8), "tpot_s_p50": ("<=", 1.05)}
CACHE_RAM_MIB = 1024  # the workbench's default RAM tier budget (workbench/cache/shared.py), for both


# --- the workload ------------------------------------------------------------------------------------

def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def chats(n: int, seed: int, args: argparse.Namespace) -> lab.traces.Trace:
    """multi_turn_chats scaled to what 2 cores serve: shorter segments, shorter chats."""
    return lab.traces.multi_turn_chats(n, seed=seed, concurrency=args.chats, system_prompts=4,
                                       system_tokens=_range(args.system_tokens), turns=_range(args.turns),
                                       user_tokens=_range(args.user_tokens), reply_tokens=_range(args.reply_tokens),
                                       max_context=args.max_context)


TRACE_ARGS = ("chats", "system_tokens", "turns", "user_tokens", "reply_tokens", "max_context")


# --- the two servers -----------------------------------------------------------------------------------

def load_options(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    return {"model_path": str(model), "n_ctx": args.n_ctx, "n_seq_max": args.seqs, "n_threads": args.threads,
            "n_threads_batch": args.threads, "n_batch": 2048, "n_ubatch": 512, "flash_attn": "auto",
            "type_k": "f16", "type_v": "f16"}


def server_flags(args: argparse.Namespace, model: Path, port: int) -> list[str]:
    return ["-m", str(model), "-c", str(args.n_ctx), "-np", str(args.seqs), "--kv-unified", "-cb",
            "-t", str(args.threads), "-tb", str(args.threads), "-b", "2048", "-ub", "512", "-fa", "auto",
            "-ctk", "f16", "-ctv", "f16", "--cache-prompt", "--cache-ram", str(CACHE_RAM_MIB), "--fit", "off",
            "--no-webui", "--host", "127.0.0.1", "--port", str(port)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was healthy ({url})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} was not healthy after {timeout:.0f} s")


class LlamaServer:
    """llama-server from the build tree, on 127.0.0.1, its log in a temporary file."""

    name = "llama-server"

    def __init__(self, args: argparse.Namespace, model: Path, flags: Any = None) -> None:
        """``flags(port)``: the command line's flags (default: this bench's ``server_flags``)."""
        port = _free_port()
        self.cmd = [str(tool("llama-server")), *(flags(port) if flags else server_flags(args, model, port))]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-serving-llama-server-", suffix=".log")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        _wait_healthy(self.url, self.proc)

    def timings(self) -> dict[str, float]:
        """Prompt and generation work from its log's per-request timing lines."""
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        out = {"prompt_eval_tokens": 0.0, "prompt_eval_ms": 0.0, "eval_tokens": 0.0, "eval_ms": 0.0}
        for kind, ms, n in re.findall(r"\b(prompt eval|eval) time =\s*([\d.]+) ms /\s*(\d+) tokens", text):
            key = "prompt_eval" if kind == "prompt eval" else "eval"
            out[key + "_ms"] += float(ms)
            out[key + "_tokens"] += int(n)
        return out

    def stop(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"timings": self.timings()}
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return facts


class WorkbenchServer:
    """`wb.load_model(...)` + `wb.serve()` in a child process (this script, `--serve-workbench`),
    so the client's Python never shares a GIL with the server it measures (llama-server does
    not either); on stop it hands back `wb.history()` and `wb.counters()`."""

    name = "workbench"

    def __init__(self, args: argparse.Namespace, model: Path, options: dict[str, Any] | None = None) -> None:
        self.options = options if options is not None else load_options(args, model)
        self.cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-workbench", json.dumps(self.options)]
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = ""
        while not line.startswith("URL "):  # anything the load printed before it
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the workbench server exited with {self.proc.wait()} before serving")
        line = line.strip()
        self.url = line[4:]
        _wait_healthy(self.url, self.proc)

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
            self.proc.stdin.write(f"stop {f.name}\n")
            self.proc.stdin.flush()
            self.proc.stdout.readline()  # "stopped"
            facts = json.loads(Path(f.name).read_text())
        self.proc.wait(timeout=60)
        return facts


def serve_workbench(options_json: str) -> None:
    """The child: load, serve, print the URL; on `stop <path>` write the history and counters there."""
    wb.load_model(**json.loads(options_json))
    srv = wb.serve()
    print("URL " + srv.url, flush=True)
    for line in sys.stdin:
        if line.startswith("stop "):
            srv.stop()
            rows = [{k: v for k, v in r.items() if k != "itl_s"} for r in wb.history()]
            Path(line[5:].strip()).write_text(json.dumps({"history": rows, "counters": wb.counters()}))
            print("stopped", flush=True)
            return


# --- one measurement ----------------------------------------------------------------------------------

def warm_up(target: str, args: argparse.Namespace) -> None:
    """A few requests of an unrelated trace: weights paged in, threads and HTTP path awake."""
    lab.load_test(target, chats(4, args.seed + 1000, args), rate=1000.0, max_concurrency=4,
                  response_tokens=8, progress=False)


def calibrate(server: Any, args: argparse.Namespace) -> float:
    """Saturated request throughput: a trace of the same shape, at most --seqs in flight."""
    warm_up(server.url, args)
    r = lab.load_test(server.url, chats(args.calibrate_requests, args.seed + 2000, args), rate=1000.0,
                      max_concurrency=args.seqs, response_tokens=args.response_tokens, progress=False)
    if r.summary["failed"]:
        raise SystemExit(f"{server.name}: {r.summary['failed']} calibration requests failed")
    return float(r.summary["request_throughput"])


def measure(target: str, trace: lab.traces.Trace, rate: float, seconds: float, seed: int,
            args: argparse.Namespace, slo: dict[str, float]) -> Any:
    return lab.load_test(target, trace, rate=rate, duration_s=seconds, slo=slo, seed=seed,
                         response_tokens=args.response_tokens, progress=False)


def combine(results: list[Any]) -> tuple[dict[str, Any], Any]:
    """One summary over several rounds: their requests together, throughputs over the sum of
    their durations (the figures `lab.load_test` reports for one round)."""
    import numpy as np
    import pandas as pd

    df = pd.concat([r.requests.reset_index() for r in results], ignore_index=True)
    duration = sum(r.summary["duration_s"] for r in results)
    done = df[df["error"].isna()]
    s: dict[str, Any] = {"sent": len(df), "completed": len(done), "failed": int(df["error"].notna().sum()),
                         "duration_s": duration, "rounds": len(results),
                         "request_throughput": len(done) / duration,
                         "output_throughput": float(done["generated_tokens"].sum()) / duration,
                         "goodput": float(done["meets_slo"].sum()) / duration,
                         "meets_slo": int(done["meets_slo"].sum())}
    gaps = [a for a in done["itl_s"] if len(a)]
    series = {"ttft_s": done["ttft_s"].dropna().to_numpy(), "tpot_s": done["tpot_s"].dropna().to_numpy(),
              "itl_s": np.concatenate(gaps) if gaps else np.empty(0), "e2e_s": done["e2e_s"].dropna().to_numpy()}
    for name, values in series.items():
        for label, q in (("mean", None), ("p50", 50), ("p90", 90), ("p99", 99)):
            s[f"{name}_{label}"] = (math.nan if len(values) == 0 else
                                    float(values.mean()) if q is None else float(np.percentile(values, q)))
    prompt = int(done["prompt_tokens"].sum())
    cached = int(done["cached_tokens"].fillna(0).sum())
    s.update(prompt_tokens=prompt, cached_tokens=cached, prefilled_tokens=prompt - cached,
             cached_fraction=cached / prompt if prompt else math.nan,
             queued_s_p50=float((done["sent_s"] - done["arrival_s"]).median()) if len(done) else math.nan)
    s["errors"] = sorted(set(df["error"].dropna().astype(str)))[:5]
    return s, df


def agreement(requests: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's medians (wb.history(), matched by ref) against the client's, in percent."""
    by_ref = {r["ref"]: r for r in history}
    rows = requests[requests["error"].isna() & requests["ref"].notna()]
    pairs = [(row, by_ref[int(row.ref)]) for row in rows.itertuples() if int(row.ref) in by_ref]
    out: dict[str, Any] = {"matched": len(pairs), "client_rows": len(rows)}
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        ours = [h[key] for _, h in pairs if h[key] is not None]
        theirs = [getattr(c, key) for c, _ in pairs if not math.isnan(getattr(c, key))]
        if ours and theirs:
            engine, client = statistics.median(ours), statistics.median(theirs)
            out[key] = {"engine_p50": engine, "client_p50": client, "diff_pct": 100.0 * (engine - client) / client}
    return out


# --- the report ----------------------------------------------------------------------------------------

ROWS = [("TTFT p50 (s)", "ttft_s_p50", "{:.3f}"), ("TTFT p99 (s)", "ttft_s_p99", "{:.3f}"),
        ("TPOT p50 (s)", "tpot_s_p50", "{:.4f}"), ("TPOT p99 (s)", "tpot_s_p99", "{:.4f}"),
        ("ITL p99 (s)", "itl_s_p99", "{:.4f}"), ("E2E p50 (s)", "e2e_s_p50", "{:.3f}"),
        ("requests/s", "request_throughput", "{:.3f}"), ("output tok/s", "output_throughput", "{:.1f}"),
        ("goodput (req/s)", "goodput", "{:.3f}"), ("completed / sent", None, ""),
        ("prompt tokens from cache", "cached_fraction", "{:.3f}"), ("prefilled tokens", "prefilled_tokens", "{}"),
        ("queued in client p50 (s)", "queued_s_p50", "{:.3f}")]


def report(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    names = list(runs)
    print(f"{'':28s}" + "".join(f"{n:>16s}" for n in names) + f"{'wb / llama-server':>20s}")
    for label, key, fmt in ROWS:
        if key is None:
            cells = [f"{r['completed']} / {r['sent']}" for r in runs.values()]
            print(f"{label:28s}" + "".join(f"{c:>16s}" for c in cells))
            continue
        cells = [fmt.format(r[key]) for r in runs.values()]
        ratio = ""
        if "workbench" in runs and "llama-server" in runs and runs["llama-server"][key]:
            ratio = f"{runs['workbench'][key] / runs['llama-server'][key]:.3f}"
        print(f"{label:28s}" + "".join(f"{c:>16s}" for c in cells) + f"{ratio:>20s}")
    verdict: dict[str, Any] = {}
    if "workbench" in runs and "llama-server" in runs:
        for key, (op, bound) in TARGETS.items():
            ref = runs["llama-server"][key]
            ratio = runs["workbench"][key] / ref if ref else math.nan
            met = ratio >= bound if op == ">=" else ratio <= bound
            verdict[key] = {"ratio": ratio, "target": f"{op} {bound}", "met": bool(met)}
            print(f"target {key}: workbench / llama-server = {ratio:.3f} (target {op} {bound}): "
                  + ("met" if met else "NOT met"))
    return verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve-workbench", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=None, help="arrivals/s; default: calibrated (--load x capacity)")
    ap.add_argument("--load", type=float, default=0.7, help="the calibrated rate's share of the lower capacity")
    ap.add_argument("--calibrate-requests", type=int, default=40)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per side, all rounds")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (each side --duration / --rounds s)")
    ap.add_argument("--seqs", type=int, default=8, help="n_seq_max = llama-server -np")
    ap.add_argument("--n-ctx", type=int, default=16384, help="KV cells shared by the sequences (both sides)")
    # the trace (lab.traces.multi_turn_chats; ranges as lo,hi tokens)
    ap.add_argument("--chats", type=int, default=16, help="conversations open at once")
    ap.add_argument("--system-tokens", default="100,400", help="each of the 4 shared system prompts")
    ap.add_argument("--turns", default="2,8")
    ap.add_argument("--user-tokens", default="10,80")
    ap.add_argument("--reply-tokens", default="20,100", help="the previous turn's reply in the next prompt")
    ap.add_argument("--max-context", type=int, default=1024, help="a chat ends before this many tokens")
    ap.add_argument("--response-tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--slo-ttft", type=float, default=2.0)
    ap.add_argument("--slo-tpot", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--order", default="workbench,llama-server", help="which side runs first")
    ap.add_argument("--in-process", action="store_true",
                    help="also drive the engine in this process (wb.stream), after the two servers")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.serve_workbench:
        serve_workbench(args.serve_workbench)
        return 0

    model = args.model or wb.fetch_default_model()
    sides = {"workbench": WorkbenchServer, "llama-server": LlamaServer}
    order = [s.strip() for s in args.order.split(",")]
    if sorted(order) != sorted(sides):
        raise SystemExit("--order names workbench and llama-server")
    slo = {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot}
    started = time.time()
    print(f"model {model.name}, llama.cpp {wb._native.llama_commit[:12]}, {args.threads} threads, "
          f"{args.seqs} sequences, n_ctx {args.n_ctx}, load average {os.getloadavg()[0]:.2f}")
    print("workbench    wb.load_model(" + ", ".join(f"{k}={v!r}" for k, v in load_options(args, model).items()
                                                 if k != "model_path") + ") + wb.serve()")
    print("llama-server " + " ".join(server_flags(args, model, 0)[2:-2]))

    capacity: dict[str, float] = {}
    rate = args.rate
    if rate is None:
        for name in order:
            server = sides[name](args, model)
            try:
                capacity[name] = calibrate(server, args)
            finally:
                server.stop()
            print(f"calibration: {name} saturated at {capacity[name]:.3f} requests/s "
                  f"({args.calibrate_requests} requests, at most {args.seqs} in flight)", flush=True)
        rate = args.load * min(capacity.values())
    seconds = args.duration / args.rounds
    # one trace per round (other chats and system prompts), the same for both sides
    traces = [chats(max(64, int(rate * seconds * 2)), args.seed + r, args) for r in range(args.rounds)]
    d = traces[0].describe()
    print(f"workload: {traces[0].name}, {args.rounds} rounds of Poisson {rate:.3f} requests/s for {seconds:.0f} s "
          f"(trace seeds {args.seed}..{args.seed + args.rounds - 1}), {args.response_tokens} tokens each, "
          f"SLO TTFT <= {args.slo_ttft} s and TPOT <= {args.slo_tpot} s", flush=True)

    # both servers up (the idle one waits on a socket), loaded one at a time: the rounds
    # alternate which goes first, so a drift of a shared machine hits both
    servers: dict[str, Any] = {}
    results: dict[str, list[Any]] = {name: [] for name in order}
    facts: dict[str, Any] = {}
    try:
        for name in order:
            servers[name] = sides[name](args, model)
            warm_up(servers[name].url, args)
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                res = measure(servers[name].url, traces[r], rate, seconds, args.seed + r, args, slo)
                results[name].append(res)
                print(f"round {r + 1} {name}: {res.summary['completed']} of {res.summary['sent']} requests in "
                      f"{res.summary['duration_s']:.1f} s, p50 TTFT {res.summary['ttft_s_p50']:.3f} s "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        for name, server in servers.items():
            facts[name] = server.stop()
    runs: dict[str, dict[str, Any]] = {}
    for name in order:
        runs[name], df = combine(results[name])
        if name == "workbench":
            facts["agreement"] = agreement(df, facts["workbench"].pop("history"))
    if args.in_process:
        mid = wb.load_model(**load_options(args, model))
        try:
            warm_up(mid, args)
            runs["in-process"], _ = combine([measure(mid, traces[r], rate, seconds, args.seed + r, args, slo)
                                             for r in range(args.rounds)])
        finally:
            wb.unload(mid)

    print()
    verdict = report(runs)
    ag = facts.get("agreement", {})
    print(f"wb.history() vs the client, {ag.get('matched', 0)} of {ag.get('client_rows', 0)} requests matched by ref:")
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        if key in ag:
            a = ag[key]
            print(f"  {key} p50: engine {a['engine_p50']:.4f} s, client {a['client_p50']:.4f} s, "
                  f"{a['diff_pct']:+.1f}%")
    if "llama-server" in facts:
        t = facts["llama-server"]["timings"]
        print(f"llama-server log: {t['prompt_eval_tokens']:.0f} prompt tokens evaluated in "
              f"{t['prompt_eval_ms'] / 1000:.1f} s of its requests' time, {t['eval_tokens']:.0f} generated")
    print(f"total {time.time() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "model": model.name, "llama_commit": wb._native.llama_commit, "threads": args.threads,
            "seqs": args.seqs, "n_ctx": args.n_ctx, "rate": rate, "capacity": capacity,
            "duration_s": args.duration, "rounds": args.rounds, "response_tokens": args.response_tokens, "slo": slo,
            "workload": {"trace": traces[0].name, "seed": args.seed, **{k: getattr(args, k) for k in TRACE_ARGS}, **d},
            "workbench_options": {k: v for k, v in load_options(args, model).items() if k != "model_path"},
            "llama_server_flags": server_flags(args, model, 0)[2:-2],
            "runs": runs, "targets": verdict, "facts": facts}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
