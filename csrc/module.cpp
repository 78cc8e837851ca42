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
    py::register_exception<wb::NativeError>(m, "NativeError", PyExc_RuntimeError);
    wb::install_log_callback();
    llama_backend_init();
    m.def("system_info", []() { return std::string(llama_print_system_info()); });
    m.def("max_devices", []() { return llama_max_devices(); });
    m.def("supports_gpu_offload", []() { return llama_supports_gpu_offload(); });
    wb::bind_model(m);
    wb::bind_context(m);
    wb::bind_sampler(m);
    wb::bind_grammar(m);
}
