// LoRA adapters: load / free, and the set applied to a context (all its sequences).
#include "native.h"

#include <pybind11/stl.h>

namespace wb {

namespace {

class Adapter {
public:
    Adapter(std::shared_ptr<Model> model_, const std::string & path_) : model(std::move(model_)), path(path_) {
        llama_model * m = model->get();
        {
            py::gil_scoped_release release;
            clear_recent_log();
            try {
                adapter_ = llama_adapter_lora_init(m, path.c_str());
            } catch (const std::exception &) {
                adapter_ = nullptr;
            }
        }
        if (adapter_ == nullptr) {
            std::string why = recent_log();
            throw NativeError("llama.cpp could not load the LoRA adapter '" + path + "'" +
                              (why.empty() ? "" : ": " + why));
        }
    }
    ~Adapter() { close(); }

    void close() {
        // llama_model_free frees the adapters still registered with the model
        if (adapter_ != nullptr && !model->closed()) llama_adapter_lora_free(adapter_);
        adapter_ = nullptr;
    }

    llama_adapter_lora * get() const {
        if (adapter_ == nullptr || model->closed()) throw NativeError("the adapter has been freed");
        return adapter_;
    }

    std::shared_ptr<Model> model;
    std::string path;

private:
    llama_adapter_lora * adapter_ = nullptr;
};

}  // namespace

void bind_adapter(py::module_ & m) {
    py::class_<Adapter, std::shared_ptr<Adapter>>(m, "Adapter")
        .def(py::init<std::shared_ptr<Model>, const std::string &>(), py::arg("model"), py::arg("path"))
        .def_readonly("path", &Adapter::path)
        .def("close", &Adapter::close)
        .def("meta", [](const Adapter & self, const std::string & key) -> py::object {
            char buf[256];
            const int n = llama_adapter_meta_val_str(self.get(), key.c_str(), buf, sizeof(buf));
            if (n < 0) return py::none();
            return py::str(std::string(buf, std::min<int>(n, sizeof(buf) - 1)));
        }, py::arg("key"));

    m.def("set_adapters", [](Context & ctx, const std::vector<std::shared_ptr<Adapter>> & adapters,
                             std::vector<float> scales) {
        if (adapters.size() != scales.size()) throw py::value_error("set_adapters: one scale per adapter");
        std::vector<llama_adapter_lora *> ptrs;
        for (const auto & a : adapters) {
            if (a->model.get() != ctx.model.get()) throw py::value_error("set_adapters: adapter of another model");
            ptrs.push_back(a->get());
        }
        llama_context * c = ctx.get();
        if (ptrs.empty()) {
            llama_set_adapters_lora(c, nullptr, 0, nullptr);
        } else {
            llama_set_adapters_lora(c, ptrs.data(), ptrs.size(), scales.data());
        }
        // the context points at them: they must outlive their Python handles
        ctx.keep_alive.assign(adapters.begin(), adapters.end());
    }, py::arg("ctx"), py::arg("adapters"), py::arg("scales"),
       "Apply exactly these LoRA adapters with these scales to every sequence of ctx.");
}

}  // namespace wb
