"""Which attention kernel computes a decode's rows: the rule that makes warm equal cold.

Measured on this llama.cpp's CPU backend (``bench/warm_cold_kv.py``; docs/architecture.md,
"Warm equals cold"): the matmuls, norms and RoPE compute each row on its own, so a row's K
and V in layer 0 never depend on the batch; flash attention does. ggml runs a ubatch of
``FA_TILE_ROWS`` (64) rows or more through a tiled kernel (f32 sums over 64-cell KV
tiles), fewer rows through a row-at-a-time kernel (f16 sums over the sequence's cells in
order), and one row over 512+ cells with the cells split between threads. The same
position computed by two kernels gets other bits, and so does every later position.

* **Default mode.** A tick's prompt rows (the KV rows that cache rows hold, which ask for no
  logits) are decoded first, on their own, always on the tiled kernel: when their last
  ubatch would have 1..63 rows it gets pad rows, future positions of its last prefilling
  sequence that no real row sees (the causal mask), removed after the decode. The tick's
  other rows (generated tokens, a prompt's last token, speculative verify rows) are then
  decoded on ggml's reference kernel, the row-at-a-time one without the thread split (the
  same cost for such rows). So a prompt's KV is the same however the prompt was cut (a
  partial restore, chunked prefill, a save point), an exact hit decodes its last token
  exactly as the cold run did, and a generated token does not depend on what shares its
  tick. Left: the tiled kernel groups cells by their index in the unified KV, so a prompt
  prefilled while other sequences hold cells (at another cell offset) can get other bits.
* **Deterministic mode** (``load_model(deterministic=True)``): the reference kernel for
  every row. A row's result then depends only on its token, its position and the cells of
  its own sequence in order: not on the ubatch, the cache or what shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

FA_TILE_ROWS = 64   # ggml-cpu's flash-attention Q tile (GGML_FA_TILE_Q)


@dataclass(slots=True, frozen=True)
class Pad:
    """``n`` pad rows of sequence ``seq`` at positions ``start`` .. (removed after the decode)."""

    seq: int
    start: int
    n: int
    token: int


@dataclass(slots=True, frozen=True)
class KernelRows:
    n_batch: int
    n_ubatch: int
    n_ctx: int
    deterministic: bool = False

    def pad_rows(self, n_rows: int) -> int:
        """Rows to add so that the batch's last ubatch has 0 or at least FA_TILE_ROWS rows."""
        if self.deterministic:
            return 0
        tail = n_rows % self.n_ubatch
        return FA_TILE_ROWS - tail if 0 < tail < FA_TILE_ROWS else 0

    def reference(self, prompt_rows: bool) -> bool:
        """Whether a decode runs ggml's reference kernels: always in deterministic mode, else
        unless it holds prompt rows."""
        return self.deterministic or not prompt_rows

    def pad(self, n_rows: int, seq: int, end: int, token: int) -> Pad | None:
        """The pad of a batch of ``n_rows`` whose last prefilling sequence ``seq`` ends at
        position ``end``; None when none is needed or it does not fit (n_batch, n_ctx)."""
        n = self.pad_rows(n_rows)
        if n == 0 or n_rows + n > self.n_batch or end + n > self.n_ctx:
            return None
        return Pad(seq, end, n, token)
