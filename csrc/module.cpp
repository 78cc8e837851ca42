// workbench._native: the pybind11 module. One file per concern (model, context, sampler);
// this one initialises the backend once and registers the error type.
#include "native.h"

#include <algorithm>
#include <cstdio>

namespace wb {
void install_log_callback();
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "Native core of llama-workbench over the pinned llama.cpp";
    m.attr("__version__") = WORKBENCH_VERSION;
    m.attr("llama_commit") = LLAMA_UPSTREAM_COMMIT;
#ifdef WORKBENCH_CUDA
    m.attr("cuda") = true;
#else
    m.attr("cuda") = false;
#endif
    // Module-local translators run before any other extension's global ones (a module
    // loaded later, e.g. libcachesim, may translate every std::exception its own way).
    py::register_local_exception<wb::NativeError>(m, "NativeError", PyExc_RuntimeError);
    py::register_local_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const py::builtin_exception & e) {
            e.set_error();  // py::value_error -> ValueError, whatever else is loaded
        }
    });
    wb::install_log_callback();
    llama_backend_init();
    m.def("system_info", []() { return std::string(llama_print_system_info()); });
    m.def("max_devices", []() { return llama_max_devices(); });
    m.def("supports_gpu_offload", []() { return llama_supports_gpu_offload(); });
    wb::bind_model(m);
    wb::bind_context(m);
    wb::bind_sampler(m);
    wb::bind_grammar(m);
    wb::bind_adapter(m);
    wb::bind_chat(m);
    wb::bind_embed(m);
    wb::bind_speculative(m);
    wb::bind_devices(m);
    wb::bind_lab(m);
    wb::bind_eviction(m);
    wb::bind_score(m);
}

namespace wb {

// The first code point of `text` with no UTF-8 form, reported as workbench's InvalidOption
// (a ValueError) with an excerpt around it; a plain ValueError if workbench.errors is absent.
void raise_not_utf8(py::handle text) {
    const Py_ssize_t n = PyUnicode_GetLength(text.ptr());
    Py_ssize_t at = 0;
    Py_UCS4 cp = 0;
    for (; at < n; ++at) {
        cp = PyUnicode_ReadChar(text.ptr(), at);
        if (cp >= 0xD800 && cp <= 0xDFFF) break;
    }
    char code[16];
    std::snprintf(code, sizeof(code), "U+%04X", (unsigned)cp);
    const std::string expected = std::string("text with a UTF-8 form (") + code + " at index " + std::to_string(at) +
                                 " is a lone surrogate)";
    py::object value = py::reinterpret_borrow<py::object>(text);
    if (n > 64) {
        const Py_ssize_t from = std::max<Py_ssize_t>(0, at - 24);
        value = value[py::slice(from, std::min<Py_ssize_t>(n, at + 24), 1)];
    }
    try {
        py::object err = py::module_::import("workbench.errors").attr("InvalidOption")("text", value, expected);
        PyErr_SetObject(py::type::handle_of(err).ptr(), err.ptr());
    } catch (const py::error_already_set &) {
        PyErr_SetString(PyExc_ValueError, ("text: " + expected).c_str());
    }
    throw py::error_already_set();
}

}  // namespace wb
