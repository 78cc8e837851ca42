"""The kernel rule of engine/kernel_rows.py on built batches (no model): prompt rows always
reach ggml's tiled attention kernel (a short last ubatch is padded), small batches without
prompt rows run the reference kernel, deterministic mode runs the reference kernel always."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.engine.batch import build_batch
from workbench.engine.kernel_rows import FA_TILE_ROWS, KernelRows, Pad
from workbench.engine.scheduler import BatchPlan, Take

ROWS = KernelRows(n_batch=2048, n_ubatch=512, n_ctx=8192)


@dataclass
class Req:
    ref: int
    seq: int
    prompt: list[int]
    n_past: int = 0
    phase: str = "prefilling"
    feed: list[int] = field(default_factory=list)
    out_from: int | None = None

    def __post_init__(self) -> None:
        if not self.feed:
            self.feed = self.prompt[self.n_past:]


def batch_of(*takes: tuple[Req, int], rows: KernelRows = ROWS):
    reqs = {r.ref: r for r, _ in takes}
    return build_batch(BatchPlan([Take(r.ref, n) for r, n in takes]), reqs, rows)  # type: ignore[arg-type]


def test_a_short_prompt_chunk_is_padded_to_a_tile_with_future_positions_of_its_own_sequence():
    r = Req(0, 3, list(range(100, 140)))                     # 40 tokens: a chunk of 39 then the last
    b = batch_of((r, 39))
    assert b.pad == Pad(seq=3, start=39, n=FA_TILE_ROWS - 39, token=138)
    [(rows, reference, pad)] = b.parts()
    tokens, pos, seq, logits = rows
    assert not reference and pad == b.pad
    assert len(tokens) == FA_TILE_ROWS and pos[39:] == list(range(39, 64)) and set(seq) == {3}
    assert logits == [0] * FA_TILE_ROWS and len(b) == 39     # the pad is not a row of the batch


def test_a_suffix_after_a_partial_restore_is_padded_like_a_cold_chunk():
    r = Req(0, 0, list(range(1000)), n_past=960)              # 39 rows before the last token
    b = batch_of((r, 39))
    assert b.pad is not None and b.pad.start == 999 and b.pad.n == 25


def test_decode_rows_beside_prompt_rows_are_decoded_apart_on_the_reference_kernel():
    gen = Req(0, 1, list(range(10)), n_past=30, phase="generating", feed=[7])
    last = Req(1, 2, list(range(50)), n_past=49)             # a prompt's last token, alone
    chunk = Req(2, 0, list(range(300)), n_past=0)
    b = batch_of((gen, 1), (last, 1), (chunk, 100))
    (prompt, p_ref, p_pad), (main, m_ref, m_pad) = b.parts()
    assert prompt[2] == [0] * 100 and not p_ref and p_pad is None       # 100 rows: tiled, no pad
    assert main[0] == [7, 49] and main[3] == [1, 1] and m_ref and m_pad is None
    assert [s.logits_row for s in b.slices] == [0, 1, None]           # indices into the main decode
    assert len(b) == 102


def test_the_last_prompt_token_alone_and_decode_rows_run_the_reference_kernel_unpadded():
    last = Req(0, 0, list(range(50)), n_past=49)
    gen = Req(1, 1, list(range(10)), n_past=30, phase="generating", feed=[7])
    b = batch_of((last, 1), (gen, 1))
    [(_, reference, pad)] = b.parts()
    assert reference and pad is None and b.pad is None


def test_a_short_last_ubatch_of_prompt_rows_is_padded_and_a_full_one_is_not():
    long = Req(0, 0, list(range(3000)))
    other = Req(1, 1, list(range(3000)))
    assert batch_of((long, 512), (other, 1)).pad.n == FA_TILE_ROWS - 1     # type: ignore[union-attr]
    assert batch_of((long, 512)).pad is None                                 # one full ubatch
    assert batch_of((long, 100)).pad is None


def test_no_pad_where_it_does_not_fit_the_batch_or_the_context():
    r = Req(0, 0, list(range(40)))
    assert batch_of((r, 39), rows=KernelRows(n_batch=48, n_ubatch=48, n_ctx=8192)).pad is None
    assert batch_of((r, 39), rows=KernelRows(n_batch=512, n_ubatch=512, n_ctx=50)).pad is None


def test_deterministic_mode_runs_the_reference_kernel_for_every_batch_in_one_decode():
    det = KernelRows(n_batch=2048, n_ubatch=512, n_ctx=8192, deterministic=True)
    long = Req(0, 0, list(range(3000)))
    gen = Req(1, 1, list(range(10)), n_past=30, phase="generating", feed=[7])
    for n in (1, 39, 100, 512):
        [(rows, reference, pad)] = batch_of((gen, 1), (long, n), rows=det).parts()
        assert reference and pad is None and len(rows[0]) == n + 1
