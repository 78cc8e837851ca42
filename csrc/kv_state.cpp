// The one reading of llama.cpp's per-sequence state format (see kv_state.h).
#include "kv_state.h"

#include <cstring>

namespace wb {

StateLimits state_limits(const Context & ctx) {
    const llama_model * m = ctx.model->get();
    return StateLimits{ctx.n_ctx, ctx.n_seq_max, (uint32_t)llama_model_n_layer(m),
                       llama_vocab_n_tokens(ctx.model->vocab())};
}

namespace {

// A bounded reader over a state buffer: never reads past its end.
struct StateReader {
    const uint8_t * data;
    size_t size, at = 0;
    template <typename T> bool read(T & v) {
        if (size - at < sizeof(T)) return false;
        std::memcpy(&v, data + at, sizeof(T));
        at += sizeof(T);
        return true;
    }
    bool skip(uint64_t count, uint64_t each) {
        if (each != 0 && count > (size - at) / each) return false;
        at += count * each;
        return true;
    }
};

// The cells of one stream (llama_kv_cache::state_write_meta for one sequence): position and
// sequence count (1) per cell, the cell ext when the cache keeps one, the sequence id.
std::string read_cells(StateReader & r, KvStream & st, bool ext, const StateLimits & lim) {
    st.cells_off = r.at;
    st.cell_bytes = 4 + 4 + (ext ? CELL_EXT_BYTES : 0) + 4;
    st.pos.resize(st.cells);
    for (uint32_t i = 0; i < st.cells; ++i) {
        int32_t pos = 0, seq = 0;
        uint32_t n_seq = 0;
        if (!r.read(pos) || !r.read(n_seq)) return "the state ends inside cell " + std::to_string(i);
        if (pos < 0 || (uint32_t)pos >= lim.n_ctx) {
            return "cell " + std::to_string(i) + " is at position " + std::to_string(pos) +
                   ", outside the context [0, " + std::to_string(lim.n_ctx) + ")";
        }
        if (n_seq != 1) return "cell " + std::to_string(i) + " names " + std::to_string(n_seq) + " sequences, not 1";
        if (ext) {
            int32_t xyt[3];
            if (!r.read(xyt)) return "the state ends inside cell " + std::to_string(i);
            if (xyt[2] != LLAMA_TOKEN_NULL && (xyt[2] < 0 || xyt[2] >= lim.n_vocab)) {
                return "cell " + std::to_string(i) + " holds token " + std::to_string(xyt[2]) + ", outside the vocabulary";
            }
        }
        if (!r.read(seq)) return "the state ends inside cell " + std::to_string(i);
        st.pos[i] = pos;
    }
    return "";
}

// The tensors of one stream (llama_kv_cache::state_write_data): per layer a K type and row
// size then the rows; V the same (or transposed: type, element size, width), for every layer
// or, in caches without V (MLA), none. Types and row sizes llama.cpp compares with its own.
std::string read_tensors(StateReader & r, KvStream & st, bool with_v, const StateLimits & lim) {
    uint32_t n_layer = 0;
    if (!r.read(st.v_trans) || !r.read(n_layer)) return "the state ends before its layer data";
    if (st.v_trans > 1) return "a V-transposition flag of " + std::to_string(st.v_trans);
    if (n_layer == 0 || n_layer > lim.n_layer) {
        return std::to_string(n_layer) + " layers in the state; the model has " + std::to_string(lim.n_layer);
    }
    st.with_v = with_v;
    st.layers.assign(n_layer, KvLayer{});
    for (KvLayer & L : st.layers) {
        if (!r.read(L.k_type) || !r.read(L.k_row)) return "the state ends inside the K data";
        if (L.k_type < 0 || L.k_type >= GGML_TYPE_COUNT || L.k_row == 0) return "a malformed K layer header";
        L.k_off = r.at;
        if (!r.skip(st.cells, L.k_row)) return "the K rows run past the end of the state";
    }
    for (size_t l = 0; with_v && l < st.layers.size(); ++l) {
        KvLayer & L = st.layers[l];
        if (!st.v_trans) {
            if (!r.read(L.v_type) || !r.read(L.v_row)) return "the state ends inside the V data";
            if (L.v_type < 0 || L.v_type >= GGML_TYPE_COUNT || L.v_row == 0) return "a malformed V layer header";
            L.v_off = r.at;
            if (!r.skip(st.cells, L.v_row)) return "the V rows run past the end of the state";
            continue;
        }
        if (!r.read(L.v_type) || !r.read(L.v_el) || !r.read(L.v_width)) return "the state ends inside the V data";
        if (L.v_type < 0 || L.v_type >= GGML_TYPE_COUNT || L.v_el == 0 || L.v_width == 0) {
            return "a malformed V layer header";
        }
        L.v_off = r.at;
        if (!r.skip((uint64_t)st.cells * L.v_width, L.v_el)) return "the V rows run past the end of the state";
    }
    return "";
}

// One KV cache's part (llama_kv_cache::state_write): stream count, then per stream a cell
// count and, when not 0, its cells and tensors.
std::string read_kv_block(StateReader & r, KvBlock & b, bool ext, bool with_v, const StateLimits & lim) {
    if (!r.read(b.n_stream)) return "the state ends before its stream count";
    if (b.n_stream == 0 || b.n_stream > lim.n_seq_max) return std::to_string(b.n_stream) + " KV streams in the state";
    for (uint32_t s = 0; s < b.n_stream; ++s) {
        KvStream st;
        st.index = s;
        if (!r.read(st.cells)) return "the state ends before a cell count";
        if (st.cells == 0) continue;
        if (st.cells > lim.n_ctx) {
            return std::to_string(st.cells) + " cells; the context holds " + std::to_string(lim.n_ctx);
        }
        if (std::string e = read_cells(r, st, ext, lim); !e.empty()) return e;
        if (std::string e = read_tensors(r, st, with_v, lim); !e.empty()) return e;
        b.streams.push_back(std::move(st));
    }
    return "";
}

// The whole buffer read one way (with or without cell ext, with V tensors or without): the
// header, then one KV cache's part, or two (a SWA model keeps a second cache), ending exactly
// at the buffer's end. `reached`: how far the reading got.
std::string read_state(std::string_view state, SeqState & out, const StateLimits & lim, size_t & reached) {
    StateReader r{reinterpret_cast<const uint8_t *>(state.data()), state.size()};
    uint32_t magic = 0;
    int32_t seq = 0;
    if (!r.read(magic) || magic != STATE_MAGIC || !r.read(seq)) return "not a llama.cpp sequence state (magic)";
    out.blocks.clear();
    std::string e;
    if (r.at < r.size) {
        out.blocks.emplace_back();
        e = read_kv_block(r, out.blocks.back(), out.ext, out.with_v, lim);
    }
    reached = r.at;
    if (!e.empty() || r.at == r.size) return e;
    const size_t first_end = r.at;
    out.blocks.emplace_back();
    if (read_kv_block(r, out.blocks.back(), out.ext, out.with_v, lim).empty() && r.at == r.size) {
        return "";  // a SWA model's second cache
    }
    return std::to_string(r.size - first_end) + " bytes after the state's end";
}

}  // namespace

std::string parse_seq_state(std::string_view state, const StateLimits & lim, SeqState & out) {
    std::string why;
    size_t furthest = 0;
    for (const bool ext : {false, true}) {
        for (const bool with_v : {true, false}) {
            SeqState s;
            s.ext = ext;
            s.with_v = with_v;
            size_t reached = 0;
            const std::string e = read_state(state, s, lim, reached);
            if (e.empty()) {
                out = std::move(s);
                return "";
            }
            if (why.empty() || reached > furthest) why = e, furthest = reached;
        }
    }
    return why;
}

}  // namespace wb
