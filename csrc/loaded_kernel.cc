#include "loaded_kernel.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <tuple>
#include <utility>

namespace nb = nanobind;

namespace numbax {
namespace {

// numbax._core.LoadedKernel: the loaded kernel, and the Python object whose
// life its functions depend on (the op, holding the compiled kernel).
struct PyLoadedKernel {
  LoadedKernel loaded;
  nb::object owner;
};

bool ToTriple(const std::vector<int64_t>& values,
              std::array<unsigned, 3>* out) {
  if (values.size() != 3) return false;
  for (size_t i = 0; i < 3; ++i) {
    // Out of range would be truncated into a different launch.
    if (values[i] < 0 ||
        static_cast<uint64_t>(values[i]) > std::numeric_limits<unsigned>::max())
      return false;
    (*out)[i] = static_cast<unsigned>(values[i]);
  }
  return true;
}

using ScalarSpec = std::tuple<int64_t, std::string, nb::bytes>;

// Fills `loaded`; returns an empty string or the reason the fields do not
// make a launch.
std::string MakeLoadedKernel(
    const std::vector<uint64_t>& functions, int64_t num_inputs,
    int64_t num_outputs, const std::vector<int64_t>& grid,
    const std::vector<int64_t>& block, int64_t shared_mem, bool cooperative,
    bool empty_launch, int64_t batch, const std::vector<bool>& broadcast,
    int fold_axis, int64_t max_slices, int abi,
    const std::vector<std::pair<int64_t, int64_t>>& aliases,
    const std::vector<ScalarSpec>& scalars,
    const std::vector<int64_t>& lead_units,
    const std::vector<int64_t>& trail_units,
    const std::vector<int64_t>& grid_from, LoadedKernel* loaded) {
  if (abi != static_cast<int>(ArrayAbi::kNumba) &&
      abi != static_cast<int>(ArrayAbi::kMemref)) {
    return "abi must be 0 (numba-cuda) or 1 (numba-cuda-mlir memrefs)";
  }
  if (fold_axis != -1 && fold_axis != 1 && fold_axis != 2) {
    return "fold_axis must be -1, 1 or 2";
  }
  if (max_slices < 1) return "max_slices must be >= 1";
  if (!ToTriple(grid, &loaded->grid) || !ToTriple(block, &loaded->block)) {
    return "grid and block must be 3-tuples of ints in [0, 2**32)";
  }
  if (static_cast<int64_t>(broadcast.size()) != num_inputs) {
    return "broadcast needs one flag per input";
  }
  if (shared_mem < 0 || batch < 0 || num_inputs < 0 || num_outputs < 0) {
    return "negative launch parameter";
  }
  if (static_cast<uint64_t>(shared_mem) >
      std::numeric_limits<unsigned>::max()) {
    return "shared_mem does not fit in 32 bits";
  }
  for (const auto& [input, output] : aliases) {
    loaded->aliases.push_back({input, output});
  }
  if (std::string bad = CheckAliases(loaded->aliases, num_inputs, num_outputs);
      !bad.empty()) {
    return bad;
  }
  for (const auto* units : {&lead_units, &trail_units}) {
    if (!units->empty() &&
        static_cast<int64_t>(units->size()) != num_inputs + num_outputs) {
      return "lead_units and trail_units need one count per buffer (or none)";
    }
    for (int64_t n : *units) {
      if (n < 0 || n > kMaxRank) return "unit axes out of range";
    }
  }
  if (grid_from.size() != 3) return "grid_from must have 3 entries";
  for (size_t a = 0; a < 3; ++a) {
    if (grid_from[a] < -1 || grid_from[a] >= kMaxRank) {
      return "grid_from entries must be -1 or an axis of output 0";
    }
    if (grid_from[a] >= 0 && num_outputs < 1) {
      return "grid_from needs an output";
    }
    loaded->grid_from[a] = static_cast<int>(grid_from[a]);
  }
  loaded->lead_units = lead_units;
  loaded->trail_units = trail_units;
  for (const auto& [position, kind, bytes] : scalars) {
    if (kind.size() != 1) return "a scalar's kind must be one character";
    ScalarParam p;
    if (std::string bad =
            MakeScalarParam(position, kind[0], bytes.c_str(), bytes.size(), &p);
        !bad.empty()) {
      return bad;
    }
    loaded->scalars.push_back(p);
  }
  if (std::string bad = CheckScalarPositions(
          loaded->scalars, num_inputs + num_outputs +
                               static_cast<int64_t>(loaded->scalars.size()));
      !bad.empty()) {
    return bad;
  }
  if (!loaded->scalars.empty() && abi != static_cast<int>(ArrayAbi::kNumba)) {
    return "scalar parameters need abi 0 (numba-cuda): numbax does not pass "
           "scalars to numba-cuda-mlir kernels";
  }
  for (uint64_t f : functions) {
    loaded->functions.push_back(reinterpret_cast<cuda::CUfunction>(f));
  }
  loaded->num_inputs = num_inputs;
  loaded->num_outputs = num_outputs;
  loaded->shared_mem = static_cast<unsigned>(shared_mem);
  loaded->cooperative = cooperative;
  loaded->empty_launch = empty_launch;
  loaded->batch = batch;
  for (bool b : broadcast) loaded->broadcast.push_back(b ? 1 : 0);
  loaded->fold_axis = fold_axis;
  loaded->max_slices = max_slices;
  loaded->abi = static_cast<ArrayAbi>(abi);
  return "";
}

nb::tuple Triple(const std::array<unsigned, 3>& t) {
  return nb::make_tuple(t[0], t[1], t[2]);
}

}  // namespace

void BindLoadedKernel(nb::module_& m) {
  nb::class_<PyLoadedKernel>(
      m, "LoadedKernel",
      "A numba_cuda_kernel call's kernel, loaded on every visible device (a "
      "CUfunction per device ordinal), with what one launch needs: built by "
      "numbax at XLA's instantiate stage and read by the C++ handler on "
      "every call. Keyword arguments only.")
      .def(
          "__init__",
          [](PyLoadedKernel* self, nb::object owner,
             std::vector<uint64_t> functions, int64_t num_inputs,
             int64_t num_outputs, std::vector<int64_t> grid,
             std::vector<int64_t> block, int64_t shared_mem, bool cooperative,
             bool empty_launch, int64_t batch, std::vector<bool> broadcast,
             int fold_axis, int64_t max_slices, int abi,
             std::vector<std::pair<int64_t, int64_t>> aliases,
             std::vector<ScalarSpec> scalars, std::vector<int64_t> lead_units,
             std::vector<int64_t> trail_units, std::vector<int64_t> grid_from,
             std::string name) {
            LoadedKernel loaded;
            const std::string error = MakeLoadedKernel(
                functions, num_inputs, num_outputs, grid, block, shared_mem,
                cooperative, empty_launch, batch, broadcast, fold_axis,
                max_slices, abi, aliases, scalars, lead_units, trail_units,
                grid_from, &loaded);
            if (!error.empty()) {
              throw nb::value_error(("LoadedKernel: " + error).c_str());
            }
            loaded.name = std::move(name);
            new (self) PyLoadedKernel{std::move(loaded), std::move(owner)};
          },
          nb::kw_only(), nb::arg("owner"), nb::arg("functions"),
          nb::arg("num_inputs"), nb::arg("num_outputs"), nb::arg("grid"),
          nb::arg("block"), nb::arg("shared_mem"), nb::arg("cooperative"),
          nb::arg("empty_launch"), nb::arg("batch"), nb::arg("broadcast"),
          nb::arg("fold_axis"), nb::arg("max_slices"), nb::arg("abi"),
          nb::arg("aliases"), nb::arg("scalars"), nb::arg("lead_units"),
          nb::arg("trail_units"), nb::arg("grid_from"), nb::arg("name") = "")
      .def_prop_ro("owner", [](const PyLoadedKernel& p) { return p.owner; })
      .def_prop_ro("functions",
                   [](const PyLoadedKernel& p) {
                     std::vector<uint64_t> out;
                     for (cuda::CUfunction f : p.loaded.functions) {
                       out.push_back(reinterpret_cast<uint64_t>(f));
                     }
                     return out;
                   })
      .def_prop_ro("num_inputs",
                   [](const PyLoadedKernel& p) { return p.loaded.num_inputs; })
      .def_prop_ro("num_outputs",
                   [](const PyLoadedKernel& p) { return p.loaded.num_outputs; })
      .def_prop_ro(
          "grid", [](const PyLoadedKernel& p) { return Triple(p.loaded.grid); })
      .def_prop_ro(
          "block",
          [](const PyLoadedKernel& p) { return Triple(p.loaded.block); })
      .def_prop_ro("shared_mem",
                   [](const PyLoadedKernel& p) { return p.loaded.shared_mem; })
      .def_prop_ro("cooperative",
                   [](const PyLoadedKernel& p) { return p.loaded.cooperative; })
      .def_prop_ro(
          "empty_launch",
          [](const PyLoadedKernel& p) { return p.loaded.empty_launch; })
      .def_prop_ro("batch",
                   [](const PyLoadedKernel& p) { return p.loaded.batch; })
      .def_prop_ro("broadcast",
                   [](const PyLoadedKernel& p) {
                     std::vector<bool> out;
                     for (uint8_t b : p.loaded.broadcast) out.push_back(b != 0);
                     return out;
                   })
      .def_prop_ro("fold_axis",
                   [](const PyLoadedKernel& p) { return p.loaded.fold_axis; })
      .def_prop_ro("max_slices",
                   [](const PyLoadedKernel& p) { return p.loaded.max_slices; })
      .def_prop_ro("abi",
                   [](const PyLoadedKernel& p) {
                     return static_cast<int>(p.loaded.abi);
                   })
      .def_prop_ro("aliases",
                   [](const PyLoadedKernel& p) {
                     std::vector<std::pair<int64_t, int64_t>> out;
                     for (const Alias& a : p.loaded.aliases) {
                       out.emplace_back(a.input, a.output);
                     }
                     return out;
                   })
      .def_prop_ro("lead_units",
                   [](const PyLoadedKernel& p) { return p.loaded.lead_units; })
      .def_prop_ro("trail_units",
                   [](const PyLoadedKernel& p) { return p.loaded.trail_units; })
      .def_prop_ro("grid_from",
                   [](const PyLoadedKernel& p) {
                     return nb::make_tuple(p.loaded.grid_from[0],
                                           p.loaded.grid_from[1],
                                           p.loaded.grid_from[2]);
                   })
      .def_prop_ro(
          "scalars",
          [](const PyLoadedKernel& p) {
            // (position, the parameter words as packed), per scalar.
            std::vector<std::pair<int64_t, std::vector<int64_t>>> out;
            for (const ScalarParam& s : p.loaded.scalars) {
              out.emplace_back(s.position, std::vector<int64_t>(
                                               s.words, s.words + s.num_words));
            }
            return out;
          },
          "(position, words) of each scalar parameter, as C++ packs it.")
      .def_prop_ro("name",
                   [](const PyLoadedKernel& p) { return p.loaded.name; });
}

PyObject* ReadLoadedKernel(PyObject* object, LoadedKernel* loaded,
                           std::string* error) {
  nb::handle h(object);
  if (!nb::isinstance<PyLoadedKernel>(h)) {
    *error = std::string("the kernel resolver returned a ") +
             Py_TYPE(object)->tp_name + ", not a numbax._core.LoadedKernel";
    return nullptr;
  }
  const PyLoadedKernel* p = nb::inst_ptr<PyLoadedKernel>(h);
  *loaded = p->loaded;
  return p->owner.ptr();
}

}  // namespace numbax
