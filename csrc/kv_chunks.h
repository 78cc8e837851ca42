// The KV chunk format shared by the cut (kv_chunks.cpp, where the layout is written out) and
// the join (kv_join.cpp): constants, byte helpers, the scratch buffer both copy through.
#pragma once

#include "kv_state.h"

#include <cstring>
#include <string>
#include <vector>

namespace wb::kvchunk {

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

[[noreturn]] inline void refuse(const std::string & op, const std::string & why) {
    throw py::value_error(op + ": " + why);
}

// Bytes a chunk of n cells carries per KV cache (its body), from the layout; 0 on overflow.
uint64_t body_bytes(const SeqState & s, uint64_t n);

// keys[i], refused unless it has KEY_BYTES bytes.
std::string key_at(const std::vector<py::bytes> & keys, size_t i, const char * op);

// A bytearray the caller keeps between calls as a scratch buffer, grown to `size` when
// shorter, and held exported while we write into it (an exported bytearray cannot be
// resized, so its memory stays put with the GIL released). Its pages stay mapped from one
// call to the next: writing 47 MB into fresh memory costs its page faults, several times
// the copy itself.
class Scratch {
public:
    Scratch(const py::object & buf, size_t size, const char * op) {
        if (!PyByteArray_Check(buf.ptr())) throw py::type_error(std::string(op) + ": scratch must be a bytearray or None");
        if ((size_t)PyByteArray_GET_SIZE(buf.ptr()) < size && PyByteArray_Resize(buf.ptr(), (Py_ssize_t)size) != 0) {
            throw py::error_already_set();
        }
        if (PyObject_GetBuffer(buf.ptr(), &view_, PyBUF_WRITABLE) != 0) throw py::error_already_set();
    }
    ~Scratch() { PyBuffer_Release(&view_); }
    Scratch(const Scratch &) = delete;
    Scratch & operator=(const Scratch &) = delete;
    char * data() { return static_cast<char *>(view_.buf); }

private:
    Py_buffer view_{};
};

// Context.state_join and Context.state_seq_set_chunks (kv_join.cpp).
py::bytes join(const Context & ctx, const std::vector<py::bytes> & pieces, const std::vector<py::bytes> & keys,
               uint32_t n_tokens);
size_t set_chunks(Context & ctx, llama_seq_id seq, const std::vector<py::bytes> & pieces,
                  const std::vector<py::bytes> & keys, uint32_t n_tokens, const py::object & scratch);

}  // namespace wb::kvchunk
