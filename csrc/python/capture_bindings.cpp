// The recorder behind fastmetal.compile (backend/capture.h), as the private class
// _core._Capture: python/fastmetal/ops/capture.py drives it (record a traced call, mark the
// regions Python re-runs in patch mode, replay without the GIL).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "backend/capture.h"
#include "core/errors.h"
#include "ops/capture_fusion.h"
#include "python/bindings.h"

namespace fm::python {
namespace py = pybind11;

void bind_capture(py::module_& m) {
  py::class_<capture::Capture, std::shared_ptr<capture::Capture>>(
      m, "_Capture",
      "Private: the device work of one traced call, recorded for replay (fastmetal.compile).")
      .def(py::init([](const std::string& device) {
             return std::make_shared<capture::Capture>(get_backend(device));
           }),
           py::arg("device"))
      .def("begin_recording", [](capture::Capture& c) { capture::begin_recording(c); })
      .def("end_recording", [](capture::Capture&) { capture::end_recording(); })
      .def("begin_patching",
           [](capture::Capture& c, std::size_t begin, std::size_t end) {
             capture::begin_patching(c, begin, end);
           },
           py::arg("begin"), py::arg("end"))
      .def("end_patching", [](capture::Capture&) { capture::end_patching(); })
      .def("replay",
           [](capture::Capture& c) {
             py::gil_scoped_release nogil;
             c.replay();
           })
      .def("fuse",
           [](capture::Capture& c, const std::vector<std::pair<std::size_t, std::size_t>>& fixed) {
             return fuse_capture(c, fixed);
           },
           py::arg("fixed"),
           "Folds elementwise launches into the kernels before them (ops/capture_fusion.h), "
           "leaving the [begin, end) ranges in `fixed` alone; returns how many it folded.")
      .def("kernels",
           [](const capture::Capture& c) {
             std::vector<std::string> names;
             for (const capture::Entry& e : c.entries())
               if (e.kind == capture::Entry::Kind::kernel) names.push_back(e.kernel);
             return names;
           },
           "The kernels a replay launches, in order (tests).")
      .def_property_readonly("device", [](const capture::Capture& c) { return c.backend().name(); })
      .def_property_readonly("host_read", [](const capture::Capture& c) { return c.host_read(); })
      .def_property_readonly("arena_bytes", [](const capture::Capture& c) { return c.arena().size(); })
      .def("__len__", [](const capture::Capture& c) { return c.size(); });
  m.def("_capture_active", [] { return capture::recording() != nullptr; },
        "Private: whether this thread is recording a capture (fastmetal.compile).");
  m.def("_capture_position",
        [] {
          capture::Capture* c = capture::recording();
          return c != nullptr ? c->size() : std::size_t(0);
        },
        "Private: the number of entries recorded so far by this thread's capture.");
}

}  // namespace fm::python
