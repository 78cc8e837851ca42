// Per-request sampler chains (llama.cpp's own samplers, built in common's order).
//
// The chain has two parts. Shaping (the reasoning budget, the grammar, logit_bias,
// penalties) decides which tokens can come next and how likely; picking (greedy, or top-k,
// top-p, min-p, temperature and the seeded draw) chooses one. With `logprobs` set, the
// log-softmax of the shaped logits is taken between the two (vLLM's logprobs and
// llama-server's n_probs: before temperature and truncation; unlike them, after the grammar
// and the bans, so a token the request cannot produce has probability 0).
// End-of-generation tokens are banned before the chain while ignore_eos holds or fewer
// than min_tokens tokens have been sampled.
#include "native.h"

#include "reasoning-budget.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace wb {

namespace {

class Sampler {
public:
    Sampler(std::shared_ptr<Model> model_, const py::dict & p) : model(std::move(model_)) {
        auto get_f = [&](const char * k, double d) { return p.contains(k) && !p[k].is_none() ? p[k].cast<double>() : d; };
        auto get_i = [&](const char * k, long long d) { return p.contains(k) && !p[k].is_none() ? p[k].cast<long long>() : d; };
        const double temperature = get_f("temperature", 0.0);
        const long long top_k = get_i("top_k", 40);
        const double top_p = get_f("top_p", 1.0);
        const double min_p = get_f("min_p", 0.0);
        const double repeat_penalty = get_f("repetition_penalty", 1.0);
        const long long repeat_last_n = get_i("repeat_last_n", 64);
        const long long seed = get_i("seed", LLAMA_DEFAULT_SEED);
        std::string grammar, grammar_root = "root";
        if (p.contains("grammar") && !p["grammar"].is_none()) grammar = p["grammar"].cast<std::string>();
        if (p.contains("grammar_root") && !p["grammar_root"].is_none()) grammar_root = p["grammar_root"].cast<std::string>();

        ignore_eos_ = p.contains("ignore_eos") && p["ignore_eos"].cast<bool>();
        min_tokens_ = get_i("min_tokens", 0);
        n_logprobs_ = get_i("logprobs", -1);
        const double freq_penalty = get_f("frequency_penalty", 0.0);
        const double presence_penalty = get_f("presence_penalty", 0.0);
        std::vector<llama_logit_bias> logit_bias;
        if (p.contains("logit_bias") && !p["logit_bias"].is_none()) {
            for (const auto & [t, b] : p["logit_bias"].cast<std::vector<std::pair<llama_token, float>>>()) {
                model->check_token(t);
                if (std::isnan(b) || b == INFINITY) throw py::value_error("logit_bias: a bias must be finite or -inf");
                logit_bias.push_back({t, b});
            }
        }
        const int n_vocab = llama_vocab_n_tokens(model->vocab());
        if (n_logprobs_ > n_vocab) throw py::value_error("logprobs: more alternatives than the vocabulary has");
        for (llama_token t = 0; t < n_vocab; ++t) {
            if (llama_vocab_is_eog(model->vocab(), t)) eog_.push_back(t);
        }
        // the grammar first: parsing may fail, and nothing has been allocated yet
        llama_sampler * grammar_s = nullptr;
        if (p.contains("grammar_proto") && !p["grammar_proto"].is_none()) {
            // a pre-parsed grammar (the engine's compiled-grammar cache): clone, do not re-parse
            grammar_s = p["grammar_proto"].cast<std::shared_ptr<Grammar>>()->clone();
        } else if (!grammar.empty()) {
            grammar_s = Grammar(model, grammar, grammar_root).clone();
        }
        llama_sampler_chain_params cp = llama_sampler_chain_default_params();
        cp.no_perf = true;
        chain_ = llama_sampler_chain_init(cp);
        if (p.contains("reasoning_budget") && !p["reasoning_budget"].is_none()) {
            // llama.cpp common's reasoning-budget sampler, first in the chain as in
            // common_sampler: after `budget` tokens inside the block it forces the end
            // marker token by token, so the model's KV holds a closed block
            try {
                add_reasoning_budget(p["reasoning_budget"].cast<py::dict>());
            } catch (...) {
                if (grammar_s != nullptr) llama_sampler_free(grammar_s);
                close();
                throw;
            }
            has_budget_ = true;
        }
        if (grammar_s != nullptr) llama_sampler_chain_add(chain_, grammar_s);
        grammar_ = grammar_s;
        if (!logit_bias.empty()) {
            bias_ = llama_sampler_init_logit_bias(n_vocab, (int32_t)logit_bias.size(), logit_bias.data());
            llama_sampler_chain_add(chain_, bias_);
        }
        // the penalty window: -1 (or more) = the model's trained context; llama.cpp allocates
        // the window up front, so nothing larger reaches it
        const long long n_train = std::max(1, model->n_ctx_train());  // the file's value, not a YaRN-rewritten one
        const long long last_n = repeat_last_n < 0 || repeat_last_n > n_train ? n_train : repeat_last_n;
        const bool penalties = repeat_penalty != 1.0 || freq_penalty != 0.0 || presence_penalty != 0.0;
        if (penalties && last_n > 0) {
            llama_sampler_chain_add(chain_, llama_sampler_init_penalties(n_vocab, (int32_t)last_n, (float)repeat_penalty,
                                                                         (float)freq_penalty, (float)presence_penalty));
        }
        n_shaping_ = llama_sampler_chain_n(chain_);
        // Plain greedy needs no candidate array: an argmax over the logits row gives the same
        // token as llama.cpp's greedy sampler (first maximum wins) at a fraction of the cost.
        fast_greedy_ = temperature <= 0.0 && n_shaping_ == 0 && n_logprobs_ < 0;
        if (temperature <= 0.0) {
            llama_sampler_chain_add(chain_, llama_sampler_init_greedy());
        } else {
            if (top_k > 0) llama_sampler_chain_add(chain_, llama_sampler_init_top_k((int32_t)top_k));
            if (top_p < 1.0) llama_sampler_chain_add(chain_, llama_sampler_init_top_p((float)top_p, 1));
            if (min_p > 0.0) llama_sampler_chain_add(chain_, llama_sampler_init_min_p((float)min_p, 1));
            llama_sampler_chain_add(chain_, llama_sampler_init_temp((float)temperature));
            llama_sampler_chain_add(chain_, llama_sampler_init_dist((uint32_t)seed));
        }
    }
    ~Sampler() { close(); }

    void close() {
        if (chain_ != nullptr) {
            llama_sampler_free(chain_);
            chain_ = nullptr;
            budget_ = nullptr;
            grammar_ = nullptr;
            bias_ = nullptr;
        }
    }

    llama_token sample(Context & ctx, int idx) {
        if (chain_ == nullptr) throw NativeError("the sampler has been freed");
        llama_context * c = ctx.get();
        if (idx < 0 || (uint32_t)idx >= ctx.n_batch) throw py::value_error("sample: output index out of range");
        if (fast_greedy_) {
            const llama_token t = argmax(c, idx);
            ++n_sampled_;
            return t;
        }
        const float * logits = llama_get_logits_ith(c, idx);
        if (logits == nullptr) throw py::value_error("sample: no logits at output row " + std::to_string(idx));
        llama_token t = LLAMA_TOKEN_NULL;
        bool threw = false;
        std::string what, refused;
        {
            py::gil_scoped_release release;
            try {
                t = sample_row(logits);
                if (t == LLAMA_TOKEN_NULL) refused = dead_end(logits);
            } catch (const std::exception & e) {
                threw = true;
                what = e.what();
            }
        }
        if (threw) throw NativeError(std::string("sampling failed: ") + what);
        if (t == LLAMA_TOKEN_NULL) throw py::value_error(refused);
        ++n_sampled_;
        return t;
    }

    // The last sampled token's logprob and its top alternatives [(id, logprob)], most likely
    // first (tokens of probability 0 left out); None without `logprobs`.
    py::object last_logprobs() const {
        if (n_logprobs_ < 0) return py::none();
        return py::make_tuple(last_logprob_, last_top_);
    }

    void accept(llama_token t) {
        if (chain_ == nullptr) throw NativeError("the sampler has been freed");
        model->check_token(t);
        llama_sampler_accept(chain_, t);
    }

    void reset() {
        if (chain_ != nullptr) llama_sampler_reset(chain_);
        n_sampled_ = 0;
    }

    // idle, counting, waiting_utf8, forcing or done (llama.cpp's states); None without a budget
    py::object budget_state() const {
        if (budget_ == nullptr) return py::none();
        switch (common_reasoning_budget_get_state(budget_)) {
            case REASONING_BUDGET_IDLE: return py::str("idle");
            case REASONING_BUDGET_COUNTING: return py::str("counting");
            case REASONING_BUDGET_WAITING_UTF8: return py::str("waiting_utf8");
            case REASONING_BUDGET_FORCING: return py::str("forcing");
            case REASONING_BUDGET_DONE: return py::str("done");
        }
        return py::str("unknown");
    }

    std::shared_ptr<Model> model;

private:
    // llama_sampler_sample's CPU path, with one check before the chain accepts the token:
    // when every candidate was ruled out (each logit -inf), llama.cpp's samplers still pick
    // one, and the grammar then aborts the process accepting it. Returns LLAMA_TOKEN_NULL
    // instead, accepting nothing.
    llama_token sample_row(const float * logits) {
        llama_token_data_array arr = candidates(logits);
        const int n = llama_sampler_chain_n(chain_);
        for (int i = 0; i < n; ++i) {
            if (i == n_shaping_ && n_logprobs_ >= 0) tap(arr);
            llama_sampler_apply(llama_sampler_chain_get(chain_, i), &arr);
        }
        if (arr.selected < 0 || (size_t)arr.selected >= arr.size || !std::isfinite(arr.data[arr.selected].logit)) {
            return grammar_complete() ? llama_vocab_eos(model->vocab()) : LLAMA_TOKEN_NULL;
        }
        const llama_token t = arr.data[arr.selected].id;
        if (n_logprobs_ >= 0) last_logprob_ = shaped_[t] - log_norm_;
        llama_sampler_accept(chain_, t);
        return t;
    }

    bool ban_eog() const { return ignore_eos_ || n_sampled_ < min_tokens_; }

    // Every token with its logit (end-of-generation tokens banned while ban_eog()), in cur_.
    llama_token_data_array candidates(const float * logits) {
        const int n_vocab = llama_vocab_n_tokens(model->vocab());
        cur_.resize(n_vocab);
        for (llama_token t = 0; t < n_vocab; ++t) cur_[t] = llama_token_data{t, logits[t], 0.0f};
        if (ban_eog()) {
            for (llama_token t : eog_) cur_[t].logit = -INFINITY;
        }
        return llama_token_data_array{cur_.data(), cur_.size(), -1, false};
    }

    // Why sample_row found no token, as "<part>: <why>": the part of the request that ruled
    // the last candidates out (the engine names the option from it). The shaping is run again
    // over the same logits without logit_bias: tokens left then were banned by the bias;
    // none left, the grammar allowed none.
    std::string dead_end(const float * logits) {
        const std::string none = "no token can continue the text so far";
        const std::string eog = ban_eog() ? " (ignore_eos / min_tokens ban the end-of-generation tokens)" : "";
        bool not_finite = false;
        shaped_left(logits, nullptr, not_finite);
        if (not_finite) return "sampler: the shaped logits are not finite (inf or nan), so no token can be picked";
        if (bias_ != nullptr && shaped_left(logits, bias_, not_finite) > 0) {
            return "logit_bias: " + none + ": logit_bias bans every token" +
                   (grammar_ != nullptr ? " the grammar allows here" : "") + eog;
        }
        if (grammar_ != nullptr) return "grammar: " + none + ": the grammar allows no token here" + eog;
        return "sampler: " + none + ": every candidate was ruled out" + eog;
    }

    // Candidates with a finite logit after the shaping samplers but `skip` (not_finite: some
    // logit is +inf or nan). Shaping only filters or shifts logits; nothing is accepted.
    size_t shaped_left(const float * logits, const llama_sampler * skip, bool & not_finite) {
        llama_token_data_array arr = candidates(logits);
        for (int i = 0; i < n_shaping_; ++i) {
            llama_sampler * s = llama_sampler_chain_get(chain_, i);
            if (s != skip) llama_sampler_apply(s, &arr);
        }
        size_t left = 0;
        for (size_t i = 0; i < arr.size; ++i) {
            const float l = arr.data[i].logit;
            if (std::isnan(l) || l == INFINITY) not_finite = true;
            left += std::isfinite(l) ? 1 : 0;
        }
        return left;
    }

    // The shaped logits (by id), their log-normaliser and the top alternatives: the
    // log-softmax the logprobs are read from.
    void tap(const llama_token_data_array & arr) {
        shaped_.assign(llama_vocab_n_tokens(model->vocab()), -INFINITY);
        float top = -INFINITY;
        for (size_t i = 0; i < arr.size; ++i) {
            shaped_[arr.data[i].id] = arr.data[i].logit;
            top = std::max(top, arr.data[i].logit);
        }
        log_norm_ = 0.0f;
        last_top_.clear();
        if (!std::isfinite(top)) return;
        double sum = 0.0;  // float exp (the cost), double sum (49,152 terms)
        for (size_t i = 0; i < arr.size; ++i) sum += std::exp(arr.data[i].logit - top);
        log_norm_ = top + (float)std::log(sum);
        if (n_logprobs_ > 0) top_n(arr);
    }

    // The n_logprobs_ largest finite logits, largest first; equal logits by id, so the order
    // is reproducible. A short sorted list for the option's few (at most 20); a partial sort
    // for more (the native tests ask for the whole vocabulary).
    void top_n(const llama_token_data_array & arr) {
        using Entry = std::pair<float, llama_token>;
        auto before = [](const Entry & a, const Entry & b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
        const size_t k = (size_t)n_logprobs_;
        std::vector<Entry> best;
        best.reserve(k > 64 ? arr.size : k + 1);
        for (size_t i = 0; i < arr.size; ++i) {
            const Entry e{arr.data[i].logit, arr.data[i].id};
            if (!std::isfinite(e.first)) continue;
            if (k > 64) {
                best.push_back(e);
            } else if (best.size() < k || before(e, best.back())) {
                best.insert(std::upper_bound(best.begin(), best.end(), e, before), e);
                if (best.size() > k) best.pop_back();
            }
        }
        if (k > 64) {
            const size_t m = std::min(k, best.size());
            std::partial_sort(best.begin(), best.begin() + (long)m, best.end(), before);
            best.resize(m);
        }
        for (const Entry & e : best) last_top_.emplace_back(e.second, e.first - log_norm_);
    }

    // Would the grammar end here (its end-of-generation token allowed)? Only the ban on
    // end-of-generation tokens (ignore_eos, min_tokens) can then have ruled every candidate
    // out; the request ends as if the model had stopped.
    bool grammar_complete() {
        const llama_token eos = llama_vocab_eos(model->vocab());
        if (grammar_ == nullptr || !ban_eog() || eos == LLAMA_TOKEN_NULL) return false;
        llama_token_data one{eos, 0.0f, 0.0f};
        llama_token_data_array arr{&one, 1, -1, false};
        llama_sampler_apply(grammar_, &arr);
        return std::isfinite(one.logit);
    }

    llama_token argmax(llama_context * c, int idx) {
        const float * logits = llama_get_logits_ith(c, idx);
        if (logits == nullptr) throw py::value_error("sample: no logits at output row " + std::to_string(idx));
        const llama_vocab * vocab = model->vocab();
        const int n_vocab = llama_vocab_n_tokens(vocab);
        const bool ban = ban_eog();
        llama_token best = -1;
        float best_logit = -INFINITY;
        for (llama_token t = 0; t < n_vocab; ++t) {
            if (logits[t] > best_logit && !(ban && llama_vocab_is_eog(vocab, t))) {
                best_logit = logits[t];
                best = t;
            }
        }
        return best < 0 ? 0 : best;
    }

    void add_reasoning_budget(const py::dict & rb) {
        auto tokens = [&](const char * key) {
            auto ids = rb.contains(key) ? rb[key].cast<llama_tokens>() : llama_tokens{};
            for (llama_token t : ids) model->check_token(t);
            return ids;
        };
        const llama_tokens start = tokens("start"), end = tokens("end"), forced = tokens("forced");
        const bool inside = rb.contains("inside") && rb["inside"].cast<bool>();
        const long long budget = rb["budget"].cast<long long>();
        if (end.empty() || forced.empty()) throw py::value_error("reasoning_budget: the end marker has no tokens");
        if (budget < 0 || budget > INT32_MAX) throw py::value_error("reasoning_budget: budget out of range");
        std::vector<llama_tokens> starts;
        if (!start.empty()) starts.push_back(start);
        // inside: the prompt opened the block, so the count starts at the first generated token
        budget_ = common_reasoning_budget_init(model->vocab(), starts, {end}, forced, (int32_t)budget,
                                               inside ? REASONING_BUDGET_COUNTING : REASONING_BUDGET_IDLE);
        if (budget_ == nullptr) throw NativeError("could not create the reasoning-budget sampler");
        llama_sampler_chain_add(chain_, budget_);   // the chain owns it from here
    }

    std::vector<llama_token_data> cur_;  // the candidate array, reused across tokens
    std::vector<llama_token> eog_;       // the vocabulary's end-of-generation tokens
    std::vector<float> shaped_;          // logprobs: the shaped logits by id (tap)
    std::vector<std::pair<llama_token, float>> last_top_;
    float log_norm_ = 0.0f, last_logprob_ = 0.0f;
    long long n_logprobs_ = -1;          // alternatives per token; -1: no logprobs
    long long min_tokens_ = 0;
    long long n_sampled_ = 0;
    int n_shaping_ = 0;                  // the chain's first samplers that shape, not pick
    llama_sampler * chain_ = nullptr;
    llama_sampler * budget_ = nullptr;  // owned by chain_
    llama_sampler * grammar_ = nullptr;  // owned by chain_
    llama_sampler * bias_ = nullptr;     // owned by chain_
    bool has_budget_ = false;
    bool fast_greedy_ = false;
    bool ignore_eos_ = false;
};

}  // namespace

void bind_sampler(py::module_ & m) {
    py::class_<Sampler, std::shared_ptr<Sampler>>(m, "Sampler")
        .def(py::init<std::shared_ptr<Model>, const py::dict &>(), py::arg("model"), py::arg("params"))
        .def("sample", &Sampler::sample, py::arg("ctx"), py::arg("idx"),
             "Sample (and accept) a token from output row idx of the last decode.")
        .def("accept", &Sampler::accept, py::arg("token"),
             "Feed a token the sampler did not choose (e.g. prompt tokens for penalties).")
        .def("reset", &Sampler::reset)
        .def("last_logprobs", &Sampler::last_logprobs,
             "The last sampled token's logprob and its top alternatives [(id, logprob)]; None without logprobs.")
        .def_property_readonly("budget_state", &Sampler::budget_state,
                               "The reasoning-budget sampler's state, None without one.")
        .def("close", &Sampler::close);
}

}  // namespace wb
