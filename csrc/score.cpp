// Scoring: the log-probability of given tokens at decoded output rows, read from the raw
// logits of the last decode (no sampler: no temperature, penalties or bias), as
// llama.cpp's perplexity tool computes it (tools/perplexity: log_softmax, the maximum
// subtracted, the normaliser summed in double). With it, each row's rank of the token
// (1 = the argmax; ties count for the token) and its `top` most likely alternatives.
#include "native.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace wb {

namespace {

struct RowScore {
    double logprob = 0.0;
    int32_t rank = 0;
};

// One row's log-softmax at `target`: logit - max - log(sum exp(logit - max)).
RowScore score_row(const float * logits, int n_vocab, llama_token target, double & log_norm) {
    float max_logit = logits[0];
    for (int t = 1; t < n_vocab; ++t) max_logit = std::max(max_logit, logits[t]);
    double sum = 0.0;
    for (int t = 0; t < n_vocab; ++t) sum += std::exp(double(logits[t] - max_logit));
    log_norm = double(max_logit) + std::log(sum);
    RowScore out;
    out.logprob = double(logits[target]) - log_norm;
    const float own = logits[target];
    int32_t above = 0;
    for (int t = 0; t < n_vocab; ++t) above += logits[t] > own;
    out.rank = above + 1;
    return out;
}

// The `k` largest logits of a row, largest first; equal logits by id.
void top_k(const float * logits, int n_vocab, int k, double log_norm, int32_t * ids, float * lps,
           std::vector<int32_t> & order) {
    order.resize(n_vocab);
    std::iota(order.begin(), order.end(), 0);
    auto better = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
    for (int i = 0; i < k; ++i) {
        ids[i] = order[i];
        lps[i] = float(double(logits[order[i]]) - log_norm);
    }
}

py::tuple score_rows(Context & self, const std::vector<int32_t> & rows, const std::vector<llama_token> & targets,
                     int top) {
    if (rows.size() != targets.size()) throw py::value_error("score_rows: rows and targets differ in length");
    const int n_vocab = llama_vocab_n_tokens(self.model->vocab());
    if (top < 0 || top > n_vocab) throw py::value_error("score_rows: top must be in [0, n_vocab]");
    llama_context * c = self.get();
    const auto n = static_cast<py::ssize_t>(rows.size());
    py::array_t<double> logprob(n);
    py::array_t<int32_t> rank(n);
    py::array_t<int32_t> top_ids({n, static_cast<py::ssize_t>(top)});
    py::array_t<float> top_lp({n, static_cast<py::ssize_t>(top)});
    std::vector<const float *> row_logits(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
        if (targets[i] < 0 || targets[i] >= n_vocab) {
            throw py::value_error("score_rows: token id " + std::to_string(targets[i]) + " outside the vocabulary");
        }
        row_logits[i] = llama_get_logits_ith(c, rows[i]);
        if (row_logits[i] == nullptr) throw py::value_error("score_rows: no logits at output row " + std::to_string(rows[i]));
    }
    double * lp = logprob.mutable_data();
    int32_t * rk = rank.mutable_data();
    int32_t * ti = top_ids.mutable_data();
    float * tl = top_lp.mutable_data();
    {
        py::gil_scoped_release release;
        std::vector<int32_t> order;
        for (size_t i = 0; i < rows.size(); ++i) {
            double log_norm = 0.0;
            const RowScore s = score_row(row_logits[i], n_vocab, targets[i], log_norm);
            lp[i] = s.logprob;
            rk[i] = s.rank;
            if (top > 0) top_k(row_logits[i], n_vocab, top, log_norm, ti + i * top, tl + i * top, order);
        }
    }
    return py::make_tuple(logprob, rank, top_ids, top_lp);
}

}  // namespace

void bind_score(py::module_ & m) {
    m.def("score_rows", &score_rows, py::arg("ctx"), py::arg("rows"), py::arg("targets"), py::arg("top") = 0,
          "Log-probability (float64, the raw logits' log-softmax) of targets[i] at output row rows[i] of the "
          "context's last decode, its rank (1 = argmax) and the top most likely ids and their logprobs "
          "(float32, shape (n, top)).");
}

}  // namespace wb
