// workbench._native: the pybind11 module. One file per concern (model, context, sampler);
// this one initialises the backend once and registers the error type.
#include "native.h"

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
}
