// The machine as ggml sees it: its backend devices (type, memory) and where a context's
// model, KV cache and compute buffers live (llama.cpp's memory breakdown).
#include "native.h"

#include <pybind11/stl.h>

#include "ggml-backend.h"
#include "../vendor/llama.cpp/src/llama-ext.h"

namespace wb {

namespace {

const char * kind_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        case GGML_BACKEND_DEVICE_TYPE_META: return "meta";
    }
    return "unknown";
}

// Every ggml backend device: name, description, kind (cpu | gpu | igpu | accel | meta),
// free and total memory in bytes as the backend reports them.
py::list devices() {
    py::list out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        py::dict d;
        d["name"] = ggml_backend_dev_name(dev);
        d["description"] = ggml_backend_dev_description(dev);
        d["kind"] = kind_name(ggml_backend_dev_type(dev));
        d["free"] = free;
        d["total"] = total;
        out.append(d);
    }
    return out;
}

// Per buffer type of a context: the device it belongs to (None: host memory), its kind, and
// the bytes held for the model's weights, the context (KV cache) and compute buffers.
py::list memory_breakdown(const Context & ctx) {
    py::list out;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx.get())) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        py::dict d;
        d["buffer"] = ggml_backend_buft_name(buft);
        d["device"] = dev == nullptr ? py::object(py::none()) : py::object(py::str(ggml_backend_dev_name(dev)));
        d["kind"] = dev == nullptr ? "cpu" : kind_name(ggml_backend_dev_type(dev));
        d["host"] = ggml_backend_buft_is_host(buft);
        d["model"] = mb.model;
        d["context"] = mb.context;
        d["compute"] = mb.compute;
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_devices(py::module_ & m) {
    m.def("devices", &devices, "ggml's backend devices: name, description, kind, free and total bytes.");
    m.def("memory_breakdown", &memory_breakdown, py::arg("ctx"),
          "Where a context's bytes live, per buffer type: buffer, device, kind, host, model, context, compute.");
}

}  // namespace wb
