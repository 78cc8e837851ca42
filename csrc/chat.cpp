// Chat templates through llama.cpp common's own chat machinery (common/chat.h): OpenAI-shaped
// messages and tools (JSON text) are rendered with the model's jinja template, and a
// generated reply is parsed back into content, reasoning and tool calls by the PEG parser
// that rendering produced. Nothing here renders or parses by hand.
//
// Every exception from common (bad role, bad content, invalid tool schema, a template that
// raises, output that does not match the format) becomes a ValueError; the GIL is released
// around rendering and parsing.
#include "native.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "chat.h"

namespace wb {

namespace {

const char * trigger_type_name(common_grammar_trigger_type t) {
    switch (t) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "unknown";
}

py::list str_list(const std::vector<std::string> & v) {
    py::list out;
    for (const auto & s : v) out.append(py::str(s));
    return out;
}

std::mutex g_prefill_mutex;

}  // namespace

// Tool-call grammars start with the template's generation prompt, which the prompt already
// holds: like llama.cpp's common sampler, accept its tokens before the first sampled one.
// Done on a clone that replaces the prototype only when every token was accepted, so a
// refused prefill leaves the cached prototype as it was.
void Grammar::prefill(const std::string & prompt_text) {
    std::lock_guard<std::mutex> lock(g_prefill_mutex);
    if (prefilled == prompt_text) return;
    if (!prefilled.empty()) throw py::value_error("the grammar was already prefilled with another text");
    const std::vector<llama_token> tokens = model->tokenize(prompt_text, false, true);
    llama_sampler * advanced = llama_sampler_clone(proto_);
    if (advanced == nullptr) throw NativeError("could not clone the grammar sampler");
    std::string error;
    {
        py::gil_scoped_release release;
        try {
            for (size_t i = 0; i < tokens.size(); ++i) {
                // some tokenizers put a space before a leading special token: skip it
                if (i == 0 && !prompt_text.empty() && !std::isspace((unsigned char)prompt_text[0])) {
                    const std::string piece = common_token_to_piece(model->vocab(), tokens[i], true);
                    if (!piece.empty() && std::isspace((unsigned char)piece[0])) continue;
                }
                llama_sampler_accept(advanced, tokens[i]);
            }
        } catch (const std::exception & e) {
            error = e.what();
        }
    }
    if (!error.empty()) {
        llama_sampler_free(advanced);
        throw py::value_error("the grammar does not accept the generation prompt: " + error);
    }
    llama_sampler_free(proto_);
    proto_ = advanced;
    prefilled = prompt_text;
}

void Grammar::make_lazy(const std::vector<std::string> & patterns, const std::vector<llama_token> & tokens) {
    std::lock_guard<std::mutex> lock(g_prefill_mutex);
    if (lazy) return;
    std::vector<const char *> c_patterns;
    for (const auto & p : patterns) c_patterns.push_back(p.c_str());
    llama_sampler * s = nullptr;
    {
        py::gil_scoped_release release;
        clear_recent_log();
        try {
            s = llama_sampler_init_grammar_lazy_patterns(model->vocab(), text.c_str(), "root", c_patterns.data(),
                                                         c_patterns.size(), tokens.data(), tokens.size());
        } catch (const std::exception &) {
            s = nullptr;
        }
    }
    if (s == nullptr) {
        std::string why = recent_log();
        throw py::value_error("llama.cpp could not make the lazy grammar" + (why.empty() ? "" : ": " + why));
    }
    llama_sampler_free(proto_);
    proto_ = s;
    lazy = true;
}

// A chat template's grammar triggers in the form llama.cpp's sampler takes, as its server
// does: a trigger word that is one preserved token triggers on that token, other words on
// their escaped text.
static void grammar_make_lazy(Grammar & grammar, const py::list & triggers, const std::vector<std::string> & preserved) {
    std::vector<llama_token> preserved_ids;
    for (const auto & p : preserved) {
        const auto ids = grammar.model->tokenize(p, false, true);
        if (ids.size() == 1) preserved_ids.push_back(ids[0]);
    }
    std::vector<std::string> patterns;
    std::vector<llama_token> tokens;
    for (const auto & item : triggers) {
        const py::dict t = item.cast<py::dict>();
        const std::string type = t["type"].cast<std::string>();
        const std::string value = t["value"].cast<std::string>();
        if (type == "word") {
            const auto ids = grammar.model->tokenize(value, false, true);
            if (ids.size() == 1 && std::find(preserved_ids.begin(), preserved_ids.end(), ids[0]) != preserved_ids.end()) {
                tokens.push_back(ids[0]);
            } else {
                patterns.push_back(regex_escape(value));
            }
        } else if (type == "pattern") {
            patterns.push_back(value);
        } else if (type == "pattern_full") {
            std::string anchored = value.empty() ? std::string("^$")
                                                 : (value.front() != '^' ? "^" : "") + value + (value.back() != '$' ? "$" : "");
            patterns.push_back(anchored);
        } else if (type == "token") {
            const llama_token id = t["token"].cast<llama_token>();
            grammar.model->check_token(id);
            tokens.push_back(id);
        } else {
            throw py::value_error("unknown grammar trigger type '" + type + "'");
        }
    }
    if (patterns.empty() && tokens.empty()) throw py::value_error("a lazy grammar needs at least one trigger");
    grammar.make_lazy(patterns, tokens);
}

// The parser state of one rendering: format, generation prompt and the loaded PEG arena.
// Immutable once built, so parse() may run from any thread.
class ChatParser {
public:
    ChatParser(common_chat_parser_params params, std::string format_name)
        : params_(std::move(params)), format_name_(std::move(format_name)) {}

    py::dict parse(const std::string & text, bool is_partial) const {
        common_chat_msg msg;
        std::string error;
        if (nesting_depth(text, "[]{}") > MAX_NESTING) {
            throw py::value_error("chat parse: the reply nests brackets more than " + std::to_string(MAX_NESTING) +
                                  " deep (not handed to llama.cpp's recursive parser)");
        }
        {
            py::gil_scoped_release release;
            try {
                msg = common_chat_parse(text, is_partial, params_);
            } catch (const std::exception & e) {
                error = e.what();
            }
        }
        if (!error.empty()) throw py::value_error("chat parse: " + error);
        py::list calls;
        for (const auto & tc : msg.tool_calls) {
            py::dict c;
            c["name"] = tc.name;
            c["arguments"] = tc.arguments;
            c["id"] = tc.id;
            calls.append(c);
        }
        py::dict out;
        out["role"] = msg.role.empty() ? std::string("assistant") : msg.role;
        out["content"] = msg.content.empty() && !msg.content_parts.empty() ? msg.render_content() : msg.content;
        out["reasoning_content"] = msg.reasoning_content;
        out["tool_calls"] = calls;
        return out;
    }

    const std::string & format_name() const { return format_name_; }
    const std::string & generation_prompt() const { return params_.generation_prompt; }

private:
    common_chat_parser_params params_;
    std::string format_name_;
};

// A model's chat templates (default and, if the GGUF has one, tool_use), parsed once.
class ChatTemplates {
public:
    ChatTemplates(std::shared_ptr<Model> model_, const std::string & override_src) : model(std::move(model_)) {
        const llama_model * lm = model->get();
        has_template = !override_src.empty() || llama_model_chat_template(lm, nullptr) != nullptr ||
                       llama_model_chat_template(lm, "tool_use") != nullptr;
        std::string error;
        {
            py::gil_scoped_release release;
            try {
                tmpls_ = common_chat_templates_init(lm, override_src);
            } catch (const std::exception & e) {
                error = e.what();
            }
        }
        if (!error.empty() || !tmpls_) {
            throw py::value_error("the chat template could not be parsed: " + (error.empty() ? std::string("unknown error") : error));
        }
    }

    std::string source(const std::string & variant) const { return common_chat_templates_source(tmpls_.get(), variant); }

    std::map<std::string, bool> caps() const { return common_chat_templates_get_caps(tmpls_.get()); }

    py::dict apply(const std::string & messages_json, const std::string & tools_json, const std::string & tool_choice,
                   bool parallel_tool_calls, bool add_generation_prompt, bool enable_thinking,
                   const std::string & kwargs_json, const std::string & json_schema,
                   bool continue_final_message) const {
        common_chat_params out;
        common_chat_parser_params parser_params;
        std::string error;
        for (const std::string * j : {&messages_json, &tools_json, &kwargs_json}) {
            if (nesting_depth(*j, "[]{}", true) > 2 * MAX_NESTING) {
                throw py::value_error("the messages, tools or template variables nest more than " +
                                      std::to_string(2 * MAX_NESTING) + " levels of JSON deep");
            }
        }
        {
            py::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(mutex_);
            try {
                common_chat_templates_inputs inputs;
                inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(messages_json));
                if (!tools_json.empty()) {
                    inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(tools_json));
                }
                inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice);
                inputs.parallel_tool_calls = parallel_tool_calls;
                inputs.add_generation_prompt = add_generation_prompt;
                if (continue_final_message) {
                    // the last (assistant) message is a prefix the reply continues, as the
                    // server's prefill_assistant: no generation prompt after it
                    if (inputs.messages.empty() || inputs.messages.back().role != "assistant") {
                        throw std::invalid_argument("continue_final_message needs an assistant message last");
                    }
                    if (!inputs.messages.back().tool_calls.empty()) {
                        throw std::invalid_argument("cannot continue an assistant message that has tool calls");
                    }
                    inputs.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
                    inputs.add_generation_prompt = false;
                }
                inputs.enable_thinking = enable_thinking;
                // reasoning goes to reasoning_content, as llama.cpp's server does by default
                inputs.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
                inputs.json_schema = json_schema;
                inputs.use_jinja = true;
                if (!kwargs_json.empty()) {
                    const common_json kwargs = common_json::parse(kwargs_json);
                    if (!kwargs.is_object()) throw std::invalid_argument("chat_template_kwargs must be an object");
                    for (const auto & item : kwargs.items()) inputs.chat_template_kwargs[item.key()] = item.value().dump();
                }
                out = common_chat_templates_apply(tmpls_.get(), inputs);
                parser_params = common_chat_parser_params(out);
                parser_params.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
                if (!out.parser.empty()) parser_params.parser.load(out.parser);
            } catch (const std::exception & e) {
                error = e.what();
            }
        }
        if (!error.empty()) throw py::value_error(error);

        py::list triggers;
        for (const auto & t : out.grammar_triggers) {
            py::dict d;
            d["type"] = trigger_type_name(t.type);
            d["value"] = t.value;
            d["token"] = t.token;
            triggers.append(d);
        }
        py::dict d;
        d["prompt"] = out.prompt;
        d["grammar"] = out.grammar.empty() ? py::object(py::none()) : py::object(py::str(out.grammar));
        d["grammar_lazy"] = out.grammar_lazy;
        d["grammar_triggers"] = triggers;
        d["preserved_tokens"] = str_list(out.preserved_tokens);
        d["additional_stops"] = str_list(out.additional_stops);
        d["generation_prompt"] = out.generation_prompt;
        d["supports_thinking"] = out.supports_thinking;
        d["thinking_start_tag"] = out.thinking_start_tag;
        d["thinking_end_tags"] = str_list(out.thinking_end_tags);
        std::string format_name;
        try {
            format_name = common_chat_format_name(out.format);
        } catch (const std::exception &) {
            format_name = "unknown";
        }
        d["format"] = format_name;
        d["parser"] = std::make_shared<ChatParser>(std::move(parser_params), format_name);
        return d;
    }

    std::shared_ptr<Model> model;
    bool has_template = false;

private:
    common_chat_templates_ptr tmpls_;
    mutable std::mutex mutex_;
};

void bind_chat(py::module_ & m) {
    m.def("grammar_prefill", [](Grammar & grammar, const std::string & text) { grammar.prefill(text); },
          py::arg("grammar"), py::arg("text"),
          "Advance a grammar prototype past text the prompt holds (a template's generation prompt).");
    m.def("grammar_make_lazy", &grammar_make_lazy, py::arg("grammar"), py::arg("triggers"), py::arg("preserved_tokens"),
          "Make a grammar prototype lazy on a chat template's triggers (as llama.cpp's server does).");
    py::class_<ChatParser, std::shared_ptr<ChatParser>>(m, "ChatParser")
        .def("parse", &ChatParser::parse, py::arg("text"), py::arg("is_partial") = false,
             "Parse a generated reply: dict(role, content, reasoning_content, tool_calls=[{name, "
             "arguments (JSON text), id}]). ValueError when a complete reply does not match the format.")
        .def_property_readonly("format", &ChatParser::format_name)
        .def_property_readonly("generation_prompt", &ChatParser::generation_prompt);

    py::class_<ChatTemplates, std::shared_ptr<ChatTemplates>>(m, "ChatTemplates")
        .def(py::init<std::shared_ptr<Model>, const std::string &>(), py::arg("model"), py::arg("template") = "")
        .def_readonly("has_template", &ChatTemplates::has_template,
                      "False when the model carries no chat template (llama.cpp then falls back to ChatML)")
        .def("source", &ChatTemplates::source, py::arg("variant") = "")
        .def("caps", &ChatTemplates::caps)
        .def("apply", &ChatTemplates::apply, py::arg("messages_json"), py::arg("tools_json") = "",
             py::arg("tool_choice") = "auto", py::arg("parallel_tool_calls") = false,
             py::arg("add_generation_prompt") = true, py::arg("enable_thinking") = true,
             py::arg("kwargs_json") = "", py::arg("json_schema") = "", py::arg("continue_final_message") = false,
             "Render messages (+ tools) with the template: dict(prompt, grammar, grammar_lazy, "
             "grammar_triggers, preserved_tokens, additional_stops, generation_prompt, supports_thinking, "
             "thinking_start_tag, thinking_end_tags, format, parser).");
}

}  // namespace wb
