// Model load/free, vocabulary facts, tokenize / detokenize, GGUF structure check.
#include "native.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sys/stat.h>

#include "gguf.h"

namespace wb {

namespace {

std::mutex g_log_mutex;
std::deque<std::string> g_log_lines;
std::string g_log_partial;
std::atomic<bool> g_log_echo{false};

void log_callback(ggml_log_level level, const char * text, void *) {
    if (g_log_echo.load(std::memory_order_relaxed)) {
        std::fputs(text, stderr);
    }
    if (level != GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_ERROR &&
        level != GGML_LOG_LEVEL_CONT) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log_partial += text;
    size_t nl;
    while ((nl = g_log_partial.find('\n')) != std::string::npos) {
        std::string line = g_log_partial.substr(0, nl);
        g_log_partial.erase(0, nl + 1);
        if (!line.empty()) {
            g_log_lines.push_back(line);
            if (g_log_lines.size() > 8) g_log_lines.pop_front();
        }
    }
}

}  // namespace

void install_log_callback() { llama_log_set(log_callback, nullptr); }

std::string recent_log() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    std::string out;
    for (const auto & line : g_log_lines) {
        if (!out.empty()) out += "; ";
        out += line;
    }
    return out;
}

void clear_recent_log() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_log_lines.clear();
    g_log_partial.clear();
}

Model::Model(const std::string & path_, int n_gpu_layers, bool use_mmap, bool vocab_only, const py::dict & options)
    : path(path_) {
    llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = n_gpu_layers;
    params.vocab_only = vocab_only;
    params.load_mode = use_mmap ? params.load_mode : LLAMA_LOAD_MODE_NONE;
    std::vector<float> split;  // llama.cpp copies tensor_split during the load
    apply_model_options(params, options, split);  // an explicit load_mode wins over use_mmap
    {
        py::gil_scoped_release release;
        clear_recent_log();
        try {
            model_ = llama_model_load_from_file(path.c_str(), params);
        } catch (const std::exception & e) {
            model_ = nullptr;
        }
    }
    if (model_ == nullptr) {
        std::string why = recent_log();
        throw NativeError("llama.cpp could not load the model '" + path + "'" +
                          (why.empty() ? "" : ": " + why));
    }
    n_ctx_train_ = llama_model_n_ctx_train(model_);
    const llama_vocab * v = llama_model_get_vocab(model_);
    char buf[8];
    for (llama_token t = 0; t < llama_vocab_n_tokens(v); ++t) {
        const int n = llama_token_to_piece(v, t, buf, sizeof(buf), 0, true);  // -(length) when longer
        max_piece_bytes_ = std::max(max_piece_bytes_, (size_t)(n < 0 ? -n : n));
    }
}

Model::~Model() { close(); }

void Model::close() {
    if (model_ != nullptr) {
        llama_model_free(model_);
        model_ = nullptr;
    }
}

llama_model * Model::get() const {
    if (model_ == nullptr) throw NativeError("the model has been freed");
    return model_;
}

const llama_vocab * Model::vocab() const { return llama_model_get_vocab(get()); }

void Model::check_token(llama_token token) const {
    const int n_vocab = llama_vocab_n_tokens(vocab());
    if (token < 0 || token >= n_vocab) {
        throw py::value_error("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                              std::to_string(n_vocab) + ")");
    }
}

std::vector<llama_token> Model::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    const llama_vocab * v = vocab();
    if (text.size() > (size_t)INT32_MAX / 2) throw py::value_error("text too long to tokenize");
    std::vector<llama_token> out;
    py::gil_scoped_release release;
    int n_max = (int)text.size() + 2 * (add_special ? 1 : 0) + 1;
    out.resize(n_max);
    int n = llama_tokenize(v, text.data(), (int32_t)text.size(), out.data(), n_max, add_special, parse_special);
    if (n < 0) {
        if (n == INT32_MIN) throw py::value_error("tokenization result too large");
        out.resize(-n);
        n = llama_tokenize(v, text.data(), (int32_t)text.size(), out.data(), -n, add_special, parse_special);
    }
    out.resize(n < 0 ? 0 : n);
    return out;
}

py::bytes Model::token_to_piece(llama_token token, bool special) const {
    check_token(token);
    char buf[256];
    int n = llama_token_to_piece(vocab(), token, buf, sizeof(buf), 0, special);
    if (n >= 0) return py::bytes(buf, n);
    std::string big(-n, '\0');
    n = llama_token_to_piece(vocab(), token, big.data(), (int32_t)big.size(), 0, special);
    return py::bytes(big.data(), n < 0 ? 0 : n);
}

py::bytes Model::detokenize(const std::vector<llama_token> & tokens, bool remove_special, bool unparse_special) const {
    for (llama_token t : tokens) check_token(t);
    std::string out;
    {
        py::gil_scoped_release release;
        out.resize(tokens.size() * 8 + 16);
        int n = llama_detokenize(vocab(), tokens.data(), (int32_t)tokens.size(), out.data(),
                                 (int32_t)out.size(), remove_special, unparse_special);
        if (n < 0) {
            out.resize(-n);
            n = llama_detokenize(vocab(), tokens.data(), (int32_t)tokens.size(), out.data(),
                                 (int32_t)out.size(), remove_special, unparse_special);
        }
        out.resize(n < 0 ? 0 : n);
    }
    return py::bytes(out);
}

// Structural check of a GGUF file with ggml's own parser, before llama.cpp loads it:
// header, key/values and tensor infos parse, and every tensor's data lies inside the file.
// Returns None when the file is sound, else a message saying what is wrong.
static py::object gguf_check(const std::string & path) {
    std::string problem;
    {
        py::gil_scoped_release release;
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) {
            problem = "cannot stat the file";
        } else {
            clear_recent_log();
            gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
            gguf_context * g = nullptr;
            try {
                g = gguf_init_from_file(path.c_str(), params);
            } catch (const std::exception & e) {
                g = nullptr;
            }
            if (g == nullptr) {
                std::string why = recent_log();
                problem = "not a valid GGUF file" + (why.empty() ? std::string() : " (" + why + ")");
            } else {
                const size_t base = gguf_get_data_offset(g);
                const int64_t n = gguf_get_n_tensors(g);
                for (int64_t i = 0; i < n; ++i) {
                    const size_t end = base + gguf_get_tensor_offset(g, i) + gguf_get_tensor_size(g, i);
                    if (end > (size_t)st.st_size) {
                        problem = "truncated: tensor '" + std::string(gguf_get_tensor_name(g, i)) +
                                  "' ends at byte " + std::to_string(end) + " but the file has " +
                                  std::to_string((long long)st.st_size) + " bytes";
                        break;
                    }
                }
                gguf_free(g);
            }
        }
    }
    if (problem.empty()) return py::none();
    return py::str(problem);
}

// The training context the file states ("<general.architecture>.context_length"), read with
// ggml's parser without loading the model; 0 when the file does not say (or is unreadable:
// gguf_check reports why). Settings that depend on it are checked before the model probe.
static int64_t gguf_context_length(const std::string & path) {
    py::gil_scoped_release release;
    gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_context * g = nullptr;
    try {
        g = gguf_init_from_file(path.c_str(), params);
    } catch (const std::exception &) {
        return 0;
    }
    if (g == nullptr) return 0;
    int64_t out = 0;
    const int64_t arch = gguf_find_key(g, "general.architecture");
    if (arch >= 0 && gguf_get_kv_type(g, arch) == GGUF_TYPE_STRING) {
        const std::string key = std::string(gguf_get_val_str(g, arch)) + ".context_length";
        const int64_t id = gguf_find_key(g, key.c_str());
        if (id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_UINT32) out = gguf_get_val_u32(g, id);
        if (id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_UINT64) {
            out = (int64_t)std::min<uint64_t>(gguf_get_val_u64(g, id), (uint64_t)INT32_MAX);
        }
    }
    gguf_free(g);
    return out;
}

static py::object meta(const Model & m, const std::string & key) {
    char buf[512];
    int n = llama_model_meta_val_str(m.get(), key.c_str(), buf, sizeof(buf));
    if (n < 0) return py::none();
    if ((size_t)n >= sizeof(buf)) {
        std::string big(n + 1, '\0');
        llama_model_meta_val_str(m.get(), key.c_str(), big.data(), big.size());
        big.resize(n);
        return py::str(big);
    }
    return py::str(std::string(buf, n));
}

static py::dict metadata(const Model & m) {
    py::dict out;
    const int n = llama_model_meta_count(m.get());
    std::vector<char> kbuf(256), vbuf(512);
    for (int i = 0; i < n; ++i) {
        int kn = llama_model_meta_key_by_index(m.get(), i, kbuf.data(), kbuf.size());
        if (kn < 0) continue;
        if ((size_t)kn >= kbuf.size()) {
            kbuf.resize(kn + 1);
            llama_model_meta_key_by_index(m.get(), i, kbuf.data(), kbuf.size());
        }
        int vn = llama_model_meta_val_str_by_index(m.get(), i, vbuf.data(), vbuf.size());
        if (vn < 0) continue;
        if ((size_t)vn >= vbuf.size()) {
            vbuf.resize(vn + 1);
            llama_model_meta_val_str_by_index(m.get(), i, vbuf.data(), vbuf.size());
        }
        out[py::str(std::string(kbuf.data(), kn))] =
            py::str(py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(vbuf.data(), vn, "replace")));
    }
    return out;
}

void bind_model(py::module_ & m) {
    m.def("gguf_check", &gguf_check, py::arg("path"),
          "None if path is a structurally sound GGUF file, else a message saying what is wrong.");
    m.def("gguf_context_length", &gguf_context_length, py::arg("path"),
          "The training context a GGUF file states (<arch>.context_length); 0 when absent.");
    m.def("set_log_echo", [](bool on) { g_log_echo.store(on); }, py::arg("on"),
          "Echo llama.cpp's log to stderr (off by default; warnings are kept for error messages).");
    m.def("recent_log", &recent_log, "The last warning/error lines llama.cpp logged.");

    py::class_<Model, std::shared_ptr<Model>>(m, "Model")
        .def(py::init<const std::string &, int, bool, bool, const py::dict &>(), py::arg("path"),
             py::arg("n_gpu_layers") = 0, py::arg("use_mmap") = true, py::arg("vocab_only") = false,
             py::arg("options") = py::dict(),
             "options: split_mode, main_gpu, tensor_split, load_mode (llama.cpp's names; absent = default)")
        .def_readonly("path", &Model::path)
        .def("close", &Model::close)
        .def_property_readonly("closed", &Model::closed)
        .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = true)
        .def("token_to_piece", &Model::token_to_piece, py::arg("token"), py::arg("special") = false)
        .def("detokenize", &Model::detokenize, py::arg("tokens"), py::arg("remove_special") = false,
             py::arg("unparse_special") = false)
        .def_property_readonly("max_piece_bytes", &Model::max_piece_bytes,
                               "The longest token piece in bytes (specials included): a text of n bytes "
                               "has at least ceil(n / max_piece_bytes) tokens.")
        .def("is_eog", [](const Model & self, llama_token t) { self.check_token(t); return llama_vocab_is_eog(self.vocab(), t); })
        .def_property_readonly("n_vocab", [](const Model & self) { return llama_vocab_n_tokens(self.vocab()); })
        .def_property_readonly("bos", [](const Model & self) { return llama_vocab_bos(self.vocab()); })
        .def_property_readonly("eos", [](const Model & self) { return llama_vocab_eos(self.vocab()); })
        .def_property_readonly("eot", [](const Model & self) { return llama_vocab_eot(self.vocab()); })
        .def_property_readonly("add_bos", [](const Model & self) { return llama_vocab_get_add_bos(self.vocab()); })
        .def_property_readonly("add_eos", [](const Model & self) { return llama_vocab_get_add_eos(self.vocab()); })
        .def_property_readonly("n_ctx_train", [](const Model & self) { self.get(); return self.n_ctx_train(); },
                               "The training context the file states (read at load).")
        .def_property_readonly("n_embd", [](const Model & self) { return llama_model_n_embd(self.get()); })
        .def_property_readonly("n_layer", [](const Model & self) { return llama_model_n_layer(self.get()); })
        .def_property_readonly("n_head", [](const Model & self) { return llama_model_n_head(self.get()); })
        .def_property_readonly("n_head_kv", [](const Model & self) { return llama_model_n_head_kv(self.get()); })
        .def_property_readonly("size", [](const Model & self) { return llama_model_size(self.get()); })
        .def_property_readonly("n_params", [](const Model & self) { return llama_model_n_params(self.get()); })
        .def_property_readonly("quant_tag", [](const Model & self) {
            std::string name = llama_ftype_name(llama_model_ftype(self.get()));  // e.g. "Q4_K - Medium"
            const std::string guessed = "(guessed) ";
            if (name.rfind(guessed, 0) == 0) name.erase(0, guessed.size());
            return name;
        }, "The file's quantisation as llama.cpp names it (llama_ftype_name), e.g. 'Q4_1'.")
        .def_property_readonly("desc", [](const Model & self) {
            char buf[256];
            int n = llama_model_desc(self.get(), buf, sizeof(buf));
            return std::string(buf, n < 0 ? 0 : std::min<int>(n, sizeof(buf) - 1));
        })
        .def_property_readonly("chat_template", [](const Model & self) -> py::object {
            const char * t = llama_model_chat_template(self.get(), nullptr);
            if (t == nullptr) return py::none();
            return py::str(t);
        })
        .def("meta", &meta, py::arg("key"))
        .def("metadata", &metadata);
}

}  // namespace wb
