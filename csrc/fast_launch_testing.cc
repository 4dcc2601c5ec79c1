#include "fast_launch_testing.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"
#include "fast_launch.h"
#include "kernel_args.h"
#include "launch_args.h"

namespace numbax {
namespace {

// The last dry launch, as it would have reached the driver.
DryLaunch& LastDryLaunch() {
  static auto* last = new DryLaunch();
  return *last;
}

}  // namespace

void SetDryRun(bool on) { SetDryLaunchRecord(on ? &LastDryLaunch() : nullptr); }

PyObject* LastLaunch() {
  const DryLaunch& d = LastDryLaunch();
  PyObject* words = PyList_New(static_cast<Py_ssize_t>(d.words.size()));
  if (!words) return nullptr;
  for (size_t i = 0; i < d.words.size(); ++i) {
    PyObject* w = PyLong_FromLongLong(d.words[i]);
    if (!w) {
      Py_DECREF(words);
      return nullptr;
    }
    PyList_SET_ITEM(words, static_cast<Py_ssize_t>(i), w);
  }
  return Py_BuildValue(
      "{s:K,s:(III),s:(III),s:I,s:O,s:K,s:N}", "function",
      static_cast<unsigned long long>(d.function), "grid", d.grid[0], d.grid[1],
      d.grid[2], "block", d.block[0], d.block[1], d.block[2], "shared_mem",
      d.shared_mem, "cooperative", d.cooperative ? Py_True : Py_False, "stream",
      static_cast<unsigned long long>(d.stream), "words", words);
}

PyObject* CallAsNumbax(PyObject* func, PyObject* arrays, PyObject* buffers,
                       void* stream, int device, bool enabled,
                       bool cached_plans) {
  if (!PyTuple_Check(arrays) || !PyList_Check(buffers) ||
      PyTuple_GET_SIZE(arrays) != PyList_GET_SIZE(buffers)) {
    PyErr_SetString(PyExc_ValueError,
                    "arrays (a tuple) and buffers (a list) must match");
    return nullptr;
  }
  static const ffi::DataType kTypes[] = {
      ffi::DataType::PRED, ffi::DataType::S8,  ffi::DataType::S16,
      ffi::DataType::S32,  ffi::DataType::S64, ffi::DataType::U8,
      ffi::DataType::U16,  ffi::DataType::U32, ffi::DataType::U64,
      ffi::DataType::F16,  ffi::DataType::F32, ffi::DataType::F64,
      ffi::DataType::C64,  ffi::DataType::C128};
  const Py_ssize_t n = PyList_GET_SIZE(buffers);
  std::vector<std::vector<int64_t>> dims(static_cast<size_t>(n));
  std::vector<BufferView> views(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    unsigned long long address;
    const char* dtype;
    PyObject* shape;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(buffers, i), "KsO!", &address, &dtype,
                          &PyTuple_Type, &shape)) {
      return nullptr;
    }
    BufferView& v = views[static_cast<size_t>(i)];
    for (ffi::DataType t : kTypes) {
      if (std::strcmp(LookupDType(t)->name, dtype) == 0) v.dtype = t;
    }
    const DTypeInfo* info = LookupDType(v.dtype);
    if (!info) {
      PyErr_Format(PyExc_ValueError, "unknown dtype %s", dtype);
      return nullptr;
    }
    std::vector<int64_t>& d = dims[static_cast<size_t>(i)];
    int64_t count = 1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(shape); ++k) {
      d.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k)));
      if (PyErr_Occurred()) return nullptr;
      count *= d.back();
    }
    v.data = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
    v.dims = d.data();
    v.rank = static_cast<int64_t>(d.size());
    v.element_count = count;
    v.nbytes = static_cast<size_t>(count) * info->itemsize;
  }
  ActiveCall call;
  call.buffers = &views;
  call.arrays = &PyTuple_GET_ITEM(arrays, 0);
  call.stream = stream;
  call.device = device;
  call.cuda = true;
  call.enabled = enabled;
  call.cached_plans = cached_plans;
  ActiveCallScope scope(&call);
  return PyObject_CallNoArgs(func);
}

PyObject* PackScalarForTest(char how, PyObject* value) {
  KernelArgs packed;
  if (!PackScalar(how, value, &packed)) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_ValueError, "cannot pack as '%c'", how);
    }
    return nullptr;
  }
  return PyBytes_FromStringAndSize(
      reinterpret_cast<const char*>(packed.words().data()),
      static_cast<Py_ssize_t>(packed.size() * sizeof(int64_t)));
}

double TimeDriverLaunches(uintptr_t function, const unsigned grid[3],
                          const unsigned block[3], const int64_t* words,
                          size_t word_count, uintptr_t stream, int count,
                          int mode) {
  const cuda::Driver* driver = cuda::Load();
  if (driver == nullptr) return -3.0;  // CUDA_ERROR_NOT_INITIALIZED
  std::vector<int64_t> copy(words, words + word_count);
  std::vector<void*> params(word_count);
  for (size_t i = 0; i < word_count; ++i) params[i] = &copy[i];
  size_t bytes = word_count * sizeof(int64_t);
  // The cuLaunchKernel `extra` protocol: a parameter buffer and its size.
  void* extra[] = {reinterpret_cast<void*>(uintptr_t{1}),  // BUFFER_POINTER
                   copy.data(),
                   reinterpret_cast<void*>(uintptr_t{2}),  // BUFFER_SIZE
                   &bytes, nullptr};                       // END
  const auto f = reinterpret_cast<cuda::CUfunction>(function);
  const auto s = reinterpret_cast<cuda::CUstream>(stream);
  cuda::CUresult r = cuda::CUDA_SUCCESS;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < count && r == cuda::CUDA_SUCCESS; ++i) {
    if (mode == 1) {
      Py_BEGIN_ALLOW_THREADS;
      r = driver->cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0],
                                 block[1], block[2], 0, s, params.data(),
                                 nullptr);
      Py_END_ALLOW_THREADS;
    } else if (mode == 2) {
      r = driver->cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0],
                                 block[1], block[2], 0, s, nullptr, extra);
    } else {
      r = driver->cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0],
                                 block[1], block[2], 0, s, params.data(),
                                 nullptr);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (r != cuda::CUDA_SUCCESS) return -static_cast<double>(r);
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace numbax
