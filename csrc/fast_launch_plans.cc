#include "fast_launch_plans.h"

#include <cstring>
#include <utility>

namespace numbax {
namespace {

bool ParseDims(PyObject* t, unsigned out[3]) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) return false;
  for (Py_ssize_t i = 0; i < 3; ++i) {
    unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, i));
    if (PyErr_Occurred() || v > 0xFFFFFFFFul) {
      PyErr_Clear();
      return false;
    }
    out[i] = static_cast<unsigned>(v);
  }
  return true;
}

}  // namespace

PlanMap& Plans() {
  static auto* plans = new PlanMap();  // leaked on purpose (exit order)
  return *plans;
}

// Fills `plan` from the builder's tuple (function, grid, block, shared_mem,
// cooperative, packing, keep, overloads, callbacks). False if malformed.
bool ParsePlan(PyObject* t, Plan* plan) {
  PyObject *grid, *block, *packing, *keep, *overloads, *callbacks;
  unsigned long long function, shared_mem;
  int cooperative;
  if (!PyTuple_Check(t) ||
      !PyArg_ParseTuple(t, "KOOKpUOOO", &function, &grid, &block, &shared_mem,
                        &cooperative, &packing, &keep, &overloads,
                        &callbacks)) {
    PyErr_Clear();
    return false;
  }
  if (!ParseDims(grid, plan->grid) || !ParseDims(block, plan->block) ||
      shared_mem > 0xFFFFFFFFull || function == 0 || !PyDict_Check(overloads) ||
      !PyList_Check(callbacks)) {
    return false;
  }
  const char* p = PyUnicode_AsUTF8(packing);
  if (!p) {
    PyErr_Clear();
    return false;
  }
  plan->packing = p;
  for (char c : plan->packing) {
    if (!std::strchr("AibfdczM", c)) return false;
  }
  // One kernel, one compiler: Numba's arrays and memrefs never mix.
  const bool memref = plan->packing.find('M') != std::string::npos;
  if (memref && plan->packing.find('A') != std::string::npos) return false;
  plan->abi = memref ? ArrayAbi::kMemref : ArrayAbi::kNumba;
  plan->function = reinterpret_cast<cuda::CUfunction>(function);
  plan->shared_mem = static_cast<unsigned>(shared_mem);
  plan->cooperative = cooperative != 0;
  Py_INCREF(keep);
  plan->keep = keep;
  Py_INCREF(overloads);
  plan->overloads = overloads;
  plan->overload_count = PyDict_GET_SIZE(overloads);
  Py_INCREF(callbacks);
  plan->callbacks = callbacks;
  return true;
}

void StorePlan(const PlanKey& key, std::shared_ptr<Plan> plan) {
  PlanMap& plans = Plans();
  if (plans.size() >= kMaxPlans) ClearLaunchPlans();
  Py_INCREF(key.cfg);
  plan->cfg = key.cfg;
  // A plan replaced here is released only once the map is consistent again:
  // releasing it may run Python (a finaliser) that uses the cache.
  std::shared_ptr<Plan>& slot = Plans()[key];
  std::shared_ptr<Plan> replaced = std::move(slot);
  slot = std::move(plan);
}

void ClearLaunchPlans() {
  // Swapped out first: dropping a reference may run Python (a finaliser)
  // that launches again and touches the cache.
  PlanMap dropped;
  dropped.swap(Plans());
}

size_t LaunchPlanCount() { return Plans().size(); }

std::vector<uintptr_t> LaunchPlanFunctions() {
  std::vector<uintptr_t> functions;
  for (const auto& [key, plan] : Plans()) {
    if (plan->reason < 0) {
      functions.push_back(reinterpret_cast<uintptr_t>(plan->function));
    }
  }
  return functions;
}

}  // namespace numbax
