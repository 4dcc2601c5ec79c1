// The call site of one numba_cuda_kernel custom call: its key and the
// loaded kernel it resolved to at XLA's instantiate stage.
#pragma once

#include <Python.h>

#include <memory>
#include <string>
#include <string_view>

#include "graph_cache.h"
#include "loaded_kernel.h"
#include "xla/ffi/api/ffi.h"

namespace numbax {

class KernelSite {
 public:
  static ::xla::ffi::TypeId id;

  // Resolves `key` through numbax's Python registry (takes the GIL).
  static ::xla::ffi::ErrorOr<std::unique_ptr<KernelSite>> Create(
      std::string_view key);
  ~KernelSite();

  const std::string& key() const { return key_; }
  const LoadedKernel& loaded() const { return loaded_; }
  // Graphs of batches launched slice by slice (kernel_handler.cc).
  GraphCache& graphs() { return graphs_; }

 private:
  KernelSite() = default;
  std::string key_;
  LoadedKernel loaded_;
  PyObject* owner_ = nullptr;  // keeps the Numba dispatcher (and module) alive
  GraphCache graphs_;
};

// Sets the Python function that resolves keys of kernels:
//   (key) -> numbax._core.LoadedKernel
void SetKernelResolver(PyObject* resolver);

}  // namespace numbax
