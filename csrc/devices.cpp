// The machine as ggml sees it: its backend devices (type, memory) and where a context's
// model weights and KV cache live (llama.cpp's memory breakdown of each).
#include "native.h"

#include <pybind11/stl.h>

#include "ggml-backend.h"
#include "../vendor/llama.cpp/src/llama-model.h"  // llama_model / llama_memory_i::memory_breakdown

#include <map>
#include <utility>

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
// the bytes held for the model's weights and for the context's KV cache. Both are allocated
// once (at load, at context creation) and only read here, so this is safe while another
// thread decodes; the compute buffers are left out: a decode may reallocate them.
py::list memory_breakdown(const Context & ctx) {
    std::map<ggml_backend_buffer_type_t, std::pair<size_t, size_t>> parts;  // (model, context)
    for (const auto & [buft, size] : ctx.model->get()->memory_breakdown()) parts[buft].first += size;
    if (llama_memory_t mem = llama_get_memory(ctx.get())) {
        for (const auto & [buft, size] : mem->memory_breakdown()) parts[buft].second += size;
    }
    py::list out;
    for (const auto & [buft, bytes] : parts) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        py::dict d;
        d["buffer"] = ggml_backend_buft_name(buft);
        d["device"] = dev == nullptr ? py::object(py::none()) : py::object(py::str(ggml_backend_dev_name(dev)));
        d["kind"] = dev == nullptr ? "cpu" : kind_name(ggml_backend_dev_type(dev));
        d["host"] = ggml_backend_buft_is_host(buft);
        d["model"] = bytes.first;
        d["context"] = bytes.second;
        out.append(d);
    }
    return out;
}

}  // namespace

void bind_devices(py::module_ & m) {
    m.def("devices", &devices, "ggml's backend devices: name, description, kind, free and total bytes.");
    m.def("memory_breakdown", &memory_breakdown, py::arg("ctx"),
          "Where a context's model weights and KV cache live, per buffer type: buffer, device, kind, host, "
          "model, context (bytes). Safe while the context decodes (compute buffers are left out).");
}

}  // namespace wb
