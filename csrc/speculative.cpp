// Speculative drafting through llama.cpp's common/speculative.h: the n-gram drafters
// (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-cache) and the draft-model drafter
// (draft-simple), one common_speculative per Speculative object over n_seq sequences.
//
// The engine verifies drafts itself (in its own batched decode) and only asks this object
// for a draft and tells it how many draft tokens were accepted. Every argument is checked
// here first: llama.cpp asserts on a sequence id out of range, on an accept without a
// draft, and (ngram-map) on a history shorter than the one it saw last.
#include "native.h"

#include "common.h"
#include "log.h"
#include "speculative.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

namespace wb {

namespace {

// The drafters this binding offers, by llama.cpp's names. ngram-mod and the embedding-fed
// draft types (eagle3, mtp, dflash) need target features the engine does not hand over.
const char * const OFFERED[] = {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft-simple"};

common_speculative_type offered_type(const std::string & name) {
    for (const char * n : OFFERED) {
        if (name == n) return common_speculative_type_from_name(name);
    }
    std::string known;
    for (const char * n : OFFERED) known += std::string(known.empty() ? "" : ", ") + n;
    throw py::value_error("speculative type '" + name + "' is not one of " + known);
}

template <typename T>
T get_int(const py::dict & p, const char * key, T dflt, long long lo, long long hi) {
    if (!p.contains(key) || p[key].is_none()) return dflt;
    const long long v = p[key].cast<long long>();
    if (v < lo || v > hi) {
        throw py::value_error(std::string("speculative ") + key + ": " + std::to_string(v) + " outside [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return (T)v;
}

void set_ngram(common_params_speculative_ngram_map & m, const py::dict & p) {
    m.size_n = get_int<uint16_t>(p, "size_n", m.size_n, 1, 1024);
    m.size_m = get_int<uint16_t>(p, "size_m", m.size_m, 1, 1024);
    m.min_hits = get_int<uint16_t>(p, "min_hits", m.min_hits, 1, 1024);
}

class Speculative {
public:
    Speculative(std::shared_ptr<Model> model, const py::dict & p, uint32_t n_seq, std::shared_ptr<Context> target,
                std::shared_ptr<Context> draft)
        : model_(std::move(model)), target_(std::move(target)), draft_(std::move(draft)) {
        if (!model_ || model_->closed()) throw py::value_error("speculative: the model is closed");
        if (n_seq == 0 || n_seq > 256) throw py::value_error("speculative: n_seq must be in [1, 256]");
        if (!p.contains("type")) throw py::value_error("speculative: 'type' is required");
        const common_speculative_type type = offered_type(p["type"].cast<std::string>());
        common_params_speculative params;
        params.types = {type};
        set_ngram(params.ngram_simple, p);
        set_ngram(params.ngram_map_k, p);
        set_ngram(params.ngram_map_k4v, p);
        params.draft.n_max = get_int<int32_t>(p, "n_max", params.draft.n_max, 0, 1024);
        params.draft.n_min = get_int<int32_t>(p, "n_min", params.draft.n_min, 0, 1024);
        if (p.contains("p_min") && !p["p_min"].is_none()) params.draft.p_min = p["p_min"].cast<float>();
        if (type == COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) {
            if (!target_ || !draft_) throw py::value_error("speculative draft-simple: needs the target and draft contexts");
            params.draft.ctx_tgt = target_->get();
            params.draft.ctx_dft = draft_->get();
        }
        common_speculative * spec = nullptr;
        std::string what;
        {
            py::gil_scoped_release release;
            try {
                spec = common_speculative_init(params, n_seq);
            } catch (const std::exception & e) {
                what = e.what();
            }
        }
        // draft-simple throws when llama.cpp's vocabulary check (common_speculative_are_compatible:
        // vocab type, BOS/EOS, size within 128, every token's text from id 5 on) fails
        if (!what.empty()) throw py::value_error("speculative: " + what);
        if (spec == nullptr) throw NativeError("speculative: llama.cpp made no drafter" + recent_log());
        spec_ = spec;
        type_ = common_speculative_type_to_str(type);
        seqs_.resize(n_seq);
    }
    ~Speculative() { close(); }

    void close() {
        if (spec_ != nullptr) {
            common_speculative_free(spec_);
            spec_ = nullptr;
        }
    }

    // Start (or restart) a sequence's generation: the drafters that index the prompt do so.
    void begin(llama_seq_id seq, const llama_tokens & prompt) {
        SeqState & s = state(seq);
        check_tokens(prompt);
        {
            py::gil_scoped_release release;
            common_speculative_begin(spec_, seq, prompt);
        }
        s.seen = prompt.size();
        s.drafted = false;
    }

    // Up to n_max draft tokens to follow `history` (the tokens in the sequence's KV) and
    // `id_last` (the token sampled last, at position pos0, not yet in the KV).
    llama_tokens draft(llama_seq_id seq, const llama_tokens & history, llama_token id_last, llama_pos pos0, int32_t n_max) {
        SeqState & s = state(seq);
        check_tokens(history);
        model_->check_token(id_last);
        if (n_max < 1) throw py::value_error("speculative draft: n_max must be at least 1");
        if (pos0 < 0) throw py::value_error("speculative draft: pos0 must be >= 0");
        if (history.size() < s.seen) begin(seq, history);  // ngram-map aborts on a shorter history
        s.result.clear();
        s.prompt = history;
        common_speculative_draft_params & dp = common_speculative_get_draft_params(spec_, seq);
        dp.drafting = true;
        dp.n_max = n_max;
        dp.pos0 = pos0;
        dp.id_last = id_last;
        dp.prompt = &s.prompt;
        dp.result = &s.result;
        std::string what;
        {
            py::gil_scoped_release release;
            try {
                common_speculative_draft(spec_);
            } catch (const std::exception & e) {
                what = e.what();
            }
        }
        dp.drafting = false;
        if (!what.empty()) throw NativeError("speculative draft failed: " + what);
        s.seen = history.size();
        if ((int32_t)s.result.size() > n_max) s.result.resize(n_max);
        s.drafted = !s.result.empty();
        s.n_draft = s.result.size();
        return s.result;
    }

    // How many tokens of the last draft the target accepted (at most its length).
    void accept(llama_seq_id seq, int n_accepted) {
        SeqState & s = state(seq);
        if (n_accepted < 0) throw py::value_error("speculative accept: n_accepted must be >= 0");
        if (!s.drafted) return;  // llama.cpp asserts on an accept with no draft behind it
        const auto n = (uint16_t)std::min<size_t>((size_t)n_accepted, s.n_draft);
        py::gil_scoped_release release;
        common_speculative_accept(spec_, seq, n);
        s.drafted = false;
    }

    int32_t n_max() const { return common_speculative_n_max(live()); }
    const std::string & type() const { return type_; }
    uint32_t n_seq() const { return (uint32_t)seqs_.size(); }

private:
    struct SeqState {
        llama_tokens prompt;   // what dparams.prompt points at during a draft
        llama_tokens result;
        size_t seen = 0;       // history length at the last begin/draft
        size_t n_draft = 0;
        bool drafted = false;  // a non-empty draft not yet accepted
    };

    const common_speculative * live() const {
        if (spec_ == nullptr) throw NativeError("the speculative drafter has been closed");
        return spec_;
    }

    SeqState & state(llama_seq_id seq) {
        live();
        if (seq < 0 || (size_t)seq >= seqs_.size()) {
            throw py::value_error("speculative: sequence " + std::to_string(seq) + " outside [0, " +
                                  std::to_string(seqs_.size()) + ")");
        }
        return seqs_[seq];
    }

    void check_tokens(const llama_tokens & tokens) const {
        for (llama_token t : tokens) model_->check_token(t);
    }

    common_speculative * spec_ = nullptr;
    std::shared_ptr<Model> model_;             // the target's: every token id is checked against it
    std::shared_ptr<Context> target_, draft_;  // kept alive while llama.cpp holds their pointers
    std::vector<SeqState> seqs_;
    std::string type_;
};

// The n largest logits at output row idx of the last decode, as (token, logit), largest
// first: what a divergence between two runs is measured by (the top-2 gap).
std::vector<std::pair<llama_token, float>> top_logits(Context & ctx, int idx, int n) {
    if (idx < 0 || (uint32_t)idx >= ctx.n_batch) throw py::value_error("top_logits: output index out of range");
    if (n < 1) throw py::value_error("top_logits: n must be at least 1");
    const float * logits = llama_get_logits_ith(ctx.get(), idx);
    if (logits == nullptr) throw py::value_error("top_logits: no logits at output row " + std::to_string(idx));
    const int n_vocab = llama_vocab_n_tokens(ctx.model->vocab());
    std::vector<std::pair<llama_token, float>> all(n_vocab);
    for (llama_token t = 0; t < n_vocab; ++t) all[t] = {t, logits[t]};
    const int k = std::min(n, n_vocab);
    std::partial_sort(all.begin(), all.begin() + k, all.end(),
                      [](const auto & a, const auto & b) { return a.second > b.second; });
    all.resize(k);
    return all;
}

}  // namespace

void bind_speculative(py::module_ & m) {
    // common's own log (not llama.cpp's callback) prints the n-gram maps' INFO lines per
    // draft to stderr, i.e. into the notebook: errors only
    common_log_set_verbosity_thold(LOG_LEVEL_ERROR);
    py::class_<Speculative, std::shared_ptr<Speculative>>(m, "Speculative")
        .def(py::init<std::shared_ptr<Model>, const py::dict &, uint32_t, std::shared_ptr<Context>,
                      std::shared_ptr<Context>>(),
             py::arg("model"), py::arg("params"), py::arg("n_seq") = 1, py::arg("target") = nullptr, py::arg("draft") = nullptr,
             "llama.cpp's common_speculative_init for one drafter type over n_seq sequences.")
        .def("begin", &Speculative::begin, py::arg("seq"), py::arg("prompt"))
        .def("draft", &Speculative::draft, py::arg("seq"), py::arg("history"), py::arg("id_last"), py::arg("pos0"),
             py::arg("n_max"), "Up to n_max draft tokens after history + id_last (GIL released).")
        .def("accept", &Speculative::accept, py::arg("seq"), py::arg("n_accepted"))
        .def_property_readonly("n_max", &Speculative::n_max)
        .def_property_readonly("type", &Speculative::type)
        .def_property_readonly("n_seq", &Speculative::n_seq)
        .def("close", &Speculative::close);
    m.def("top_logits", &top_logits, py::arg("ctx"), py::arg("idx"), py::arg("n") = 2,
          "The n largest logits at output row idx of the last decode: [(token, logit)], largest first.");
    m.def("speculative_types", []() {
        std::vector<std::string> out(std::begin(OFFERED), std::end(OFFERED));
        return out;
    });
}

}  // namespace wb
