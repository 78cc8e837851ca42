// Grammars: GBNF parsed once into a prototype sampler, and JSON schema -> GBNF through
// llama.cpp common's own converter (not a hand-written one).
#include "native.h"

#include "json-schema-to-grammar.h"
#include "json.h"

#include <algorithm>

namespace wb {

size_t nesting_depth(const std::string & text, const char * pairs, bool json_strings) {
    size_t depth = 0, deepest = 0;
    const std::string p(pairs);
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (json_strings && c == '"') {
            for (++i; i < text.size() && text[i] != '"'; ++i) {
                if (text[i] == '\\') ++i;
            }
            continue;
        }
        const size_t at = p.find(c);
        if (at == std::string::npos) continue;
        if (at % 2 == 0) {
            deepest = std::max(deepest, ++depth);
        } else if (depth > 0) {
            --depth;
        }
    }
    return deepest;
}

// Group nesting and rule count of a GBNF text, outside its literals, character classes and
// comments: llama.cpp parses groups and follows leading rule references recursively.
static void check_grammar_size(const std::string & text) {
    size_t depth = 0, deepest = 0, rules = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '#') {
            while (i < text.size() && text[i] != '\n' && text[i] != '\r') ++i;
        } else if (c == '"' || c == '[') {
            const char close = c == '"' ? '"' : ']';
            for (++i; i < text.size() && text[i] != close; ++i) {
                if (text[i] == '\\') ++i;
            }
        } else if (c == '(') {
            deepest = std::max(deepest, ++depth);
        } else if (c == ')' && depth > 0) {
            --depth;
        } else if (c == ':' && text.compare(i, 3, "::=") == 0) {
            ++rules;
            i += 2;
        }
    }
    if (deepest > MAX_NESTING) {
        throw py::value_error("option grammar: groups nested " + std::to_string(deepest) + " deep; at most " +
                              std::to_string(MAX_NESTING) + " (llama.cpp parses them recursively)");
    }
    if (rules > MAX_GRAMMAR_RULES) {
        throw py::value_error("option grammar: " + std::to_string(rules) + " rules; at most " +
                              std::to_string(MAX_GRAMMAR_RULES) + " (llama.cpp follows rule chains recursively)");
    }
}

Grammar::Grammar(std::shared_ptr<Model> model_, const std::string & text_, const std::string & root)
    : model(std::move(model_)), text(text_) {
    if (text.empty()) throw py::value_error("option grammar: empty grammar");
    check_grammar_size(text);
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
            if (nesting_depth(schema_text, "[]{}", true) > 2 * MAX_NESTING) {
                throw std::invalid_argument("the schema is nested more than " + std::to_string(2 * MAX_NESTING) +
                                            " levels of JSON deep");
            }
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
