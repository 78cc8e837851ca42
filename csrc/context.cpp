// Context create/free, the multi-sequence batch decode (GIL released, abortable with a
// per-step wall-clock budget), KV sequence ops and sequence state as bytes.
#include "native.h"
#include "kv_state.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "../vendor/llama.cpp/src/llama-context.h"  // llama_context::get_sched (its CPU backend)

#include <pybind11/stl.h>

#include <cstring>

namespace wb {

namespace {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

ggml_type parse_cache_type(const std::string & name, const char * option) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * tn = ggml_type_name((ggml_type)t);
        if (tn != nullptr && name == tn) return (ggml_type)t;
    }
    throw py::value_error(std::string("option ") + option + ": unknown KV cache type '" + name +
                          "' (expected a ggml type name such as f16, bf16, f32, q8_0, q4_0)");
}

template <typename T>
T get_param(const py::dict & params, const char * key, T fallback) {
    if (!params.contains(key) || params[key].is_none()) return fallback;
    return params[key].cast<T>();
}

}  // namespace

llama_context * init_context(llama_model * model, const llama_context_params & params, const char * what) {
    llama_context * ctx = nullptr;
    {
        py::gil_scoped_release release;
        clear_recent_log();
        try {
            ctx = llama_init_from_model(model, params);
        } catch (const std::exception &) {
            ctx = nullptr;
        }
    }
    if (ctx == nullptr) {
        std::string why = recent_log();
        throw NativeError(std::string("llama.cpp could not create ") + what + (why.empty() ? "" : ": " + why));
    }
    return ctx;
}

bool Context::abort_callback(void * data) {
    auto * self = static_cast<Context *>(data);
    if (self->abort_flag_.load(std::memory_order_relaxed)) {
        self->abort_reason_ = "cancelled";
        return true;
    }
    const int64_t deadline = self->deadline_ns_.load(std::memory_order_relaxed);
    if (deadline != 0 && now_ns() > deadline) {
        self->abort_reason_ = "timeout";
        return true;
    }
    return false;
}

Context::Context(std::shared_ptr<Model> model_, const py::dict & params) : model(std::move(model_)) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = get_param<uint32_t>(params, "n_ctx", cp.n_ctx);
    cp.n_batch = get_param<uint32_t>(params, "n_batch", cp.n_batch);
    cp.n_ubatch = get_param<uint32_t>(params, "n_ubatch", cp.n_ubatch);
    cp.n_seq_max = get_param<uint32_t>(params, "n_seq_max", cp.n_seq_max);
    cp.n_threads = get_param<int>(params, "n_threads", cp.n_threads);
    cp.n_threads_batch = get_param<int>(params, "n_threads_batch", cp.n_threads);
    cp.embeddings = get_param<bool>(params, "embeddings", false);
    cp.kv_unified = get_param<bool>(params, "kv_unified", true);
    cp.no_perf = true;
    apply_context_options(cp, params);  // offload_kqv, swa_full, RoPE/YaRN (load_options.cpp)
    const std::string fa = get_param<std::string>(params, "flash_attn", "auto");
    if (fa == "auto") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    else if (fa == "on") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else if (fa == "off") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else throw py::value_error("option flash_attn: '" + fa + "' is not one of 'auto', 'on', 'off'");
    cp.type_k = parse_cache_type(get_param<std::string>(params, "type_k", "f16"), "type_k");
    cp.type_v = parse_cache_type(get_param<std::string>(params, "type_v", "f16"), "type_v");

    // Pre-checks for what llama.cpp would assert on rather than report.
    if (cp.n_seq_max == 0 || cp.n_seq_max > llama_max_parallel_sequences()) {
        throw py::value_error("option n_seq_max: " + std::to_string(cp.n_seq_max) + " is outside [1, " +
                              std::to_string(llama_max_parallel_sequences()) + "]");
    }
    if (cp.n_batch == 0 || cp.n_ubatch == 0) throw py::value_error("n_batch and n_ubatch must be positive");
    if (cp.n_threads <= 0 || cp.n_threads_batch <= 0) throw py::value_error("option n_threads must be positive");
    cp.abort_callback = &Context::abort_callback;
    cp.abort_callback_data = this;

    llama_model * lm = model->get();
    ctx_ = init_context(lm, cp, "a context");
    n_ctx = llama_n_ctx_seq(ctx_);   // = llama_n_ctx with a unified KV; one stream's without
    n_cells = llama_n_ctx(ctx_);
    n_batch = llama_n_batch(ctx_);
    n_ubatch = llama_n_ubatch(ctx_);
    n_seq_max = llama_n_seq_max(ctx_);
    kv_streams = cp.kv_unified ? 1 : n_seq_max;
    n_threads = cp.n_threads;
    batch_ = llama_batch_init((int32_t)n_batch, 0, 1);
    set_reference_kernels(get_param<bool>(params, "reference_kernels", false));
}

// ggml's CPU backend has a "reference" switch (ggml_backend_cpu_set_use_ref) that llama.cpp
// does not expose: with it, flash attention always runs its one-query-row-at-a-time kernel
// (no 64-row tiles for ubatches of 64+ rows, no KV split across threads for a single row
// over 512+ cells) and the tiled K-quant matmul and op fusion are off, so a row's result no
// longer depends on how many rows share its ubatch (docs/architecture.md, "Warm equals cold").
int Context::set_reference_kernels(bool on) {
    ggml_backend_sched_t sched = get()->get_sched();
    int n = 0;
    for (int i = 0; sched != nullptr && i < ggml_backend_sched_get_n_backends(sched); ++i) {
        ggml_backend_t b = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_is_cpu(b)) {
            ggml_backend_cpu_set_use_ref(b, on);
            ++n;
        }
    }
    reference_kernels = on && n > 0;
    return n;
}

Context::~Context() { close(); }

void Context::close() {
    if (ctx_ != nullptr) {
        llama_batch_free(batch_);
        batch_ = llama_batch{};
        llama_free(ctx_);
        ctx_ = nullptr;
    }
}

llama_context * Context::get() const {
    if (ctx_ == nullptr) throw NativeError("the context has been freed");
    return ctx_;
}

void check_seq(const Context & ctx, llama_seq_id seq) {
    if (seq < 0 || (uint32_t)seq >= ctx.n_seq_max) {
        throw py::value_error("sequence id " + std::to_string(seq) + " is outside [0, " +
                              std::to_string(ctx.n_seq_max) + ")");
    }
}

int Context::decode(const std::vector<llama_token> & tokens, const std::vector<llama_pos> & pos,
                    const std::vector<llama_seq_id> & seq, const std::vector<int8_t> & logits,
                    double budget_ms) {
    llama_context * c = get();
    const size_t n = tokens.size();
    if (n == 0) throw py::value_error("decode: empty batch");
    if (pos.size() != n || seq.size() != n || logits.size() != n) {
        throw py::value_error("decode: tokens, pos, seq and logits must have the same length");
    }
    if (n > n_batch) {
        throw py::value_error("decode: " + std::to_string(n) + " rows exceed n_batch " + std::to_string(n_batch));
    }
    const int n_vocab = llama_vocab_n_tokens(model->vocab());
    for (size_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            throw py::value_error("decode: token id " + std::to_string(tokens[i]) + " outside the vocabulary");
        }
        if (pos[i] < 0 || (uint32_t)pos[i] >= n_ctx) {
            throw py::value_error("decode: position " + std::to_string(pos[i]) + " outside the context (n_ctx " +
                                  std::to_string(n_ctx) + ")");
        }
        check_seq(*this, seq[i]);
        batch_.token[i] = tokens[i];
        batch_.pos[i] = pos[i];
        batch_.n_seq_id[i] = 1;
        batch_.seq_id[i][0] = seq[i];
        batch_.logits[i] = logits[i] != 0;
    }
    batch_.n_tokens = (int32_t)n;
    abort_reason_.clear();
    int rc = 0;
    bool threw = false;
    std::string what;
    {
        py::gil_scoped_release release;
        deadline_ns_.store(budget_ms > 0 ? now_ns() + (int64_t)(budget_ms * 1e6) : 0, std::memory_order_relaxed);
        try {
            rc = llama_decode(c, batch_);
        } catch (const std::exception & e) {
            threw = true;
            what = e.what();
        }
        deadline_ns_.store(0, std::memory_order_relaxed);
    }
    if (threw) throw NativeError(std::string("llama_decode raised: ") + what);
    return rc;
}

// Checks a per-sequence state (llama.cpp's format at the pinned commit, KV caches only)
// against this context before llama.cpp restores it: llama.cpp takes each cell's position
// as it is, so one cell at INT32_MAX poisons the sequence and every later decode on it
// fails. Throws ValueError saying what is wrong. Recurrent and hybrid models keep another
// format, left to llama.cpp.
void check_seq_state(const Context & ctx, std::string_view state) {
    const llama_model * m = ctx.model->get();
    if (llama_model_is_recurrent(m) || llama_model_is_hybrid(m)) return;
    SeqState parsed;
    const std::string why = parse_seq_state(state, state_limits(ctx), parsed);
    if (!why.empty()) throw py::value_error("state_seq_set: refused a malformed sequence state (" + why + ")");
}

std::string state_seq_bytes(Context & self, llama_seq_id seq) {
    check_seq(self, seq);
    llama_context * c = self.get();
    std::string buf;
    py::gil_scoped_release release;
    const size_t size = llama_state_seq_get_size_ext(c, seq, 0);
    buf.resize(size);
    const size_t got = llama_state_seq_get_data_ext(c, reinterpret_cast<uint8_t *>(buf.data()), size, seq, 0);
    buf.resize(got);
    return buf;
}

size_t state_seq_load(Context & self, llama_seq_id seq, std::string_view state) {
    check_seq(self, seq);
    llama_context * c = self.get();
    check_seq_state(self, state);
    py::gil_scoped_release release;
    try {
        return llama_state_seq_set_data_ext(c, reinterpret_cast<const uint8_t *>(state.data()), state.size(), seq, 0);
    } catch (const std::exception &) {
        return 0;
    }
}

void bind_context(py::module_ & m) {
    py::class_<Context, std::shared_ptr<Context>> cls(m, "Context");
    cls.def(py::init<std::shared_ptr<Model>, const py::dict &>(), py::arg("model"), py::arg("params"))
        .def("close", &Context::close)
        .def_readonly("n_ctx", &Context::n_ctx)
        .def_readonly("n_cells", &Context::n_cells)
        .def_readonly("kv_streams", &Context::kv_streams)
        .def_readonly("n_batch", &Context::n_batch)
        .def_readonly("n_ubatch", &Context::n_ubatch)
        .def_readonly("n_seq_max", &Context::n_seq_max)
        .def_readonly("n_threads", &Context::n_threads)
        .def_readonly("reference_kernels", &Context::reference_kernels)
        .def("set_reference_kernels", &Context::set_reference_kernels, py::arg("on"),
             "Switch ggml's CPU reference kernels (batch-invariant rows) on or off for this "
             "context's CPU backends; returns how many CPU backends it set.")
        .def("decode", &Context::decode, py::arg("tokens"), py::arg("pos"), py::arg("seq"), py::arg("logits"),
             py::arg("budget_ms") = 0.0,
             "One llama_decode over the rows given. Returns llama.cpp's code: 0 ok, 1 no KV slot, "
             "2 aborted (see abort_reason), -1 invalid batch, < -1 fatal.")
        .def("request_abort", &Context::request_abort,
             "Ask a running decode to stop at its next graph node; safe from any thread.")
        .def("clear_abort", &Context::clear_abort)
        .def_property_readonly("abort_reason", &Context::abort_reason)
        .def("seq_rm", [](Context & self, llama_seq_id seq, llama_pos p0, llama_pos p1) {
            if (seq != -1) check_seq(self, seq);
            return llama_memory_seq_rm(llama_get_memory(self.get()), seq, p0, p1);
        }, py::arg("seq"), py::arg("p0") = -1, py::arg("p1") = -1)
        .def("seq_cp", [](Context & self, llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) {
            check_seq(self, src);
            check_seq(self, dst);
            // between two KV streams llama.cpp copies whole streams only and asserts (aborts
            // the process) on a range: refused here instead
            if (self.kv_streams > 1 && src != dst && (p0 > 0 || p1 > 0)) {
                throw py::value_error("seq_cp: with a KV stream per sequence (kv_unified off) only whole "
                                      "sequences are copied: p0 and p1 must be -1, got " +
                                      std::to_string(p0) + " and " + std::to_string(p1));
            }
            llama_memory_seq_cp(llama_get_memory(self.get()), src, dst, p0, p1);
        }, py::arg("src"), py::arg("dst"), py::arg("p0") = -1, py::arg("p1") = -1,
           "Copy src's cells in positions [p0, p1) to dst (-1: unbounded). A unified KV shares "
           "the cells; with a stream per sequence only whole sequences (p0 = p1 = -1), copied "
           "at the next decode.")
        .def("seq_keep", [](Context & self, llama_seq_id seq) {
            check_seq(self, seq);
            llama_memory_seq_keep(llama_get_memory(self.get()), seq);
        }, py::arg("seq"))
        .def("seq_pos_max", [](Context & self, llama_seq_id seq) {
            check_seq(self, seq);
            return llama_memory_seq_pos_max(llama_get_memory(self.get()), seq);
        }, py::arg("seq"))
        .def("seq_pos_min", [](Context & self, llama_seq_id seq) {
            check_seq(self, seq);
            return llama_memory_seq_pos_min(llama_get_memory(self.get()), seq);
        }, py::arg("seq"))
        .def("memory_clear", [](Context & self) { llama_memory_clear(llama_get_memory(self.get()), true); })
        .def("state_seq_get", [](Context & self, llama_seq_id seq) { return py::bytes(state_seq_bytes(self, seq)); },
             py::arg("seq"), "The sequence's KV state as bytes (llama.cpp's own serialisation).")
        .def("state_seq_set", [](Context & self, llama_seq_id seq, py::bytes data) {
            return state_seq_load(self, seq, std::string_view(data));
        }, py::arg("seq"), py::arg("data"),
           "Restore a sequence's KV state; returns the bytes read, 0 when llama.cpp refused it. "
           "ValueError (nothing restored) when the state does not fit this context: a position "
           "outside n_ctx, more cells than it holds, sizes that disagree with the length.");
    bind_kv_chunks(cls);
}

}  // namespace wb
