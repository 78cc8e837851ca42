// Grammars: GBNF parsed once into a prototype sampler, and JSON schema -> GBNF through
// llama.cpp common's own converter (not a hand-written one).
#include "native.h"

#include "json-schema-to-grammar.h"
#include "json.h"
// llama.cpp's own grammar parser and match stacks (its internal API, as its tests use it; the
// tree is pinned): the stack bound below counts what llama.cpp itself builds.
#include "../vendor/llama.cpp/src/llama-grammar.h"

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

// llama.cpp matches a grammar by keeping every parse stack the text so far allows; each
// token costs stacks x vocabulary, and a stack advanced past a character is expanded into
// every stack its rule references can begin (llama_grammar_advance_stack). Nested or
// ambiguous repetitions ('root ::= sub{0,100}', 'sub ::= "a"{0,100}') make both grow with
// the product of the counts: 1.3 s a token at 100, 27 s at 200. Normal grammars (llama.cpp's
// grammars/, the converter's schemas, 20 optional properties) peak at 25 of either.
static constexpr uint64_t MAX_GRAMMAR_EXPANSION = 256;  // stacks one position can begin
static constexpr size_t MAX_GRAMMAR_STACKS = 256;       // stacks alive along the probed text
static constexpr int STACK_PROBE_CHARS = 64;             // characters the probe follows

// How many stacks each rule can begin (paths through its nullable prefixes), and the most
// any position of any rule can; over llama.cpp's parsed rules, saturating.
class Expansion {
public:
    explicit Expansion(const llama_grammar_rules & rules)
        : rules_(rules), begins_(rules.size()), state_(rules.size()), nullable_(rules.size()) {}

    // The most stacks one position expands into; 0 for a left-recursive grammar (llama.cpp
    // refuses it with its own message).
    uint64_t worst() {
        for (uint32_t id = 0; id < rules_.size(); ++id) visit(id);
        if (cycle_) return 0;
        uint64_t most = 0;
        bool nullable = false;
        for (const auto & rule : rules_) {
            for (size_t i = 0; i < rule.size(); ++i) most = std::max(most, from(rule, i, nullable));
        }
        return most;
    }

private:
    static uint64_t add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
    static bool ends(const llama_grammar_element & e) { return e.type == LLAMA_GRETYPE_END || e.type == LLAMA_GRETYPE_ALT; }
    static bool matches(const llama_grammar_element & e) {
        return e.type == LLAMA_GRETYPE_CHAR || e.type == LLAMA_GRETYPE_CHAR_NOT || e.type == LLAMA_GRETYPE_CHAR_ANY ||
               e.type == LLAMA_GRETYPE_TOKEN || e.type == LLAMA_GRETYPE_TOKEN_NOT;
    }

    // Stacks begun from element i to the end of its alternative; nullable: all of it may be empty.
    uint64_t from(const llama_grammar_rule & rule, size_t i, bool & nullable) {
        uint64_t total = 0;
        nullable = false;
        for (; i < rule.size() && !ends(rule[i]); ++i) {
            const llama_grammar_element & e = rule[i];
            if (matches(e)) return add(total, 1);
            if (e.type != LLAMA_GRETYPE_RULE_REF) continue;  // the rest of a character class
            if (e.value >= rules_.size()) return total;
            visit(e.value);
            total = add(total, begins_[e.value]);
            if (!nullable_[e.value]) return total;
        }
        nullable = true;
        return total;
    }

    void visit(uint32_t id) {
        if (state_[id] != 0) {
            cycle_ = cycle_ || state_[id] == 1;
            return;
        }
        state_[id] = 1;
        const llama_grammar_rule & rule = rules_[id];
        for (size_t start = 0; start < rule.size();) {
            bool nullable = false;
            begins_[id] = add(begins_[id], from(rule, start, nullable));
            nullable_[id] = nullable_[id] || nullable;
            while (start < rule.size() && !ends(rule[start])) ++start;
            if (start >= rule.size() || rule[start].type == LLAMA_GRETYPE_END) break;
            ++start;
        }
        state_[id] = 2;
    }

    const llama_grammar_rules & rules_;
    std::vector<uint64_t> begins_;
    std::vector<char> state_, nullable_;  // state: 0 unseen, 1 in progress, 2 done
    bool cycle_ = false;
};

// Characters the stacks' tops name (first and last of each range), at most 64.
static std::vector<uint32_t> probe_chars(const llama_grammar_stacks & stacks) {
    std::vector<uint32_t> chars;
    for (const auto & stack : stacks) {
        if (stack.empty() || stack.back()->type != LLAMA_GRETYPE_CHAR) continue;
        for (const llama_grammar_element * e = stack.back(); chars.size() < 64; ++e) {
            if (e != stack.back() && e->type != LLAMA_GRETYPE_CHAR_ALT && e->type != LLAMA_GRETYPE_CHAR_RNG_UPPER) break;
            if (std::find(chars.begin(), chars.end(), e->value) == chars.end()) chars.push_back(e->value);
        }
    }
    return chars;
}

// Follows the text that keeps the most stacks alive, a character at a time, from the start;
// returns the most stacks seen (stops past the bound).
static size_t probe_stacks(llama_grammar & g) {
    size_t most = g.stacks.size();
    for (int step = 0; step < STACK_PROBE_CHARS && most <= MAX_GRAMMAR_STACKS; ++step) {
        const llama_grammar_stacks before = g.stacks;
        size_t best = 0;
        uint32_t best_chr = 0;
        for (uint32_t chr : probe_chars(before)) {
            llama_grammar_accept(&g, chr);
            if (g.stacks.size() > best) best = g.stacks.size(), best_chr = chr;
            g.stacks = before;
        }
        if (best == 0) break;
        llama_grammar_accept(&g, best_chr);
        most = std::max(most, best);
    }
    return most;
}

// Refuses a grammar whose match stacks would make every token slow, before llama.cpp builds
// them for the sampler. Grammars llama.cpp cannot parse are left to its own message.
static void check_grammar_stacks(const llama_vocab * vocab, const std::string & text, const std::string & root) {
    std::string why;
    {
        py::gil_scoped_release release;
        try {
            llama_grammar_parser parser(vocab);
            if (!parser.parse(text.c_str()) || parser.rules.empty()) return;
            const uint64_t worst = Expansion(parser.rules).worst();
            if (worst > MAX_GRAMMAR_EXPANSION) {
                why = "one position expands into " + (worst == UINT64_MAX ? std::string("2^64 or more") : std::to_string(worst)) +
                      " match stacks; at most " + std::to_string(MAX_GRAMMAR_EXPANSION);
            } else if (std::unique_ptr<llama_grammar, decltype(&llama_grammar_free_impl)> g{
                           llama_grammar_init_impl(vocab, text.c_str(), root.c_str(), false, nullptr, 0, nullptr, 0),
                           &llama_grammar_free_impl}) {
                const size_t most = probe_stacks(*g);
                if (most > MAX_GRAMMAR_STACKS) {
                    why = "matching its first characters keeps " + std::to_string(most) + " match stacks alive; at most " +
                          std::to_string(MAX_GRAMMAR_STACKS);
                }
            }
        } catch (const std::exception &) {
            return;  // llama.cpp's parser reports it next
        }
    }
    if (!why.empty()) {
        throw py::value_error("option grammar: " + why + " (nested or ambiguous repetitions such as '(\"a\"{0,n}){0,n}' "
                              "make llama.cpp's matcher slow at every token)");
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
    check_grammar_stacks(vocab, text, root);
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
