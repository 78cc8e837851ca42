// Cutting one sequence's llama.cpp state into position-range chunks (docs/cache.md, "Chunked
// state"); verified chunks are joined back in kv_join.cpp.
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
#include "kv_chunks.h"

#include <pybind11/stl.h>

namespace wb {

namespace kvchunk {

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

std::string key_at(const std::vector<py::bytes> & keys, size_t i, const char * op) {
    std::string k = keys[i];
    if (k.size() != KEY_BYTES) {
        refuse(op, "key " + std::to_string(i) + " has " + std::to_string(k.size()) + " bytes, not 16");
    }
    return k;
}

}  // namespace kvchunk

namespace {

using namespace kvchunk;

// The layout every chunk of a state shares.
std::string layout_of(const SeqState & s) {
    std::string out;
    put<uint32_t>(out, (uint32_t)s.blocks.size());
    for (const KvBlock & b : s.blocks) {
        const KvStream & st = b.streams[0];
        // one stream, index 0: a chunk holds one sequence's cells whatever stream held them
        // (a KV stream per sequence in deterministic mode); the join writes them as the
        // destination context's streams, and llama.cpp restores them into the sequence's own
        put<uint32_t>(out, 1);
        put<uint32_t>(out, 0);
        put<uint32_t>(out, st.v_trans);
        put<uint32_t>(out, (uint32_t)st.layers.size());
        for (const KvLayer & L : st.layers) {
            put(out, L.k_type), put(out, L.k_row), put(out, L.v_type), put(out, L.v_row);
            put(out, L.v_el), put(out, L.v_width);
        }
    }
    return out;
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

// The chunks' end positions: `ends` when given (strictly increasing, the last n), else
// every chunk_size positions (the tail chunk shorter).
std::vector<uint32_t> chunk_ends(uint32_t n, uint32_t chunk_size, const std::vector<uint32_t> & ends) {
    if (ends.empty()) {
        if (chunk_size == 0) refuse("state_cut", "chunk_size must be at least 1");
        std::vector<uint32_t> grid;
        for (uint64_t e = chunk_size; e < n; e += chunk_size) grid.push_back((uint32_t)e);
        if (n > 0) grid.push_back(n);
        return grid;
    }
    uint32_t prev = 0;
    for (uint32_t e : ends) {
        if (e <= prev) refuse("state_cut", "chunk ends must increase from above 0");
        prev = e;
    }
    if (prev != n) {
        refuse("state_cut", "the last chunk ends at " + std::to_string(prev) + ", the state holds " +
                                std::to_string(n) + " cells");
    }
    return ends;
}

py::list cut(const Context & ctx, std::string_view state, const std::vector<py::bytes> & keys, uint32_t chunk_size,
             size_t first, const std::vector<uint32_t> & want_ends) {
    SeqState s;
    if (std::string why = parse_seq_state(state, state_limits(ctx), s); !why.empty()) {
        refuse("state_cut", "not a sequence state of this context (" + why + ")");
    }
    uint32_t n = 0;
    const auto perms = position_maps(s, n);
    const std::vector<uint32_t> ends = chunk_ends(n, chunk_size, want_ends);
    const size_t n_chunks = ends.size();
    if (keys.size() != n_chunks) {
        const std::string cut_as = want_ends.empty() ? "in chunks of " + std::to_string(chunk_size) : "cut at the ends given";
        refuse("state_cut", std::to_string(keys.size()) + " keys for " + std::to_string(n) + " cells " + cut_as +
                                " (expected " + std::to_string(n_chunks) + ")");
    }
    if (first > n_chunks) refuse("state_cut", "first chunk " + std::to_string(first) + " is past the last");
    const std::string layout = layout_of(s);
    const uint16_t flags = (s.ext ? 1 : 0) | (s.with_v ? 2 : 0);
    py::list out;
    for (size_t c = first; c < n_chunks; ++c) {
        const uint32_t p0 = c ? ends[c - 1] : 0;
        const uint32_t len = ends[c] - p0;
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

// The sequence's state copied out of llama.cpp into the scratch bytearray, then cut.
py::list get_chunks(Context & ctx, llama_seq_id seq, const std::vector<py::bytes> & keys, uint32_t chunk_size,
                    size_t first, const py::object & scratch, const std::vector<uint32_t> & ends) {
    if (scratch.is_none()) return cut(ctx, state_seq_bytes(ctx, seq), keys, chunk_size, first, ends);
    check_seq(ctx, seq);
    llama_context * c = ctx.get();
    size_t size = 0;
    {
        py::gil_scoped_release release;
        size = llama_state_seq_get_size_ext(c, seq, 0);
    }
    Scratch buf(scratch, size, "state_seq_get_chunks");
    size_t got = 0;
    {
        py::gil_scoped_release release;
        got = llama_state_seq_get_data_ext(c, reinterpret_cast<uint8_t *>(buf.data()), size, seq, 0);
    }
    return cut(ctx, std::string_view(buf.data(), got), keys, chunk_size, first, ends);
}

}  // namespace

void bind_kv_chunks(py::class_<Context, std::shared_ptr<Context>> & cls) {
    cls.def("state_cut", [](Context & self, py::bytes state, const std::vector<py::bytes> & keys, uint32_t chunk_size,
                            size_t first, const std::vector<uint32_t> & ends) {
                return cut(self, std::string_view(state), keys, chunk_size, first, ends);
            },
            py::arg("state"), py::arg("keys"), py::arg("chunk_size"), py::arg("first") = 0,
            py::arg("ends") = std::vector<uint32_t>{},
            "Cut a sequence state into chunks of chunk_size positions (or ending at `ends`, "
            "increasing, the last the state's cell count), chunk i tagged with keys[i]; returns "
            "chunks first.. . ValueError when the state is not one sequence holding positions "
            "0 .. n-1 of this context, or the keys do not match the chunk count.")
        .def("state_join", &kvchunk::join, py::arg("pieces"), py::arg("keys"), py::arg("n_tokens") = 0,
             "Join chunks (tagged keys[0..]) into one sequence state of their positions, or of the "
             "first n_tokens (inside the last chunk). ValueError, nothing built, when a chunk's "
             "key, position, layout or size is not what the chain needs.")
        .def("state_seq_get_chunks", &get_chunks, py::arg("seq"), py::arg("keys"), py::arg("chunk_size"),
             py::arg("first") = 0, py::arg("scratch") = py::none(), py::arg("ends") = std::vector<uint32_t>{},
             "state_cut(state_seq_get(seq), ...) without the intermediate bytes; the state is copied "
             "out of llama.cpp into `scratch` (a bytearray kept between calls, grown as needed).")
        .def("state_seq_set_chunks", &kvchunk::set_chunks, py::arg("seq"), py::arg("pieces"), py::arg("keys"),
             py::arg("n_tokens") = 0, py::arg("scratch") = py::none(),
             "state_seq_set(seq, state_join(pieces, keys)), joined into `scratch` (a bytearray kept "
             "between calls, grown as needed): bytes read, 0 when llama.cpp refused.");
}

}  // namespace wb

