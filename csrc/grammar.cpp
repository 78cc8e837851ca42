// Grammars: GBNF parsed once into a prototype sampler, and JSON schema -> GBNF through
// llama.cpp common's own converter (not a hand-written one).
#include "native.h"

#include "json-schema-to-grammar.h"
#include "json.h"

namespace wb {

Grammar::Grammar(std::shared_ptr<Model> model_, const std::string & text_, const std::string & root)
    : model(std::move(model_)), text(text_) {
    if (text.empty()) throw py::value_error("option grammar: empty grammar");
    const llama_vocab * vocab = model->vocab();
    {
        py::gil_scoped_release release;
        clear_recent_log();
        try {
            proto_ = llama_sampler_init_grammar(vocab, text.c_str(), root.c_str());
        } catch (const std::exception &) {
            proto_ = nullptr;
        }
    }
    if (proto_ == nullptr) {
        std::string why = recent_log();
        throw py::value_error("option grammar: llama.cpp could not parse the grammar" +
                              (why.empty() ? std::string() : ": " + why));
    }
}

Grammar::~Grammar() {
    if (proto_ != nullptr) llama_sampler_free(proto_);
}

llama_sampler * Grammar::clone() const {
    llama_sampler * s = llama_sampler_clone(proto_);
    if (s == nullptr) throw NativeError("could not clone the grammar sampler");
    return s;
}

static std::string schema_to_grammar(const std::string & schema_text) {
    std::string out, error;
    {
        py::gil_scoped_release release;
        try {
            const common_json schema = common_json::parse(schema_text);
            out = json_schema_to_grammar(schema);
        } catch (const std::exception & e) {
            error = e.what();
        }
    }
    if (!error.empty()) throw py::value_error("option json_schema: " + error);
    return out;
}

void bind_grammar(py::module_ & m) {
    m.def("json_schema_to_grammar", &schema_to_grammar, py::arg("schema_json"),
          "GBNF for a JSON schema (given as JSON text), by llama.cpp common's converter.");
    py::class_<Grammar, std::shared_ptr<Grammar>>(m, "Grammar")
        .def(py::init<std::shared_ptr<Model>, const std::string &, const std::string &>(), py::arg("model"),
             py::arg("text"), py::arg("root") = "root")
        .def_readonly("text", &Grammar::text);
}

}  // namespace wb
