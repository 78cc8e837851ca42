// Cutting one sequence's llama.cpp state into position-range chunks and joining verified
// chunks back into a state llama_state_seq_set_data accepts (docs/cache.md, "Chunked state").
//
// A chunk holds positions [p0, p0 + n) of every KV cache in the state: the cells' records in
// position order, then per layer the K rows and the V rows (plain when V is not transposed,
// i.e. flash attention on; transposed: per V column, the chunk's n elements). The parts of
// the state that are not per cell (stream count and index, V transposition, per layer types
// and row sizes) form the chunk's layout, stored in every chunk; chunks join only when their
// layouts are equal byte for byte, their keys are the ones the caller expects, in order, and
// their positions follow each other from 0.
//
// Chunk file layout (little-endian):
//   0  8  magic "WBKVCHK\0"        8  2  version (1)       10 2  flags: 1 ext, 2 with V
//   12 4  p0                       16 4  n (cells)         20 4  layout length L
//   24 16 chunk key               40 L  layout            40+L  body
// layout: n_blocks u32; per block n_stream, stream index, v_trans, n_layer (u32), per layer
// k_type i32, k_row u64, v_type i32, v_row u64, v_el u32, v_width u32.
#include "kv_state.h"

#include <pybind11/stl.h>

#include <cstring>

namespace wb {

namespace {

constexpr char CHUNK_MAGIC[8] = {'W', 'B', 'K', 'V', 'C', 'H', 'K', '\0'};
constexpr uint16_t CHUNK_VERSION = 1;
constexpr size_t CHUNK_HEADER = 40;
constexpr size_t KEY_BYTES = 16;
constexpr size_t LAYER_LAYOUT = 4 + 8 + 4 + 8 + 4 + 4;

template <typename T> void put(std::string & out, T v) { out.append(reinterpret_cast<const char *>(&v), sizeof(T)); }
template <typename T> T get(const char * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

[[noreturn]] void refuse(const std::string & op, const std::string & why) {
    throw py::value_error(op + ": " + why);
}

// The layout every chunk of a state shares.
std::string layout_of(const SeqState & s) {
    std::string out;
    put<uint32_t>(out, (uint32_t)s.blocks.size());
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        put<uint32_t>(out, b.n_stream);
        put<uint32_t>(out, st.index);
        put<uint32_t>(out, st.v_trans);
        put<uint32_t>(out, (uint32_t)st.layers.size());
        for (const KvLayer & L : st.layers) {
            put(out, L.k_type), put(out, L.k_row), put(out, L.v_type), put(out, L.v_row);
            put(out, L.v_el), put(out, L.v_width);
        }
    }
    return out;
}

// Bytes a chunk of n cells carries per KV cache (its body), from the layout; 0 on overflow.
uint64_t body_bytes(const SeqState & s, uint64_t n) {
    uint64_t per_cell = 0;
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        per_cell += st.cell_bytes;
        for (const KvLayer & L : st.layers) {
            per_cell += L.k_row;
            if (st.with_v) per_cell += st.v_trans ? (uint64_t)L.v_el * L.v_width : L.v_row;
        }
    }
    return per_cell != 0 && n > UINT64_MAX / per_cell ? 0 : per_cell * n;
}

// Copies the records of positions [p0, p0 + n) (cell index perm[p]) of `stride` bytes each,
// starting at `base` (+ `step` * cells for transposed V's columns), one memcpy per run of
// consecutive cells.
void gather(char *& dst, const char * src, size_t base, size_t stride, const std::vector<uint32_t> & perm,
            uint32_t p0, uint32_t n) {
    uint32_t p = p0;
    while (p < p0 + n) {
        uint32_t run = 1;
        while (p + run < p0 + n && perm[p + run] == perm[p] + run) ++run;
        std::memcpy(dst, src + base + (size_t)perm[p] * stride, (size_t)run * stride);
        dst += (size_t)run * stride;
        p += run;
    }
}

void write_body(char *& dst, const char * src, const SeqState & s, const std::vector<std::vector<uint32_t>> & perms,
                uint32_t p0, uint32_t n) {
    for (size_t bi = 0; bi < s.blocks.size(); ++bi) {
        const KvStream & st = s.blocks[bi].streams[0];
        const auto & perm = perms[bi];
        gather(dst, src, st.cells_off, st.cell_bytes, perm, p0, n);
        for (const KvLayer & L : st.layers) gather(dst, src, L.k_off, L.k_row, perm, p0, n);
        for (const KvLayer & L : st.layers) {
            if (!st.with_v) break;
            if (!st.v_trans) {
                gather(dst, src, L.v_off, L.v_row, perm, p0, n);
                continue;
            }
            for (uint32_t j = 0; j < L.v_width; ++j) {
                gather(dst, src, L.v_off + (size_t)j * st.cells * L.v_el, L.v_el, perm, p0, n);
            }
        }
    }
}

// The cell index of each position, per KV cache; refuses a state whose caches do not hold
// exactly positions 0 .. n - 1 of one stream each (a SWA window, a sequence with holes).
std::vector<std::vector<uint32_t>> position_maps(const SeqState & s, uint32_t & n) {
    if (s.blocks.empty()) refuse("state_cut", "the state holds no KV cache");
    std::vector<std::vector<uint32_t>> perms;
    for (const KvBlock & b : s.blocks) {
        if (b.streams.size() != 1) refuse("state_cut", std::to_string(b.streams.size()) + " streams hold cells, not 1");
        const KvStream & st = b.streams[0];
        if (perms.empty()) n = st.cells;
        if (st.cells != n) refuse("state_cut", "the KV caches hold different cell counts");
        std::vector<uint32_t> perm(n, UINT32_MAX);
        for (uint32_t i = 0; i < n; ++i) {
            const int32_t p = st.pos[i];
            if ((uint32_t)p >= n || perm[p] != UINT32_MAX) {
                refuse("state_cut", "the cells do not hold positions 0 .. " + std::to_string(n - 1) + " once each");
            }
            perm[p] = i;
        }
        perms.push_back(std::move(perm));
    }
    return perms;
}

std::string key_at(const std::vector<py::bytes> & keys, size_t i, const char * op) {
    std::string k = keys[i];
    if (k.size() != KEY_BYTES) {
        refuse(op, "key " + std::to_string(i) + " has " + std::to_string(k.size()) + " bytes, not 16");
    }
    return k;
}

py::list cut(const Context & ctx, std::string_view state, const std::vector<py::bytes> & keys, uint32_t chunk_size,
             size_t first) {
    if (chunk_size == 0) refuse("state_cut", "chunk_size must be at least 1");
    SeqState s;
    if (std::string why = parse_seq_state(state, state_limits(ctx), s); !why.empty()) {
        refuse("state_cut", "not a sequence state of this context (" + why + ")");
    }
    uint32_t n = 0;
    const auto perms = position_maps(s, n);
    const size_t n_chunks = ((size_t)n + chunk_size - 1) / chunk_size;
    if (keys.size() != n_chunks) {
        refuse("state_cut", std::to_string(keys.size()) + " keys for " + std::to_string(n) + " cells in chunks of " +
                                std::to_string(chunk_size) + " (expected " + std::to_string(n_chunks) + ")");
    }
    if (first > n_chunks) refuse("state_cut", "first chunk " + std::to_string(first) + " is past the last");
    const std::string layout = layout_of(s);
    const uint16_t flags = (s.ext ? 1 : 0) | (s.with_v ? 2 : 0);
    py::list out;
    for (size_t c = first; c < n_chunks; ++c) {
        const uint32_t p0 = (uint32_t)(c * chunk_size);
        const uint32_t len = std::min<uint32_t>(chunk_size, n - p0);
        const std::string key = key_at(keys, c, "state_cut");
        std::string head(CHUNK_MAGIC, sizeof(CHUNK_MAGIC));
        put(head, CHUNK_VERSION), put(head, flags), put(head, p0), put(head, len);
        put<uint32_t>(head, (uint32_t)layout.size());
        head += key;
        head += layout;
        const size_t total = head.size() + body_bytes(s, len);
        PyObject * obj = PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)total);
        if (obj == nullptr) throw py::error_already_set();
        auto piece = py::reinterpret_steal<py::bytes>(obj);
        char * dst = PyBytes_AS_STRING(obj);
        std::memcpy(dst, head.data(), head.size());
        dst += head.size();
        {
            py::gil_scoped_release release;
            write_body(dst, state.data(), s, perms, p0, len);
        }
        out.append(piece);
    }
    return out;
}

}  // namespace

// --- joining -------------------------------------------------------------------------------

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

// Appends one piece's cell records, each checked to be at the position the chain needs.
void append_cells(std::string & out, const KvStream & st, const Piece & pc, size_t off) {
    for (uint32_t j = 0; j < pc.take; ++j) {
        const char * cell = pc.body.data() + off + (size_t)j * st.cell_bytes;
        if (get<int32_t>(cell) != (int32_t)(pc.p0 + j) || get<uint32_t>(cell + 4) != 1) {
            refuse("state_join", "a chunk's cell " + std::to_string(j) + " is not at position " + std::to_string(pc.p0 + j));
        }
    }
    out.append(pc.body.data() + off, (size_t)pc.take * st.cell_bytes);
}

std::string assemble(const SeqState & s, const std::vector<Piece> & pieces, uint32_t total) {
    std::string out;
    size_t size = 8;
    for (const KvBlock & b : s.blocks) size += 4 + 4 * (size_t)b.n_stream + 8 + b.streams[0].layers.size() * 32;
    for (const Piece & pc : pieces) size += pc.body.size();
    out.reserve(size);
    put<uint32_t>(out, STATE_MAGIC);
    put<int32_t>(out, 0);
    std::vector<size_t> at(pieces.size(), 0);  // read offset in each piece's body
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        put<uint32_t>(out, b.n_stream);
        for (uint32_t si = 0; si < b.n_stream; ++si) {
            put<uint32_t>(out, si == st.index ? total : 0);
            if (si != st.index) continue;
            for (size_t i = 0; i < pieces.size(); ++i) {
                append_cells(out, st, pieces[i], at[i]);
                at[i] += (size_t)pieces[i].n * st.cell_bytes;
            }
            put<uint32_t>(out, st.v_trans);
            put<uint32_t>(out, (uint32_t)st.layers.size());
            auto rows = [&](uint64_t stride) {
                for (size_t i = 0; i < pieces.size(); ++i) {
                    out.append(pieces[i].body.data() + at[i], pieces[i].take * stride);
                    at[i] += pieces[i].n * stride;
                }
            };
            for (const KvLayer & L : st.layers) put(out, L.k_type), put(out, L.k_row), rows(L.k_row);
            for (const KvLayer & L : st.layers) {
                if (!st.with_v) break;
                put(out, L.v_type);
                if (!st.v_trans) {
                    put(out, L.v_row), rows(L.v_row);
                    continue;
                }
                put(out, L.v_el), put(out, L.v_width);
                for (uint32_t j = 0; j < L.v_width; ++j) rows(L.v_el);
            }
        }
    }
    return out;
}

std::string join(const Context & ctx, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
                 uint32_t n_tokens) {
    std::vector<Piece> checked;
    uint32_t total = 0;
    const SeqState s = check_pieces(ctx, pieces, keys, n_tokens, checked, total);
    py::gil_scoped_release release;  // a refusal inside throws a plain C++ exception
    return assemble(s, checked, total);
}

}  // namespace

void bind_kv_chunks(py::class_<Context, std::shared_ptr<Context>> & cls) {
    cls.def("state_cut", [](Context & self, py::bytes state, const std::vector<py::bytes> & keys, uint32_t chunk_size,
                            size_t first) { return cut(self, std::string_view(state), keys, chunk_size, first); },
            py::arg("state"), py::arg("keys"), py::arg("chunk_size"), py::arg("first") = 0,
            "Cut a sequence state into chunks of chunk_size positions, chunk i tagged with keys[i]; "
            "returns chunks first.. . ValueError when the state is not one sequence holding "
            "positions 0 .. n-1 of this context, or the keys do not match the chunk count.")
        .def("state_join", [](Context & self, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
                              uint32_t n_tokens) { return py::bytes(join(self, pieces, keys, n_tokens)); },
             py::arg("pieces"), py::arg("keys"), py::arg("n_tokens") = 0,
             "Join chunks (tagged keys[0..]) into one sequence state of their positions, or of the "
             "first n_tokens (inside the last chunk). ValueError, nothing built, when a chunk's "
             "key, position, layout or size is not what the chain needs.")
        .def("state_seq_get_chunks", [](Context & self, llama_seq_id seq, const std::vector<py::bytes> & keys,
                                        uint32_t chunk_size, size_t first) {
            const std::string state = state_seq_bytes(self, seq);
            return cut(self, state, keys, chunk_size, first);
        }, py::arg("seq"), py::arg("keys"), py::arg("chunk_size"), py::arg("first") = 0,
           "state_cut(state_seq_get(seq), ...) without the intermediate bytes.")
        .def("state_seq_set_chunks", [](Context & self, llama_seq_id seq, const std::vector<py::bytes> & pieces,
                                        const std::vector<py::bytes> & keys, uint32_t n_tokens) {
            check_seq(self, seq);
            const std::string state = join(self, pieces, keys, n_tokens);
            return state_seq_load(self, seq, state);
        }, py::arg("seq"), py::arg("pieces"), py::arg("keys"), py::arg("n_tokens") = 0,
           "state_seq_set(seq, state_join(pieces, keys)): bytes read, 0 when llama.cpp refused.");
}

}  // namespace wb
