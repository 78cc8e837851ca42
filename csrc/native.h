// Shared declarations of workbench._native: the handles each concern binds, and the
// helpers that keep llama.cpp's failures (null pointers, C++ exceptions, aborts we can
// pre-check) from reaching Python as a crash.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "llama.h"

namespace py = pybind11;

// Every Python str that crosses into a std::string goes through this caster: text that has
// no UTF-8 form (a lone surrogate such as "\ud800") raises workbench's InvalidOption naming
// the text and the code point, instead of pybind's "incompatible function arguments" TypeError.
namespace wb {
[[noreturn]] void raise_not_utf8(py::handle text);
}
namespace pybind11::detail {
template <>
struct type_caster<std::string> : string_caster<std::string> {
    bool load(handle src, bool convert) {
        if (string_caster<std::string>::load(src, convert)) return true;
        if (src && PyUnicode_Check(src.ptr())) wb::raise_not_utf8(src);
        return false;
    }
};
}  // namespace pybind11::detail

namespace wb {

// Raised for failures inside llama.cpp that are not the caller's bad input.
struct NativeError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The last few lines llama.cpp logged at warning level or above; appended to error
// messages so a failed load says why (llama.cpp only returns a null pointer).
std::string recent_log();
void clear_recent_log();

// llama.cpp's GBNF parser, grammar matcher and chat (PEG/JSON) parser recurse once per
// nesting level, so input nested deeply enough overflows the stack and kills the process.
// Input is checked against these bounds first (measured: 5,000 levels of JSON in a reply or
// 20,000 of GBNF groups crashed, 1,000 and 5,000 did not).
constexpr size_t MAX_NESTING = 512;
constexpr size_t MAX_GRAMMAR_RULES = 20000;
// The deepest nesting of the bracket pairs in `pairs` (e.g. "[]{}"). Free text: brackets
// anywhere count (a conservative bound, not a parse). json_strings: the text is valid JSON
// and brackets inside its strings do not count.
size_t nesting_depth(const std::string & text, const char * pairs, bool json_strings = false);

// How many tokens of the vocabulary a grammar sampler leaves a finite logit (0: none can
// come next). `cur` is scratch space for the candidate array.
size_t viable_tokens(llama_sampler * grammar, const llama_vocab * vocab, std::vector<llama_token_data> & cur);

// Owns a llama_model. Read-only after load, so tokenize/detokenize are safe from any thread.
class Model {
public:
    // options: the placement and load-mode load options (split_mode, main_gpu, tensor_split,
    // load_mode; see apply_model_options), absent keys at llama.cpp's defaults.
    Model(const std::string & path, int n_gpu_layers, bool use_mmap, bool vocab_only,
          const py::dict & options = py::dict());
    ~Model();
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    llama_model * get() const;
    const llama_vocab * vocab() const;
    void close();
    bool closed() const { return model_ == nullptr; }

    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    py::bytes token_to_piece(llama_token token, bool special) const;
    py::bytes detokenize(const std::vector<llama_token> & tokens, bool remove_special, bool unparse_special) const;
    void check_token(llama_token token) const;
    // The longest piece of any token, special ones included, in bytes: a text of n bytes has
    // at least ceil(n / max_piece_bytes) tokens. Computed once, at load.
    size_t max_piece_bytes() const { return max_piece_bytes_; }
    // The training context the file states, read at load: llama.cpp rescales its own copy
    // when a context uses YaRN with another frequency scale (llama_init_from_model).
    int32_t n_ctx_train() const { return n_ctx_train_; }

    std::string path;

private:
    llama_model * model_ = nullptr;
    size_t max_piece_bytes_ = 1;
    int32_t n_ctx_train_ = 0;
};

// Owns a llama_context, its reusable batch and the abort state the callback reads.
class Context {
public:
    Context(std::shared_ptr<Model> model, const py::dict & params);
    ~Context();
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    llama_context * get() const;
    void close();

    // One llama_decode over rows of possibly several sequences. budget_ms <= 0: no budget.
    int decode(const std::vector<llama_token> & tokens, const std::vector<llama_pos> & pos,
               const std::vector<llama_seq_id> & seq, const std::vector<int8_t> & logits,
               double budget_ms);

    void request_abort() { abort_flag_.store(true, std::memory_order_relaxed); }
    void clear_abort() { abort_flag_.store(false, std::memory_order_relaxed); }
    std::string abort_reason() const { return abort_reason_; }

    std::shared_ptr<Model> model;
    uint32_t n_ctx = 0, n_batch = 0, n_ubatch = 0, n_seq_max = 0;
    uint32_t n_cells = 0;  // KV cells of all sequences; n_ctx: the context of one sequence
    uint32_t kv_streams = 1;  // 1: a unified KV; n_seq_max: a stream per sequence (kv_unified false)
    int n_threads = 0;
    bool reference_kernels = false;  // ggml's CPU reference kernels (set_reference_kernels)
    int set_reference_kernels(bool on);
    std::vector<std::shared_ptr<void>> keep_alive;  // the LoRA adapters set on it (see set_adapters)

    static bool abort_callback(void * data);

private:
    llama_context * ctx_ = nullptr;
    llama_batch batch_{};
    std::atomic<bool> abort_flag_{false};
    std::atomic<int64_t> deadline_ns_{0};
    std::string abort_reason_;
};

// A parsed GBNF grammar kept as a prototype sampler: parsing happens once, each request
// gets a clone (llama_sampler_clone) with its own parse state.
class Grammar {
public:
    Grammar(std::shared_ptr<Model> model, const std::string & text, const std::string & root);
    ~Grammar();
    Grammar(const Grammar &) = delete;
    Grammar & operator=(const Grammar &) = delete;
    llama_sampler * clone() const;
    // Advance the prototype past text the prompt already holds (a chat template's generation
    // prompt), as llama.cpp's common sampler does for tool-call grammars; idempotent for the
    // same text. Defined in chat.cpp.
    void prefill(const std::string & text);
    // Make the prototype lazy: it constrains nothing until one of the trigger patterns (regex
    // on the generated text) or trigger tokens appears. Defined in chat.cpp.
    void make_lazy(const std::vector<std::string> & patterns, const std::vector<llama_token> & tokens);

    std::shared_ptr<Model> model;
    std::string text;
    std::string prefilled;
    bool lazy = false;

private:
    llama_sampler * proto_ = nullptr;
};

void check_seq(const Context & ctx, llama_seq_id seq);

// The load options that reach llama_model_params / llama_context_params beyond the basics
// (load_options.cpp): absent or None keys keep llama.cpp's defaults; a bad value is a
// ValueError naming the option. split_storage keeps tensor_split alive during the load.
void apply_model_options(llama_model_params & mp, const py::dict & options, std::vector<float> & split_storage);
void apply_context_options(llama_context_params & cp, const py::dict & params);

// llama_init_from_model with the GIL released; NativeError carrying llama.cpp's log if it fails.
llama_context * init_context(llama_model * model, const llama_context_params & params, const char * what);

void bind_model(py::module_ & m);
void bind_context(py::module_ & m);
void bind_sampler(py::module_ & m);
void bind_grammar(py::module_ & m);
void bind_adapter(py::module_ & m);
void bind_chat(py::module_ & m);
void bind_embed(py::module_ & m);
void bind_speculative(py::module_ & m);
void bind_devices(py::module_ & m);
void bind_lab(py::module_ & m);
void bind_eviction(py::module_ & m);
void bind_score(py::module_ & m);

}  // namespace wb
