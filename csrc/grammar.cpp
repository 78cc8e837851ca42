// Grammars: GBNF parsed once into a prototype sampler, and JSON schema -> GBNF through
// llama.cpp common's own converter (not a hand-written one).
#include "native.h"

#include "json-schema-to-grammar.h"
#include "json.h"

#include <algorithm>
#include <cmath>

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

// Skip a GBNF literal or character class starting at text[i] ('"' or '['); returns the index
// of its closing character (or text.size()).
static size_t skip_quoted(const std::string & text, size_t i) {
    const char close = text[i] == '"' ? '"' : ']';
    for (++i; i < text.size() && text[i] != close; ++i) {
        if (text[i] == '\\') ++i;
    }
    return i;
}

// A repetition "{m}", "{m,}" or "{m,n}" at text[i] == '{': llama.cpp generates n - m optional
// rules with unsigned arithmetic, so n < m wraps and it allocates rules without end. Throws
// for n < m; anything else malformed is left to llama.cpp's parser (it reports it cleanly).
static void check_repetition(const std::string & text, size_t i) {
    auto skip_space = [&](size_t j) {
        while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) ++j;
        return j;
    };
    auto number = [&](size_t & j, uint64_t & out) {
        const size_t from = j;
        out = 0;
        for (; j < text.size() && text[j] >= '0' && text[j] <= '9'; ++j) {
            out = out > UINT64_MAX / 10 - 9 ? UINT64_MAX : out * 10 + (uint64_t)(text[j] - '0');
        }
        return j > from;
    };
    size_t j = skip_space(i + 1);
    uint64_t lo = 0, hi = 0;
    if (!number(j, lo)) return;
    j = skip_space(j);
    if (j >= text.size() || text[j] != ',') return;
    j = skip_space(j + 1);
    if (!number(j, hi)) return;  // "{m,}": no maximum
    if (hi < lo) {
        const size_t end = text.find('}', j);
        throw py::value_error("option grammar: the repetition '" + text.substr(i, end == std::string::npos ? j - i : end + 1 - i) +
                              "' at byte " + std::to_string(i) + " has its minimum " + std::to_string(lo) +
                              " above its maximum " + std::to_string(hi));
    }
}

// Group nesting, rule count and repetition bounds of a GBNF text, outside its literals,
// character classes and comments: llama.cpp parses groups and follows leading rule
// references recursively, and loops without end on a repetition whose maximum is below
// its minimum.
static void check_grammar_size(const std::string & text) {
    size_t depth = 0, deepest = 0, rules = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (c == '#') {
            while (i < text.size() && text[i] != '\n' && text[i] != '\r') ++i;
        } else if (c == '"' || c == '[') {
            i = skip_quoted(text, i);
        } else if (c == '{') {
            check_repetition(text, i);
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

size_t viable_tokens(llama_sampler * grammar, const llama_vocab * vocab, std::vector<llama_token_data> & cur) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    cur.resize(n_vocab);
    for (llama_token t = 0; t < n_vocab; ++t) cur[t] = llama_token_data{t, 0.0f, 0.0f};
    llama_token_data_array arr{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(grammar, &arr);
    size_t n = 0;
    for (size_t i = 0; i < arr.size; ++i) n += std::isfinite(arr.data[i].logit) ? 1 : 0;
    return n;
}

// A grammar no token can begin (e.g. 'root ::= "\\x00"': llama.cpp never matches a piece
// holding NUL) is refused here; generating under it would leave the sampler no token.
static void check_some_token_starts(llama_sampler * proto, const llama_vocab * vocab) {
    std::vector<llama_token_data> cur;
    bool threw = false;
    size_t n = 0;
    {
        py::gil_scoped_release release;
        try {
            n = viable_tokens(proto, vocab, cur);
        } catch (const std::exception &) {
            threw = true;
        }
    }
    if (threw || n == 0) {
        throw py::value_error("option grammar: no token of the model's vocabulary can begin a text the grammar "
                              "accepts (nothing could be generated under it)");
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
    try {
        check_some_token_starts(proto_, vocab);
    } catch (...) {
        llama_sampler_free(proto_);
        proto_ = nullptr;
        throw;
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

// Lower/upper bound pairs of a JSON schema, anywhere in it. llama.cpp's converter turns the
// length and count pairs into GBNF repetitions without comparing them (a minimum above the
// maximum makes llama.cpp's grammar parser loop without end), and an integer range whose
// minimum is above its maximum into a grammar nothing satisfies.
static void check_schema_bounds(const common_json & schema) {
    static const char * const pairs[][2] = {{"minLength", "maxLength"}, {"minItems", "maxItems"},
                                           {"minProperties", "maxProperties"}, {"minimum", "maximum"}};
    std::vector<const common_json *> todo{&schema};
    while (!todo.empty()) {
        const common_json & node = *todo.back();
        todo.pop_back();
        if (node.is_object()) {
            for (const auto & pair : pairs) {
                if (!node.contains(pair[0]) || !node.contains(pair[1])) continue;
                const common_json & lo = node.at(pair[0]), & hi = node.at(pair[1]);
                if (lo.is_number() && hi.is_number() && lo.get<double>() > hi.get<double>()) {
                    throw std::invalid_argument(std::string(pair[0]) + " " + lo.dump() + " is above " + pair[1] +
                                                " " + hi.dump());
                }
            }
        }
        if (node.is_object()) {
            for (const auto & [key, child] : node.items()) {
                // values given as data, not subschemas
                if (key != "enum" && key != "const" && key != "default" && key != "examples") todo.push_back(&child);
            }
        } else if (node.is_array()) {
            for (auto it = node.begin(); it != node.end(); ++it) todo.push_back(&*it);
        }
    }
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
            check_schema_bounds(schema);
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
