// workbench._native.evict: the built-in policies' rankings (eviction.h) for the prefix
// cache's Python policies, so the cache and the lab's native replay share one definition.
#include "eviction.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <functional>

#include "native.h"

namespace wb {

void bind_eviction(py::module_ & m) {
    auto ev = m.def_submodule("evict", "Eviction policies' rankings, shared by the cache and the lab (eviction.h)");
    ev.def("frecency_priority", &evict::frecency_priority, py::arg("last_used"), py::arg("hits"), py::arg("now"),
           py::arg("credit_s"), py::arg("half_life_s"));
    ev.def("gdsf_value", &evict::gdsf_value, py::arg("inflation"), py::arg("hits"), py::arg("n_tokens"),
           py::arg("size_bytes"));
    py::class_<evict::S3Fifo>(ev, "S3Fifo")
        .def(py::init<double, double, int64_t>(), py::arg("small_ratio"), py::arg("ghost_ratio"),
             py::arg("move_to_main_threshold"))
        .def("set_capacity", &evict::S3Fifo::set_capacity, py::arg("capacity_bytes"))
        .def("on_admit", &evict::S3Fifo::on_admit)
        .def("on_insert", &evict::S3Fifo::on_insert)
        .def("on_hit", &evict::S3Fifo::on_hit)
        .def("on_remove", &evict::S3Fifo::on_remove)
        .def("__copy__", [](const evict::S3Fifo & s) { return evict::S3Fifo(s); })
        .def("__deepcopy__", [](const evict::S3Fifo & s, const py::dict &) { return evict::S3Fifo(s); }, py::arg("memo"))
        .def("alive", &evict::S3Fifo::alive)
        .def("victim",
             [](evict::S3Fifo & s, const std::function<bool(int32_t)> & is_protected) {
                 return s.victim([&](int32_t k) { return is_protected(k); });
             },
             py::arg("is_protected"))
        .def("small_keys", [](const evict::S3Fifo & s) { return s.small.keys(); })
        .def("main_keys", [](const evict::S3Fifo & s) { return s.main.keys(); })
        .def_property_readonly("has_evicted", [](const evict::S3Fifo & s) { return s.has_evicted; })
        .def_property_readonly("main_capacity", [](const evict::S3Fifo & s) { return s.main_capacity; })
        .def_property_readonly("empty", [](const evict::S3Fifo & s) {
            return s.small.empty() && s.main.empty() && (!s.has_ghost || s.ghost.empty());
        });
}

}  // namespace wb
