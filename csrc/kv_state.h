// llama.cpp's per-sequence state (llama_state_seq_get_data at the pinned commit, KV caches
// only) read into a map of where each part lies: the one reading of that format, used to
// check a state before llama.cpp restores it (context.cpp) and to cut a state into
// position-range chunks and join them back (kv_chunks.cpp).
#pragma once

#include "native.h"

#include <string>
#include <string_view>
#include <vector>

namespace wb {

// What a per-sequence state may hold in a context.
struct StateLimits {
    uint32_t n_ctx, n_seq_max, n_layer;
    int32_t n_vocab;
};
StateLimits state_limits(const Context & ctx);

// One layer's K and V in one stream: types, sizes and where their rows start.
struct KvLayer {
    int32_t k_type = 0;
    uint64_t k_row = 0;      // bytes per cell
    size_t k_off = 0;        // first K row
    int32_t v_type = 0;
    uint64_t v_row = 0;      // bytes per cell (plain V)
    uint32_t v_el = 0, v_width = 0;  // element size and width (transposed V)
    size_t v_off = 0;        // first V byte (rows, or width runs of `cells` elements)
};

// One stream that holds cells: its index among the block's streams, the cells' positions in
// the order they are stored, where the cells' records start and each record's size.
struct KvStream {
    uint32_t index = 0, cells = 0;
    size_t cells_off = 0, cell_bytes = 0;
    std::vector<int32_t> pos;
    uint32_t v_trans = 0;
    bool with_v = true;
    std::vector<KvLayer> layers;
};

// One KV cache's part (a SWA model writes two): its stream count and the streams with cells.
struct KvBlock {
    uint32_t n_stream = 0;
    std::vector<KvStream> streams;
};

struct SeqState {
    bool ext = false;     // cells carry llama_kv_cell_ext (pos x, pos y, token)
    bool with_v = true;   // V tensors present (not in MLA caches)
    std::vector<KvBlock> blocks;
};

constexpr uint32_t STATE_MAGIC = 0xaf143cd8;  // llama-context.cpp's io_magic at the pinned commit
constexpr size_t CELL_EXT_BYTES = 12;          // llama_kv_cell_ext: pos x, pos y, token

// Reads `state` every way the format allows (cells with or without ext, with or without V)
// and fills `out` from the first reading that checks against `lim` and ends exactly at the
// buffer's end. Returns "" on success, else why the furthest reading failed.
std::string parse_seq_state(std::string_view state, const StateLimits & lim, SeqState & out);

// Throws ValueError unless `state` reads as a sequence state that fits `ctx` (context.cpp).
void check_seq_state(const Context & ctx, std::string_view state);

// The sequence's state as llama.cpp writes it, and a state checked then handed to llama.cpp
// (bytes read; 0 when llama.cpp refused it). GIL released while llama.cpp works (context.cpp).
std::string state_seq_bytes(Context & ctx, llama_seq_id seq);
size_t state_seq_load(Context & ctx, llama_seq_id seq, std::string_view state);

// Context.state_cut / state_join / state_seq_get_chunks / state_seq_set_chunks (kv_chunks.cpp).
void bind_kv_chunks(py::class_<Context, std::shared_ptr<Context>> & cls);

}  // namespace wb
