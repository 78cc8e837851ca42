// Embeddings on a context of their own (embeddings=true, one pooling type), never through
// the generation loop: one call packs several sequences into each llama_decode (llama.cpp
// routes memory-less encoders such as BERT to its encoder) and reads each sequence's pooled
// vector with llama_get_embeddings_seq, or every token's row when pooling is 'none'.
#include "native.h"

#include <pybind11/stl.h>

#include <cmath>
#include <mutex>

#include "common.h"

namespace wb {

namespace {

enum llama_pooling_type parse_pooling(const std::string & name) {
    if (name == "mean") return LLAMA_POOLING_TYPE_MEAN;
    if (name == "cls") return LLAMA_POOLING_TYPE_CLS;
    if (name == "last") return LLAMA_POOLING_TYPE_LAST;
    if (name == "none") return LLAMA_POOLING_TYPE_NONE;
    throw py::value_error("option pooling: '" + name + "' is not one of 'mean', 'cls', 'last', 'none'");
}

}  // namespace

class Embedder {
public:
    Embedder(std::shared_ptr<Model> model_, const std::string & pooling_name, uint32_t n_ctx_, uint32_t n_seq_max_,
             int n_threads)
        : model(std::move(model_)), pooling(pooling_name) {
        llama_model * lm = model->get();
        if (llama_model_has_encoder(lm) && llama_model_has_decoder(lm)) {
            throw py::value_error("embeddings from encoder-decoder models are not supported");
        }
        if (n_ctx_ == 0) throw py::value_error("n_ctx must be positive");
        if (n_seq_max_ == 0 || n_seq_max_ > llama_max_parallel_sequences()) {
            throw py::value_error("n_seq_max " + std::to_string(n_seq_max_) + " is outside [1, " +
                                  std::to_string(llama_max_parallel_sequences()) + "]");
        }
        if (n_threads <= 0) throw py::value_error("n_threads must be positive");
        llama_context_params cp = llama_context_default_params();
        cp.embeddings = true;
        cp.pooling_type = parse_pooling(pooling_name);
        // a sequence must sit in one micro-batch for non-causal attention and for pooling
        cp.n_ctx = n_ctx_;
        cp.n_batch = n_ctx_;
        cp.n_ubatch = n_ctx_;
        cp.n_seq_max = n_seq_max_;
        cp.kv_unified = true;
        cp.n_threads = n_threads;
        cp.n_threads_batch = n_threads;
        cp.no_perf = true;
        ctx_ = init_context(lm, cp, "an embedding context");
        n_ctx = llama_n_ctx(ctx_);
        n_batch = std::min<uint32_t>(llama_n_batch(ctx_), llama_n_ubatch(ctx_));
        n_seq_max = llama_n_seq_max(ctx_);
        n_embd = llama_model_n_embd_out(lm);
        batch_ = llama_batch_init((int32_t)n_batch, 0, 1);
    }

    ~Embedder() { close(); }

    void close() {
        std::lock_guard<std::mutex> lock(mutex_);
        if (ctx_ != nullptr) {
            llama_batch_free(batch_);
            batch_ = llama_batch{};
            llama_free(ctx_);
            ctx_ = nullptr;
        }
    }

    bool closed() const { return ctx_ == nullptr; }

    // One vector per input (pooled), or one list of token vectors per input (pooling 'none').
    py::list embed(const std::vector<std::vector<llama_token>> & inputs, bool normalize) {
        if (ctx_ == nullptr) throw NativeError("the embedding context has been freed");
        if (model->closed()) throw NativeError("the model has been freed");
        const int n_vocab = llama_vocab_n_tokens(model->vocab());
        for (size_t i = 0; i < inputs.size(); ++i) {
            const auto & toks = inputs[i];
            if (toks.empty()) throw py::value_error("input " + std::to_string(i) + " has no tokens");
            if (toks.size() > n_batch) {
                throw py::value_error("input " + std::to_string(i) + " has " + std::to_string(toks.size()) +
                                      " tokens but the embedding context holds " + std::to_string(n_batch));
            }
            for (llama_token t : toks) {
                if (t < 0 || t >= n_vocab) {
                    throw py::value_error("input " + std::to_string(i) + ": token id " + std::to_string(t) +
                                          " is outside the vocabulary");
                }
            }
        }
        const bool pooled = pooling != "none";
        // per input: pooled -> one row; 'none' -> one row per token
        std::vector<std::vector<std::vector<float>>> rows(inputs.size());
        std::string error;
        {
            py::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(mutex_);
            try {
                size_t next = 0;
                while (next < inputs.size()) {
                    const size_t first = next;
                    uint32_t n_tokens = 0;
                    while (next < inputs.size() && next - first < n_seq_max &&
                           n_tokens + inputs[next].size() <= n_batch) {
                        n_tokens += (uint32_t)inputs[next].size();
                        ++next;
                    }
                    run_batch(inputs, first, next, pooled, normalize, rows);
                }
            } catch (const std::exception & e) {
                error = e.what();
            }
        }
        if (!error.empty()) throw NativeError(error);
        py::list out;
        for (auto & per_input : rows) {
            if (pooled) {
                out.append(py::cast(per_input[0]));
            } else {
                out.append(py::cast(per_input));
            }
        }
        return out;
    }

    std::shared_ptr<Model> model;
    std::string pooling;
    uint32_t n_ctx = 0, n_batch = 0, n_seq_max = 0;
    int n_embd = 0;

private:
    void run_batch(const std::vector<std::vector<llama_token>> & inputs, size_t first, size_t last, bool pooled,
                   bool normalize, std::vector<std::vector<std::vector<float>>> & rows) {
        llama_memory_t mem = llama_get_memory(ctx_);
        if (mem != nullptr) llama_memory_clear(mem, true);
        int32_t n = 0;
        for (size_t i = first; i < last; ++i) {
            const llama_seq_id seq = (llama_seq_id)(i - first);
            for (size_t p = 0; p < inputs[i].size(); ++p) {
                batch_.token[n] = inputs[i][p];
                batch_.pos[n] = (llama_pos)p;
                batch_.n_seq_id[n] = 1;
                batch_.seq_id[n][0] = seq;
                batch_.logits[n] = true;
                ++n;
            }
        }
        batch_.n_tokens = n;
        const int rc = llama_decode(ctx_, batch_);
        if (rc != 0) throw std::runtime_error("llama_decode failed with code " + std::to_string(rc) + " while embedding");
        int32_t row = 0;
        for (size_t i = first; i < last; ++i) {
            if (pooled) {
                const float * v = llama_get_embeddings_seq(ctx_, (llama_seq_id)(i - first));
                if (v == nullptr) throw std::runtime_error("llama.cpp returned no pooled embedding");
                rows[i].push_back(finish(v, normalize));
                row += (int32_t)inputs[i].size();
            } else {
                for (size_t p = 0; p < inputs[i].size(); ++p, ++row) {
                    const float * v = llama_get_embeddings_ith(ctx_, row);
                    if (v == nullptr) throw std::runtime_error("llama.cpp returned no token embedding");
                    rows[i].push_back(finish(v, normalize));
                }
            }
        }
    }

    std::vector<float> finish(const float * v, bool normalize) const {
        std::vector<float> out(n_embd);
        if (normalize) {
            common_embd_normalize(v, out.data(), n_embd, 2);  // 2 = euclidean (L2)
        } else {
            std::copy(v, v + n_embd, out.begin());
        }
        return out;
    }

    llama_context * ctx_ = nullptr;
    llama_batch batch_{};
    std::mutex mutex_;
};

void bind_embed(py::module_ & m) {
    py::class_<Embedder, std::shared_ptr<Embedder>>(m, "Embedder")
        .def(py::init<std::shared_ptr<Model>, const std::string &, uint32_t, uint32_t, int>(), py::arg("model"),
             py::arg("pooling") = "mean", py::arg("n_ctx") = 2048, py::arg("n_seq_max") = 16, py::arg("n_threads") = 4)
        .def("embed", &Embedder::embed, py::arg("inputs"), py::arg("normalize") = true,
             "Embed several token lists, packed into as few llama_decode calls as fit (GIL released).")
        .def("close", &Embedder::close)
        .def_property_readonly("closed", &Embedder::closed)
        .def_readonly("pooling", &Embedder::pooling)
        .def_readonly("n_ctx", &Embedder::n_ctx)
        .def_readonly("n_batch", &Embedder::n_batch)
        .def_readonly("n_seq_max", &Embedder::n_seq_max)
        .def_readonly("n_embd", &Embedder::n_embd);
}

}  // namespace wb
