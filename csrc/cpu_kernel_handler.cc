// numba_kernel's FFI handlers on JAX's CPU backend.
//
// Call frame -> checked buffer views -> the generated @cfunc wrapper, which
// builds Numba arrays over XLA's buffers and calls the user's @njit kernel
// natively. No Python and no GIL per call; nothing allocated per call on
// the plain path (Execute's argument arrays are on the stack; the generic
// path reuses vectors per thread). Only a failed call enters Python, to say
// what the kernel raised.
#include "cpu_kernel_handler.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "call_frame.h"
#include "counters.h"
#include "cpu_kernel_chunks.h"
#include "cpu_pool.h"
#include "ffi_binding.h"
#include "interpreter.h"
#include "python_errors.h"

namespace numbax {

namespace ffi = ::xla::ffi;

namespace {
PyObject* g_cpu_kernel_resolver = nullptr;

// Numba's workqueue threading layer aborts the process when two threads
// run @njit(parallel=True) code at once ("Concurrent access has been
// detected"), which XLA does with independent ops once no GIL serialises
// them. Such kernels (which use every core anyway) run one at a time.
std::mutex g_parallel_kernels;

// Reads a tuple of ints into `out`; false on anything else.
bool ReadInts(PyObject* seq, std::vector<int64_t>* out) {
  if (!PyTuple_Check(seq)) return false;
  out->clear();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); ++i) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) return false;
    out->push_back(v);
  }
  return true;
}
}  // namespace

ffi::TypeId CpuKernelSite::id = {};

void SetCpuKernelResolver(PyObject* resolver) {
  Py_XINCREF(resolver);
  g_cpu_kernel_resolver = resolver;  // the previous one is leaked on purpose
}

ffi::ErrorOr<std::unique_ptr<CpuKernelSite>> CpuKernelSite::Create(
    std::string_view key) {
  InterpreterUse use;
  if (!use.admitted()) {
    return ffi::Unexpected(ffi::Error::Internal(kInterpreterNotRunning));
  }
  std::unique_ptr<CpuKernelSite> site(new CpuKernelSite);
  site->key_ = std::string(key);
  std::string error;
  GilScope gil;
  ++Counters().resolves;
  if (!g_cpu_kernel_resolver) {
    error =
        "numbax is not imported in this process; import it and create "
        "the numba_kernel op before running the program";
  } else if (PyObject* t =
                 PyObject_CallFunction(g_cpu_kernel_resolver, "s#", key.data(),
                                       static_cast<Py_ssize_t>(key.size()))) {
    // (address, inputs, outputs, scalar bytes, range, batch axes,
    //  parallel, serialise, aliases, lead, trail, owner, diagnose)
    std::vector<int64_t> pairs;
    char* bytes = nullptr;
    Py_ssize_t nbytes = 0;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 13 ||
        !PyBytes_Check(PyTuple_GET_ITEM(t, 3))) {
      error =
          "numbax: the numba_kernel resolver returned a malformed site tuple";
    } else {
      site->wrapper_ = reinterpret_cast<CpuKernelWrapper>(
          PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0)));
      site->num_inputs_ = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
      site->num_outputs_ = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
      PyBytes_AsStringAndSize(PyTuple_GET_ITEM(t, 3), &bytes, &nbytes);
      site->range_ = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
      site->batch_ndim_ = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 5));
      site->parallel_ = PyObject_IsTrue(PyTuple_GET_ITEM(t, 6)) == 1;
      site->serialise_ = PyObject_IsTrue(PyTuple_GET_ITEM(t, 7)) == 1;
      if (PyErr_Occurred() || !site->wrapper_ ||
          !ReadInts(PyTuple_GET_ITEM(t, 8), &pairs) || pairs.size() % 2 ||
          !ReadInts(PyTuple_GET_ITEM(t, 9), &site->lead_) ||
          !ReadInts(PyTuple_GET_ITEM(t, 10), &site->trail_)) {
        PyErr_Clear();
        error =
            "numbax: the numba_kernel resolver returned a malformed site tuple";
      }
    }
    if (error.empty()) {
      for (size_t i = 0; i < pairs.size(); i += 2) {
        site->aliases_.push_back({pairs[i], pairs[i + 1]});
      }
      error =
          CheckAliases(site->aliases_, site->num_inputs_, site->num_outputs_);
      // Each scalar in 16 bytes (a complex128 fits), 8-byte aligned.
      site->scalar_words_.assign(static_cast<size_t>(nbytes) / 8, 0);
      if (nbytes) std::memcpy(site->scalar_words_.data(), bytes, nbytes);
      for (size_t i = 0; i + 2 <= site->scalar_words_.size(); i += 2) {
        site->scalar_ptrs_.push_back(&site->scalar_words_[i]);
      }
      site->owner_ = PyTuple_GET_ITEM(t, 11);
      site->diagnose_ = PyTuple_GET_ITEM(t, 12);
      Py_INCREF(site->owner_);
      Py_INCREF(site->diagnose_);
    }
    Py_DECREF(t);
  } else {
    error = TakePythonError();
  }
  if (!error.empty())
    return ffi::Unexpected(ffi::Error::InvalidArgument(error));
  return site;
}

CpuKernelSite::~CpuKernelSite() {
  if (!owner_ && !diagnose_) return;
  InterpreterUse use;
  if (!use.admitted()) return;  // leaked: see CallSite::~CallSite
  GilScope gil;
  Py_CLEAR(owner_);
  Py_CLEAR(diagnose_);
}

std::string CpuKernelSite::FailureMessage(
    int32_t status, const std::vector<void*>& data,
    const std::vector<const int64_t*>& dims,
    const std::vector<int64_t>& ranks) const {
  std::string what = StatusText(status);
  if (!aliases_.empty()) {
    what +=
        " (numbax does not re-run it to show the exception: an aliased "
        "input may already be changed; call the kernel on numpy "
        "arrays to see it)";
    return OpMessage(OpKind::kCpuKernel, key_, what);
  }
  InterpreterUse use;
  if (!use.admitted() || !diagnose_) {
    return OpMessage(OpKind::kCpuKernel, key_, what);
  }
  GilScope gil;
  const int64_t n = num_inputs_ + num_outputs_;
  PyObject* addresses = PyList_New(n);
  PyObject* shapes = PyList_New(n);
  for (int64_t i = 0; addresses && shapes && i < n; ++i) {
    PyList_SET_ITEM(addresses, i, PyLong_FromVoidPtr(data[i]));
    PyObject* shape = PyTuple_New(ranks[i]);
    for (int64_t d = 0; shape && d < ranks[i]; ++d) {
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(dims[i][d]));
    }
    PyList_SET_ITEM(shapes, i, shape);
  }
  PyObject* text =
      (addresses && shapes)
          ? PyObject_CallFunctionObjArgs(diagnose_, addresses, shapes, nullptr)
          : nullptr;
  Py_XDECREF(addresses);
  Py_XDECREF(shapes);
  if (text && PyUnicode_Check(text)) {
    if (const char* utf8 = PyUnicode_AsUTF8(text)) what = utf8;
  }
  if (!text || PyErr_Occurred()) {
    what += " (its diagnostic re-run failed: " + TakePythonError() + ")";
  }
  Py_XDECREF(text);
  return OpMessage(OpKind::kCpuKernel, key_, what);
}

namespace {

ffi::ErrorOr<std::unique_ptr<CpuKernelSite>> Instantiate(ffi::RemainingArgs,
                                                         ffi::RemainingRets,
                                                         std::string_view key) {
  return CpuKernelSite::Create(key);
}

int32_t RunPart(const CpuKernelSite& site, void* const* data,
                const int64_t* const* dims, uint64_t begin, uint64_t end) {
  if (site.serialise()) {
    std::lock_guard<std::mutex> lock(g_parallel_kernels);
    return site.wrapper()(data, dims, begin, end);
  }
  return site.wrapper()(data, dims, begin, end);
}

// What a chunk of a parallel call needs: the caller's frame, alive until
// the last chunk is done.
struct PartContext {
  const CpuKernelSite* site;
  void* const* data;
  const int64_t* const* dims;
};

int32_t RunContextPart(const void* ctx, uint64_t begin, uint64_t end) {
  const auto* c = static_cast<const PartContext*>(ctx);
  return RunPart(*c->site, c->data, c->dims, begin, end);
}

// range(total) in chunks on XLA's intra-op pool (cpu_pool.h).
int32_t RunOnPool(ffi::ThreadPool& pool, const CpuKernelSite& site,
                  void* const* data, const int64_t* const* dims,
                  uint64_t total) {
  const PartContext ctx{&site, data, dims};
  return RunInChunks(pool, pool.num_threads(), total, RunContextPart, &ctx,
                     Board(), PoolSpin());
}

// Up to this many buffers and scalars, a plain call's argument arrays live
// on the stack.
constexpr size_t kFastSlots = 32;

// range(total) of a call: the launch range, times the vmapped slices
// (counted on output 0, which has every batch axis).
inline uint64_t CallTotal(const CpuKernelSite& site, const int64_t* out0_dims,
                          int64_t out0_rank) {
  uint64_t total = site.range() >= 0 ? static_cast<uint64_t>(site.range()) : 1;
  for (int64_t d = 0; d < site.batch_ndim() && d < out0_rank; ++d) {
    total *= static_cast<uint64_t>(out0_dims[d]);
  }
  return total;
}

ffi::Error ExecuteGeneric(ffi::ThreadPool& pool, CpuKernelSite* site,
                          ffi::RemainingArgs& args, ffi::RemainingRets& rets);

// The per-call floor: a call with no aliases and no unit axes to drop, whose
// buffers all check out, goes straight from the call frame to the wrapper
// with nothing allocated, no thread-local lookups and no ffi::Error built
// per buffer. Anything else (or a failed kernel) takes ExecuteGeneric,
// which says what is wrong as it always did.
ffi::Error Execute(ffi::ThreadPool pool, CpuKernelSite* site,
                   std::string_view /*key*/, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const size_t ni = args.size();
  const size_t n = ni + rets.size();
  const size_t slots = n + site->scalars().size();
  if (!site->fast() || slots > kFastSlots ||
      static_cast<int64_t>(ni) != site->num_inputs() ||
      static_cast<int64_t>(rets.size()) != site->num_outputs()) {
    return ExecuteGeneric(pool, site, args, rets);
  }
  void* data[kFastSlots];
  const int64_t* dims[kFastSlots];
  BufferView view;
  int64_t out0_rank = 0;
  for (size_t i = 0; i < ni; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value() ||
        !CheckBuffer(b->element_type(), b->untyped_data(),
                     b->dimensions().begin(),
                     static_cast<int64_t>(b->dimensions().size()), &view)) {
      return ExecuteGeneric(pool, site, args, rets);
    }
    data[i] = view.data;
    dims[i] = view.dims;
  }
  for (size_t i = ni; i < n; ++i) {
    auto r = rets.get<ffi::AnyBuffer>(i - ni);
    if (!r.has_value()) return ExecuteGeneric(pool, site, args, rets);
    const ffi::AnyBuffer b = *r->operator->();
    if (!CheckBuffer(b.element_type(), b.untyped_data(), b.dimensions().begin(),
                     static_cast<int64_t>(b.dimensions().size()), &view)) {
      return ExecuteGeneric(pool, site, args, rets);
    }
    data[i] = view.data;
    dims[i] = view.dims;
    if (i == ni) out0_rank = view.rank;
  }
  const auto& scalars = site->scalars();
  for (size_t i = 0; i < scalars.size(); ++i) {
    data[n + i] = scalars[i];
    dims[n + i] = nullptr;
  }
  const uint64_t total = site->batch_ndim() > 0
                             ? CallTotal(*site, dims[ni], out0_rank)
                             : CallTotal(*site, nullptr, 0);
  if (total == 0) return ffi::Error::Success();
  const int32_t status = site->parallel()
                             ? RunOnPool(pool, *site, data, dims, total)
                             : RunPart(*site, data, dims, 0, total);
  if (status == 0) return ffi::Error::Success();
  // The kernel failed: the generic path's error (it does not re-run it).
  std::vector<int64_t> ranks(n);
  for (size_t i = 0; i < ni; ++i) {
    ranks[i] =
        static_cast<int64_t>(args.get<ffi::AnyBuffer>(i)->dimensions().size());
  }
  for (size_t i = ni; i < n; ++i) {
    ranks[i] = static_cast<int64_t>(
        (*rets.get<ffi::AnyBuffer>(i - ni))->dimensions().size());
  }
  return ffi::Error::Internal(site->FailureMessage(
      status, std::vector<void*>(data, data + slots),
      std::vector<const int64_t*>(dims, dims + slots), ranks));
}

ffi::Error ExecuteGeneric(ffi::ThreadPool& pool, CpuKernelSite* site,
                          ffi::RemainingArgs& args, ffi::RemainingRets& rets) {
  thread_local std::vector<BufferView> buffers;
  thread_local std::vector<void*> data;
  thread_local std::vector<const int64_t*> dims;
  if (ffi::Error err = DecodeCallBuffers(args, rets, site->num_inputs(),
                                         site->num_outputs(), &buffers);
      err.failure()) {
    return ffi::Error::InvalidArgument(
        OpMessage(OpKind::kCpuKernel, site->key(), err.message()));
  }
  if (!site->lead_units().empty() || !site->trail_units().empty()) {
    if (ffi::Error err =
            DropUnitAxes(site->lead_units(), site->trail_units(), &buffers);
        err.failure()) {
      return ffi::Error::InvalidArgument(
          OpMessage(OpKind::kCpuKernel, site->key(), err.message()));
    }
  }
  if (!site->aliases().empty()) {
    // An aliased output starts out holding its input's values (aliases.h).
    const std::string bad = KeepAliasedInputs(
        nullptr, nullptr, buffers, site->num_inputs(), site->aliases());
    if (!bad.empty()) {
      return ffi::Error::Internal(
          OpMessage(OpKind::kCpuKernel, site->key(), bad));
    }
  }
  const size_t n = buffers.size();
  const auto& scalars = site->scalars();
  data.resize(n + scalars.size());
  dims.resize(n + scalars.size());
  for (size_t i = 0; i < n; ++i) {
    data[i] = buffers[i].data;
    dims[i] = buffers[i].dims;
  }
  for (size_t i = 0; i < scalars.size(); ++i) {
    data[n + i] = scalars[i];
    dims[n + i] = nullptr;
  }
  const uint64_t total =
      site->batch_ndim() > 0
          ? CallTotal(*site, buffers[site->num_inputs()].dims,
                      buffers[site->num_inputs()].rank)
          : CallTotal(*site, nullptr, 0);
  if (total == 0) return ffi::Error::Success();
  const int32_t status =
      site->parallel() ? RunOnPool(pool, *site, data.data(), dims.data(), total)
                       : RunPart(*site, data.data(), dims.data(), 0, total);
  if (status == 0) return ffi::Error::Success();
  std::vector<int64_t> ranks(n);
  for (size_t i = 0; i < n; ++i) ranks[i] = buffers[i].rank;
  return ffi::Error::Internal(site->FailureMessage(status, data, dims, ranks));
}

}  // namespace
}  // namespace numbax

XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxCpuKernelInstantiate, numbax::Instantiate,
                              numbax::BindInstantiate());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    NumbaxCpuKernelExecute, numbax::Execute,
    ::xla::ffi::Ffi::Bind()
        .Ctx<::xla::ffi::ThreadPool>()
        .Ctx<::xla::ffi::State<numbax::CpuKernelSite>>()
        .Attr<std::string_view>("key")
        .RemainingArgs()
        .RemainingRets());
