#include "kernel_site.h"

#include "counters.h"
#include "interpreter.h"
#include "python_errors.h"

namespace numbax {

namespace ffi = ::xla::ffi;

namespace {
PyObject* g_kernel_resolver = nullptr;
}  // namespace

ffi::TypeId KernelSite::id = {};

void SetKernelResolver(PyObject* resolver) {
  Py_XINCREF(resolver);
  g_kernel_resolver = resolver;  // the previous one is leaked on purpose
}

ffi::ErrorOr<std::unique_ptr<KernelSite>> KernelSite::Create(
    std::string_view key) {
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Unexpected(ffi::Error::Internal(kInterpreterNotRunning));
  }
  std::unique_ptr<KernelSite> site(new KernelSite);
  site->key_ = std::string(key);
  std::string error;
  {
    GilScope gil;
    ++Counters().resolves;
    if (!g_kernel_resolver) {
      error =
          "numbax is not imported in this process; import it and create "
          "the kernel op before running the program";
    } else {
      PyObject* t = PyObject_CallFunction(g_kernel_resolver, "s#", key.data(),
                                          static_cast<Py_ssize_t>(key.size()));
      if (!t) {
        error = TakePythonError();
      } else {
        if (PyObject* owner = ReadLoadedKernel(t, &site->loaded_, &error)) {
          Py_INCREF(owner);
          site->owner_ = owner;
          // Each call's NVTX range: the op's name, or else its key.
          if (site->loaded_.name.empty()) site->loaded_.name = site->key_;
        }
        Py_DECREF(t);
      }
    }
  }
  if (!error.empty())
    return ffi::Unexpected(ffi::Error::InvalidArgument(error));
  return site;
}

KernelSite::~KernelSite() {
  // The graphs launch the owner's kernels: gone before the owner may be.
  graphs_.Clear();
  if (!owner_) return;
  InterpreterUse use;
  if (!use.admitted()) return;  // see CallSite::~CallSite
  GilScope gil;
  Py_CLEAR(owner_);
}

}  // namespace numbax
