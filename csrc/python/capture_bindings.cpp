// The recorder behind fastmetal.compile (backend/capture.h), as the private class
// _core._Capture: python/fastmetal/ops/capture.py drives it (record a traced call, mark the
// regions Python re-runs in patch mode, replay without the GIL).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/capture.h"
#include "backend/capture_order.h"
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
      .def("dependencies",
           [](const capture::Capture& c) { return capture::order_of(c).deps; },
           "For each recorded entry, the earlier entries it waits for directly "
           "(backend/capture_order.h; tests).")
      .def("lanes",
           [](const capture::Capture& c, int max_lanes) {
             const capture::Lanes l = capture::assign_lanes(c, capture::order_of(c), max_lanes);
             return std::make_pair(l.lane, l.waits);
           },
           py::arg("max_lanes"),
           "(lane per entry, -1 where skipped; the entries of other lanes each one waits for): "
           "how CUDA spreads the graph over its streams (backend/capture_order.h; tests).")
      .def("accesses",
           [](const capture::Capture& c) {
             // (kind, [(address, bytes, written)]) per entry: what capture_order.h compares.
             std::vector<std::pair<std::string, std::vector<std::tuple<std::uintptr_t, std::size_t, bool>>>> out;
             for (const capture::Entry& e : c.entries()) {
               std::vector<std::tuple<std::uintptr_t, std::size_t, bool>> touched;
               for (const capture::Access& a : capture::accesses(c, e))
                 touched.emplace_back(a.begin, a.end - a.begin, a.write);
               const char* kind = e.kind == capture::Entry::Kind::upload      ? "upload"
                                  : e.kind == capture::Entry::Kind::fused     ? "fused"
                                  : e.kind == capture::Entry::Kind::host_call ? "host_call"
                                                                              : e.kernel.c_str();
               out.emplace_back(kind, std::move(touched));
             }
             return out;
           },
           "Per entry: its kernel ('upload', 'fused', 'host_call' for the others) and the "
           "allocations its buffers lie in, as (address, bytes, written) (tests).")
      .def_property("replay_order",
                    [](const capture::Capture& c) { return c.replay_order(); },
                    [](capture::Capture& c, std::vector<std::size_t> order) {
                      c.set_replay_order(std::move(order));
                    },
                    "Tests: the order replays run the entries in ([] = as recorded).")
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
