// The load options that go to llama.cpp beyond the basics: model placement and load mode
// (llama_model_params), KQV offload, the SWA cache and the RoPE/YaRN overrides
// (llama_context_params). workbench/options/load.py validates each first; the checks here
// keep a value that slipped through from reaching llama.cpp as something it asserts on.
#include "native.h"

#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>

namespace wb {

namespace {

bool has(const py::dict & d, const char * key) { return d.contains(key) && !d[key].is_none(); }

llama_split_mode parse_split_mode(const std::string & name) {
    if (name == "none") return LLAMA_SPLIT_MODE_NONE;
    if (name == "layer") return LLAMA_SPLIT_MODE_LAYER;
    if (name == "row") return LLAMA_SPLIT_MODE_ROW;
    throw py::value_error("option split_mode: '" + name + "' is not one of 'none', 'layer', 'row'");
}

llama_load_mode parse_load_mode(const std::string & name) {
    try {
        return llama_load_mode_from_str(name.c_str());
    } catch (const std::invalid_argument &) {
        throw py::value_error("option load_mode: '" + name +
                              "' is not one of 'auto', 'none', 'mmap', 'mlock', 'mmap+mlock', 'dio'");
    }
}

llama_rope_scaling_type parse_rope_scaling(const std::string & name) {
    if (name == "none") return LLAMA_ROPE_SCALING_TYPE_NONE;
    if (name == "linear") return LLAMA_ROPE_SCALING_TYPE_LINEAR;
    if (name == "yarn") return LLAMA_ROPE_SCALING_TYPE_YARN;
    if (name == "longrope") return LLAMA_ROPE_SCALING_TYPE_LONGROPE;
    throw py::value_error("option rope_scaling_type: '" + name + "' is not one of 'none', 'linear', 'yarn', 'longrope'");
}

float finite(const py::dict & d, const char * key, double lo) {
    const double v = d[key].cast<double>();
    if (!std::isfinite(v) || v < lo) {
        throw py::value_error(std::string("option ") + key + ": " + std::to_string(v) + " is not a finite number >= " +
                              std::to_string(lo));
    }
    return (float)v;
}

}  // namespace

void apply_model_options(llama_model_params & mp, const py::dict & options, std::vector<float> & split_storage) {
    if (has(options, "split_mode")) mp.split_mode = parse_split_mode(options["split_mode"].cast<std::string>());
    if (has(options, "main_gpu")) {
        const int main_gpu = options["main_gpu"].cast<int>();
        if (main_gpu < -1 || main_gpu >= (int)llama_max_devices()) {
            throw py::value_error("option main_gpu: " + std::to_string(main_gpu) + " is outside [-1, " +
                                  std::to_string(llama_max_devices() - 1) + "]");
        }
        mp.main_gpu = main_gpu;
    }
    if (has(options, "load_mode")) mp.load_mode = parse_load_mode(options["load_mode"].cast<std::string>());
    if (has(options, "tensor_split")) {
        const auto split = options["tensor_split"].cast<std::vector<double>>();
        if (split.size() > llama_max_devices()) {
            throw py::value_error("option tensor_split: " + std::to_string(split.size()) + " entries, at most " +
                                  std::to_string(llama_max_devices()));
        }
        split_storage.assign(llama_max_devices(), 0.0f);  // llama.cpp reads llama_max_devices() entries
        for (size_t i = 0; i < split.size(); ++i) {
            if (!std::isfinite(split[i]) || split[i] < 0) throw py::value_error("option tensor_split: negative or not finite");
            split_storage[i] = (float)split[i];
        }
        mp.tensor_split = split_storage.data();
    }
}

void apply_context_options(llama_context_params & cp, const py::dict & params) {
    if (has(params, "offload_kqv")) cp.offload_kqv = params["offload_kqv"].cast<bool>();
    if (has(params, "swa_full")) cp.swa_full = params["swa_full"].cast<bool>();
    if (has(params, "rope_scaling_type")) {
        cp.rope_scaling_type = parse_rope_scaling(params["rope_scaling_type"].cast<std::string>());
    }
    // 0 / negative mean "from the model" to llama.cpp: only explicit values are written
    if (has(params, "rope_freq_base")) cp.rope_freq_base = finite(params, "rope_freq_base", 1e-30);
    if (has(params, "rope_freq_scale")) cp.rope_freq_scale = finite(params, "rope_freq_scale", 1e-30);
    if (has(params, "yarn_ext_factor")) cp.yarn_ext_factor = finite(params, "yarn_ext_factor", 0.0);
    if (has(params, "yarn_attn_factor")) cp.yarn_attn_factor = finite(params, "yarn_attn_factor", 0.0);
    if (has(params, "yarn_beta_fast")) cp.yarn_beta_fast = finite(params, "yarn_beta_fast", 0.0);
    if (has(params, "yarn_beta_slow")) cp.yarn_beta_slow = finite(params, "yarn_beta_slow", 0.0);
    if (has(params, "yarn_orig_ctx")) cp.yarn_orig_ctx = params["yarn_orig_ctx"].cast<uint32_t>();
}

}  // namespace wb
