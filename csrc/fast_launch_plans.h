// The fast launch path's plan cache (fast_launch.h).
//
// A plan is what numbax recorded of one launch configuration's first
// launch on one device with one set of argument types: the function to
// launch, its grid, block and shared memory, and how to pack each argument.
// Plans are keyed by the configuration object, the device and the argument
// codes (launch_args.h), and live until ClearLaunchPlans. Everything here
// runs with the GIL held.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_driver.h"
#include "kernel_args.h"

namespace numbax {

struct PlanKey {
  PyObject* cfg = nullptr;
  int device = -1;
  std::vector<uint64_t> codes;
  bool operator==(const PlanKey& o) const {
    return cfg == o.cfg && device == o.device && codes == o.codes;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = reinterpret_cast<uintptr_t>(k.cfg) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint64_t>(k.device) + 0x632BE59BD9B4E019ull + (h << 6);
    for (uint64_t c : k.codes)
      h ^= c + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// One recorded launch. Holds strong references: the configuration (so its
// address, part of the key, cannot be reused by another object while the
// plan exists), the compiled kernel (whose module owns `function`), and
// the objects checked per launch.
struct Plan {
  PyObject* cfg = nullptr;
  PyObject* keep = nullptr;
  PyObject* overloads = nullptr;  // the dispatcher's overloads dict
  Py_ssize_t overload_count = 0;
  PyObject* callbacks = nullptr;  // cfg.pre_launch_callbacks (a list)
  void* stream = nullptr;         // the stream the configuration launches on
  int reason = -1;                // >= 0: never fast, for this reason
  // What cuLaunchKernel launches: the current context's CUfunction of the
  // kernel (ResolveFunction), or, where that was not looked up, the
  // CUkernel Numba launches (cuLaunchKernel takes one in place of a
  // CUfunction since CUDA 12 and runs it in the current context).
  cuda::CUfunction function = nullptr;
  bool resolved = false;  // `function` is a CUfunction (ResolveFunction)
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_mem = 0;
  bool cooperative = false;
  // Built from numbax's cache entry (LaunchFromCachedPlan): Numba has not
  // loaded the kernel. A call that must leave that to Numba
  // (ActiveCall::cached_plans false) records the plan again.
  bool from_entry = false;
  std::string packing;  // per argument: A array, i int, b bool, f float32,
                        // d float64, c complex64, z complex128, M array of
                        // a numba-cuda-mlir kernel (an MLIR memref)
  ArrayAbi abi = ArrayAbi::kNumba;  // kMemref when packing has an M

  ~Plan() {
    Py_XDECREF(cfg);
    Py_XDECREF(keep);
    Py_XDECREF(overloads);
    Py_XDECREF(callbacks);
  }
};

using PlanMap = std::unordered_map<PlanKey, std::shared_ptr<Plan>, PlanKeyHash>;
// Every plan, process-wide (leaked on purpose: exit order).
PlanMap& Plans();

// A func that builds a new configuration per call (a new stream object,
// a computed grid) makes a new plan each time; the cache is emptied when it
// grows past this, rather than growing without bound.
constexpr size_t kMaxPlans = 4096;

// Fills `plan` from the builder's tuple (function, grid, block, shared_mem,
// cooperative, packing, keep, overloads, callbacks). False if malformed.
bool ParsePlan(PyObject* t, Plan* plan);

// Stores `plan` under `key` (taking a reference to the configuration),
// emptying the cache first when it is full.
void StorePlan(const PlanKey& key, std::shared_ptr<Plan> plan);

// Drops every cached plan (and the references they hold).
void ClearLaunchPlans();
size_t LaunchPlanCount();
// The handle each launchable plan passes to cuLaunchKernel (tests).
std::vector<uintptr_t> LaunchPlanFunctions();

}  // namespace numbax
