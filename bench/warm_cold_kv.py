"""Where warm != cold comes from: the KV bytes of the same positions computed two ways.

One prompt (default ~1,000 tokens of the default model's chat format), prefilled into
separate sequences of one context with different ubatch geometries, and the K and V rows
llama.cpp stores for each position compared byte for byte, layer by layer:

- ``ref``: the cold geometry: chunks of 512 from position 0 (the engine's default prefill
  chunk), the last prompt token alone.
- ``split@P``: as a partial restore continuing from P would: [0, P) as the cold run, then
  chunks of 512 from P.
- ``small``: chunks of 40 rows (fewer than ggml's 64-row flash-attention tile).
- ``co-batched``: the ref geometry while three other sequences decode a row in the same
  ubatches (what continuous batching does).
- ``reordered``: the ref geometry after other sequences took and freed cells, so the
  sequence's cells are not in position order in the unified KV.

For each, the first layer whose K or V differs tells which op varies: layer 0's K/V come from
the embeddings through RMSNorm and the K/V projections (matmul); a difference first seen in
layer L > 0 comes from layer L-1's attention or feed-forward output. Run with and without
ggml's CPU reference kernels (``--reference``) and flash attention on/off:

    .venv/bin/python bench/warm_cold_kv.py [--reference] [--flash-attn on|off]
"""

from __future__ import annotations

import argparse
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import _native  # noqa: E402
from workbench.models import default_model_path  # noqa: E402

N_LAYER_KEY = "llama.block_count"


@dataclass
class Layers:
    k: list[np.ndarray]   # per layer: cells x row bytes
    v: list[np.ndarray]


def kv_layers(state: bytes, cells: int, n_layer: int) -> Layers:
    """K and V rows (f16) of a one-stream state in position order, read from the end of
    llama.cpp's per-sequence state: per layer (type i32, row size u64, rows); V by element
    when flash attention is off (transposed)."""
    # the data part is the state's tail: n_layer K blocks then n_layer V blocks
    row = None
    for probe in (192 * 2, 256 * 2, 320 * 2, 128 * 2, 512 * 2, 1024 * 2):
        size = 2 * n_layer * (12 + cells * probe)
        if size <= len(state):
            off = len(state) - size
            t, r = struct.unpack_from("<iQ", state, off)
            if r == probe:
                row = probe
                break
    if row is None:
        raise SystemExit("could not locate the KV rows (f16 K and V expected)")
    off = len(state) - 2 * n_layer * (12 + cells * row)
    # the cells' records (pos i32, n_seq_id u32 = 1, seq i32) end before v_trans and n_layer
    meta = off - 8 - 12 * cells
    pos = np.frombuffer(state, "<i4", 3 * cells, meta).reshape(cells, 3)[:, 0]
    order = np.argsort(pos, kind="stable")     # rows in position order, whatever the cells
    v_trans = struct.unpack_from("<I", state, off - 8)[0]
    out: list[list[np.ndarray]] = [[], []]
    for part in range(2):
        for _ in range(n_layer):
            off += 12
            rows = np.frombuffer(state, np.uint8, cells * row, off)
            if part == 1 and v_trans:   # V stored by element: (width, cells) of 2-byte values
                rows = rows.view("<u2").reshape(row // 2, cells).T.copy().view(np.uint8)
            out[part].append(rows.reshape(cells, row)[order])
            off += cells * row
    return Layers(*out)


def prefill(ctx: _native.Context, seq: int, tokens: list[int], cuts: list[int], others: list[int] = ()) -> None:
    """Decode ``tokens`` into ``seq`` in chunks ending at ``cuts``; every chunk also carries one
    decode row of each sequence in ``others`` (at their next position)."""
    start = 0
    for end in [*cuts, len(tokens)]:
        if end <= start:
            continue
        toks = tokens[start:end]
        pos = list(range(start, end))
        seqs = [seq] * len(toks)
        for o in others:
            n = ctx.seq_pos_max(o) + 1
            toks = toks + [tokens[n % len(tokens)]]
            pos = pos + [n]
            seqs = seqs + [o]
        rc = ctx.decode(toks, pos, seqs, [0] * len(toks))
        assert rc == 0, rc
        start = end


def cold_cuts(n: int, chunk: int = 512, start: int = 0) -> list[int]:
    """The engine's cuts: chunks of ``chunk`` from ``start``, the last prompt token alone."""
    return [*range(start + chunk, n - 1, chunk), n - 1]


def compare(a: Layers, b: Layers) -> tuple[int | None, str, int]:
    """(first differing layer, 'K'/'V', positions differing in that layer)."""
    for layer in range(len(a.k)):
        for name, x, y in (("K", a.k, b.k), ("V", a.v, b.v)):
            rows = np.any(x[layer] != y[layer], axis=1)
            if rows.any():
                return layer, name, int(rows.sum())
    return None, "", 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", action="store_true", help="ggml's CPU reference kernels")
    ap.add_argument("--flash-attn", default="on", choices=("on", "off", "auto"))
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    model = _native.Model(str(default_model_path()))
    n_layer = int(model.meta(N_LAYER_KEY) or 30)
    params = {"n_ctx": 8192, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 8, "n_threads": args.threads,
              "flash_attn": args.flash_attn, "reference_kernels": args.reference}
    ctx = _native.Context(model, params)
    text = Path(__file__).read_text() * 4
    tokens = model.tokenize(text)[: args.tokens]
    n = len(tokens)

    def run(seq: int, cuts: list[int], others: list[int] = ()) -> Layers:
        prefill(ctx, seq, tokens, cuts, others)
        return kv_layers(ctx.state_seq_get(seq), n, n_layer)

    ref = run(0, cold_cuts(n))
    cases: dict[str, Layers] = {}
    cases["same geometry again"] = run(1, cold_cuts(n))
    for p in (64, 300, 448, 700):
        ctx.seq_rm(1)
        cases[f"split@{p}"] = run(1, [p, *cold_cuts(n, start=p)])
    ctx.seq_rm(1)
    cases["small (40-row chunks)"] = run(1, [*range(40, n - 1, 40), n - 1])
    ctx.seq_rm(1)
    for o in (2, 3, 4):
        prefill(ctx, o, tokens[:8], [])
    cases["co-batched (3 decoders)"] = run(1, cold_cuts(n), [2, 3, 4])
    ctx.seq_rm(1)
    for o in (2, 3, 4):
        ctx.seq_rm(o)
    # take cells with a short sequence, free them: seq 1's cells then start past them
    prefill(ctx, 5, tokens[:300], [])
    prefill(ctx, 6, tokens[:200], [])
    ctx.seq_rm(5)
    cases["reordered cells"] = run(1, cold_cuts(n))
    print(f"{n} tokens, flash_attn={args.flash_attn}, reference kernels={ctx.reference_kernels}, "
          f"threads={args.threads}")
    for name, got in cases.items():
        layer, part, rows = compare(ref, got)
        verdict = "identical" if layer is None else f"first differs at layer {layer} {part} ({rows} positions)"
        print(f"  {name:26s} {verdict}")
        ctx.seq_rm(1)


if __name__ == "__main__":
    main()
