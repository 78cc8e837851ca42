// Joining verified KV chunks back into one state llama_state_seq_set_data accepts (the format:
// kv_chunks.cpp). Every check runs before a byte is copied: keys in order, positions following
// from 0, one layout, exact sizes; each cell's position is checked as it is copied, and the
// joined state then passes the same check as any state_seq_set before llama.cpp reads it.
#include "kv_chunks.h"

#include <memory>
#include <optional>
#include <stdexcept>

namespace wb::kvchunk {

namespace {

// The layout read back into a SeqState shape (streams with their sizes, no offsets).
SeqState read_layout(std::string_view lay, uint16_t flags, const StateLimits & lim) {
    SeqState s;
    s.ext = flags & 1;
    s.with_v = flags & 2;
    auto need = [&](size_t at, size_t k) {
        if (lay.size() < at || lay.size() - at < k) refuse("state_join", "a chunk's layout is truncated");
    };
    size_t at = 0;
    need(at, 4);
    const uint32_t n_blocks = get<uint32_t>(lay.data());
    at += 4;
    if (n_blocks == 0 || n_blocks > 2) refuse("state_join", std::to_string(n_blocks) + " KV caches in a chunk's layout");
    for (uint32_t b = 0; b < n_blocks; ++b) {
        need(at, 16);
        KvBlock blk;
        KvStream st;
        blk.n_stream = get<uint32_t>(lay.data() + at);
        st.index = get<uint32_t>(lay.data() + at + 4);
        st.v_trans = get<uint32_t>(lay.data() + at + 8);
        const uint32_t n_layer = get<uint32_t>(lay.data() + at + 12);
        at += 16;
        if (blk.n_stream == 0 || blk.n_stream > lim.n_seq_max || st.index >= blk.n_stream || st.v_trans > 1 ||
            n_layer == 0 || n_layer > lim.n_layer) {
            refuse("state_join", "a chunk's layout does not fit this context");
        }
        st.with_v = s.with_v;
        st.cell_bytes = 4 + 4 + (s.ext ? CELL_EXT_BYTES : 0) + 4;
        st.layers.resize(n_layer);
        for (KvLayer & L : st.layers) {
            need(at, LAYER_LAYOUT);
            const char * p = lay.data() + at;
            L.k_type = get<int32_t>(p), L.k_row = get<uint64_t>(p + 4), L.v_type = get<int32_t>(p + 12);
            L.v_row = get<uint64_t>(p + 16), L.v_el = get<uint32_t>(p + 24), L.v_width = get<uint32_t>(p + 28);
            at += LAYER_LAYOUT;
            const bool v_ok = !s.with_v || (st.v_trans ? L.v_el != 0 && L.v_width != 0 && L.v_el <= 8 : L.v_row != 0);
            if (L.k_type < 0 || L.k_type >= GGML_TYPE_COUNT || L.k_row == 0 || L.k_row > (1u << 24) || !v_ok ||
                L.v_row > (1u << 24) || L.v_width > (1u << 20)) {
                refuse("state_join", "a chunk's layout has a malformed layer");
            }
        }
        blk.streams.push_back(std::move(st));
        s.blocks.push_back(std::move(blk));
    }
    if (at != lay.size()) refuse("state_join", "a chunk's layout has trailing bytes");
    return s;
}

struct Piece {
    std::string_view body;
    uint32_t p0, n;
    uint32_t take;  // cells used: n, or fewer in a last chunk used only in part
};

// Checks each piece's header against the first piece and the expected keys; returns the
// shared layout and the pieces' bodies. Refuses before anything is copied.
SeqState check_pieces(const Context & ctx, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
                      uint32_t n_tokens, std::vector<Piece> & out, uint32_t & total) {
    if (pieces.empty()) refuse("state_join", "no chunks to join");
    if (pieces.size() != keys.size()) {
        refuse("state_join", std::to_string(pieces.size()) + " chunks for " + std::to_string(keys.size()) + " keys");
    }
    const StateLimits lim = state_limits(ctx);
    std::string_view layout;
    uint16_t flags0 = 0;
    SeqState s;
    total = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const std::string_view v(pieces[i]);
        const std::string what = "chunk " + std::to_string(i);
        if (v.size() < CHUNK_HEADER || std::memcmp(v.data(), CHUNK_MAGIC, 8) != 0) refuse("state_join", what + " is not a KV chunk");
        if (get<uint16_t>(v.data() + 8) != CHUNK_VERSION) refuse("state_join", what + " has another chunk format version");
        const uint16_t flags = get<uint16_t>(v.data() + 10);
        const uint32_t p0 = get<uint32_t>(v.data() + 12), n = get<uint32_t>(v.data() + 16);
        const uint32_t lay_len = get<uint32_t>(v.data() + 20);
        if (std::string_view(v.data() + 24, KEY_BYTES) != key_at(keys, i, "state_join")) {
            refuse("state_join", what + " is not the expected chunk (its key differs: another prefix)");
        }
        if (lay_len > v.size() - CHUNK_HEADER) refuse("state_join", what + " is truncated");
        const std::string_view lay(v.data() + CHUNK_HEADER, lay_len);
        if (i == 0) {
            flags0 = flags, layout = lay;
            s = read_layout(lay, flags, lim);
        } else if (flags != flags0 || lay != layout) {
            refuse("state_join", what + " has another KV layout than chunk 0");
        }
        if (p0 != total) {
            refuse("state_join", what + " starts at position " + std::to_string(p0) + ", expected " + std::to_string(total));
        }
        if (n == 0 || n > lim.n_ctx - total) refuse("state_join", what + " runs past the context (n_ctx " + std::to_string(lim.n_ctx) + ")");
        const std::string_view body = v.substr(CHUNK_HEADER + lay_len);
        if (body.size() != body_bytes(s, n)) {
            refuse("state_join", what + " holds " + std::to_string(body.size()) + " bytes of KV, its layout says " +
                                     std::to_string(body_bytes(s, n)));
        }
        out.push_back(Piece{body, p0, n, n});
        total += n;
    }
    if (n_tokens != 0) {  // the last chunk used for its first positions only
        Piece & last = out.back();
        if (n_tokens > total || n_tokens <= last.p0) {
            refuse("state_join", std::to_string(n_tokens) + " positions asked of chunks holding " +
                                     std::to_string(last.p0) + " .. " + std::to_string(total) + " in their last");
        }
        last.take = n_tokens - last.p0;
        total = n_tokens;
    }
    return s;
}

// Bounded writes into a buffer sized by joined_size: a shortfall would be a bug here, so it
// throws instead of writing past the end.
struct Out {
    char * p;
    char * end;
    void add(const void * src, size_t n) {
        if ((size_t)(end - p) < n) throw std::runtime_error("state_join: the joined state outgrew its buffer");
        std::memcpy(p, src, n);
        p += n;
    }
    template <typename T> void put(T v) { add(&v, sizeof(T)); }
};

// The exact size of the state assemble writes for `total` positions.
size_t joined_size(const SeqState & s, uint32_t total) {
    size_t size = 8;
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        size += 4 + 4 * (size_t)b.n_stream + (size_t)total * st.cell_bytes + 8;
        for (const KvLayer & L : st.layers) {
            size += 4 + 8 + (size_t)total * L.k_row;
            if (st.with_v) size += st.v_trans ? 12 + (size_t)total * L.v_el * L.v_width : 12 + (size_t)total * L.v_row;
        }
    }
    return size;
}

// Appends one piece's cell records, each checked to be at the position the chain needs.
void append_cells(Out & out, const KvStream & st, const Piece & pc, size_t off) {
    for (uint32_t j = 0; j < pc.take; ++j) {
        const char * cell = pc.body.data() + off + (size_t)j * st.cell_bytes;
        if (get<int32_t>(cell) != (int32_t)(pc.p0 + j) || get<uint32_t>(cell + 4) != 1) {
            refuse("state_join", "a chunk's cell " + std::to_string(j) + " is not at position " + std::to_string(pc.p0 + j));
        }
    }
    out.add(pc.body.data() + off, (size_t)pc.take * st.cell_bytes);
}

// One KV cache's stream: its cells, then per layer its K rows and V rows gathered from every
// piece (`at`: the read offset in each piece's body).
void assemble_stream(Out & out, const KvStream & st, const std::vector<Piece> & pieces, uint32_t total,
                     std::vector<size_t> & at) {
    out.put<uint32_t>(total);
    for (size_t i = 0; i < pieces.size(); ++i) {
        append_cells(out, st, pieces[i], at[i]);
        at[i] += (size_t)pieces[i].n * st.cell_bytes;
    }
    out.put<uint32_t>(st.v_trans);
    out.put<uint32_t>((uint32_t)st.layers.size());
    auto rows = [&](uint64_t stride) {
        for (size_t i = 0; i < pieces.size(); ++i) {
            out.add(pieces[i].body.data() + at[i], pieces[i].take * stride);
            at[i] += pieces[i].n * stride;
        }
    };
    for (const KvLayer & L : st.layers) out.put(L.k_type), out.put(L.k_row), rows(L.k_row);
    for (const KvLayer & L : st.layers) {
        if (!st.with_v) break;
        out.put(L.v_type);
        if (!st.v_trans) {
            out.put(L.v_row), rows(L.v_row);
            continue;
        }
        out.put(L.v_el), out.put(L.v_width);
        for (uint32_t j = 0; j < L.v_width; ++j) rows(L.v_el);
    }
}

// Writes the joined state into dst (joined_size(s, total) bytes). Runs without the GIL: it
// reads only the pieces' bodies, which the caller's Python references keep alive.
void assemble(const SeqState & s, const std::vector<Piece> & pieces, uint32_t total, char * dst, size_t size) {
    Out out{dst, dst + size};
    out.put<uint32_t>(STATE_MAGIC);
    out.put<int32_t>(0);
    std::vector<size_t> at(pieces.size(), 0);
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        out.put<uint32_t>(b.n_stream);
        for (uint32_t si = 0; si < b.n_stream; ++si) {
            if (si == st.index) {
                assemble_stream(out, st, pieces, total, at);
            } else {
                out.put<uint32_t>(0);
            }
        }
    }
    if (out.p != out.end) throw std::runtime_error("state_join: the joined state is shorter than its size");
}

// The chunks checked (check_pieces), then joined into a buffer from `alloc(size)`.
template <typename Alloc>
void join_into(const Context & ctx, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
               uint32_t n_tokens, Alloc && alloc) {
    std::vector<Piece> checked;
    uint32_t total = 0;
    SeqState s = check_pieces(ctx, pieces, keys, n_tokens, checked, total);
    for (KvBlock & b : s.blocks) {  // the chunks' cells as stream 0 of this context's streams
        b.n_stream = ctx.kv_streams;
        b.streams[0].index = 0;
    }
    const size_t size = joined_size(s, total);
    char * dst = alloc(size);
    py::gil_scoped_release release;  // a refusal inside throws a plain C++ exception
    assemble(s, checked, total, dst, size);
}

}  // namespace

py::bytes join(const Context & ctx, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
               uint32_t n_tokens) {
    py::object out;
    join_into(ctx, pieces, keys, n_tokens, [&](size_t size) {
        out = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)size));
        if (!out) throw py::error_already_set();
        return PyBytes_AS_STRING(out.ptr());
    });
    return py::reinterpret_borrow<py::bytes>(out);
}

// Joins into the scratch bytearray (or a buffer of its own when scratch is None) and hands
// the state to llama.cpp after the same check as any state_seq_set.
size_t set_chunks(Context & ctx, llama_seq_id seq, const std::vector<py::bytes> & pieces,
                  const std::vector<py::bytes> & keys, uint32_t n_tokens, const py::object & scratch) {
    check_seq(ctx, seq);
    std::optional<Scratch> held;
    std::unique_ptr<char[]> own;
    size_t joined = 0;
    char * dst = nullptr;
    join_into(ctx, pieces, keys, n_tokens, [&](size_t size) {
        joined = size;
        if (scratch.is_none()) {
            own.reset(new char[size]);
            return dst = own.get();
        }
        held.emplace(scratch, size, "state_seq_set_chunks");
        return dst = held->data();
    });
    return state_seq_load(ctx, seq, std::string_view(dst, joined));
}

}  // namespace wb::kvchunk
