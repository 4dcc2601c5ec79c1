#include "cuda_driver.h"

#include <dlfcn.h>

#include <array>
#include <mutex>

namespace numbax::cuda {
namespace {

constexpr int kMaxDevices = 64;

template <typename Fn>
void Resolve(void* lib, const char* name, Fn*& slot) {
  slot = reinterpret_cast<Fn*>(dlsym(lib, name));
}

Driver LoadTable(void* lib) {
  Driver d{};
  Resolve(lib, "cuInit", d.cuInit);
  Resolve(lib, "cuGetErrorName", d.cuGetErrorName);
  Resolve(lib, "cuGetErrorString", d.cuGetErrorString);
  Resolve(lib, "cuDeviceGet", d.cuDeviceGet);
  Resolve(lib, "cuDeviceGetCount", d.cuDeviceGetCount);
  Resolve(lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute);
  Resolve(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
  Resolve(lib, "cuCtxGetCurrent", d.cuCtxGetCurrent);
  Resolve(lib, "cuCtxSetCurrent", d.cuCtxSetCurrent);
  Resolve(lib, "cuStreamGetCtx", d.cuStreamGetCtx);
  Resolve(lib, "cuStreamIsCapturing", d.cuStreamIsCapturing);
  Resolve(lib, "cuStreamBeginCapture_v2", d.cuStreamBeginCapture);
  Resolve(lib, "cuStreamEndCapture", d.cuStreamEndCapture);
  Resolve(lib, "cuStreamSynchronize", d.cuStreamSynchronize);
  Resolve(lib, "cuStreamCreate", d.cuStreamCreate);
  Resolve(lib, "cuLaunchKernel", d.cuLaunchKernel);
  Resolve(lib, "cuLaunchCooperativeKernel", d.cuLaunchCooperativeKernel);
  Resolve(lib, "cuKernelGetFunction", d.cuKernelGetFunction);
  Resolve(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute);
  Resolve(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
          d.cuOccupancyMaxActiveBlocksPerMultiprocessor);
  Resolve(lib, "cuMemsetD8Async", d.cuMemsetD8Async);
  Resolve(lib, "cuMemcpyDtoDAsync_v2", d.cuMemcpyDtoDAsync);
  Resolve(lib, "cuGraphInstantiateWithFlags", d.cuGraphInstantiateWithFlags);
  Resolve(lib, "cuGraphLaunch", d.cuGraphLaunch);
  Resolve(lib, "cuGraphDestroy", d.cuGraphDestroy);
  Resolve(lib, "cuGraphExecDestroy", d.cuGraphExecDestroy);
  Resolve(lib, "cuStreamGetCaptureInfo_v3", d.cuStreamGetCaptureInfo_v3);
  Resolve(lib, "cuStreamGetCaptureInfo_v2", d.cuStreamGetCaptureInfo_v2);
  Resolve(lib, "cuGraphNodeGetType", d.cuGraphNodeGetType);
  Resolve(lib, "cuGraphGetNodes", d.cuGraphGetNodes);
  Resolve(lib, "cuGraphKernelNodeGetParams_v2", d.cuGraphKernelNodeGetParams);
  Resolve(lib, "cuGraphExecKernelNodeSetParams_v2",
          d.cuGraphExecKernelNodeSetParams);
  return d;
}

struct Loaded {
  Driver table{};
  bool ok = false;
  std::string why;
};

const Loaded& LoadOnce() {
  // Leaked on purpose: handlers may run during interpreter shutdown.
  static const Loaded* loaded = [] {
    auto* l = new Loaded;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = dlerror();
      l->why = std::string("could not load the CUDA driver (libcuda.so.1): ") +
               (err ? err : "unknown dlopen error");
      return l;
    }
    l->table = LoadTable(lib);
    const Driver& d = l->table;
    if (!d.cuInit || !d.cuDeviceGet || !d.cuDevicePrimaryCtxRetain ||
        !d.cuCtxGetCurrent || !d.cuCtxSetCurrent || !d.cuLaunchKernel ||
        !d.cuMemsetD8Async || !d.cuMemcpyDtoDAsync) {
      l->why = "the CUDA driver lacks required entry points (too old?)";
      return l;
    }
    CUresult r = d.cuInit(0);
    if (r != CUDA_SUCCESS) {
      l->why = "cuInit failed: " + ErrorText(d, r);
      return l;
    }
    l->ok = true;
    return l;
  }();
  return *loaded;
}

}  // namespace

const Driver* Load(std::string* why) {
  const Loaded& l = LoadOnce();
  if (!l.ok) {
    if (why) *why = l.why;
    return nullptr;
  }
  return &l.table;
}

std::string ErrorText(const Driver& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName) driver.cuGetErrorName(result, &name);
  if (driver.cuGetErrorString) driver.cuGetErrorString(result, &text);
  std::string out = name ? name : "CUDA_ERROR_" + std::to_string(result);
  if (text) out += std::string(" (") + text + ")";
  return out;
}

CUresult PrimaryContext(const Driver& driver, int ordinal, CUcontext* out) {
  static std::array<CUcontext, kMaxDevices> contexts{};
  static std::mutex mutex;
  if (ordinal < 0 || ordinal >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  // Fast path without the lock: a context, once stored, never changes.
  if (CUcontext c = __atomic_load_n(&contexts[ordinal], __ATOMIC_ACQUIRE)) {
    *out = c;
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (!contexts[ordinal]) {
    CUdevice device;
    CUresult r = driver.cuDeviceGet(&device, ordinal);
    if (r != CUDA_SUCCESS) return r;
    CUcontext c = nullptr;
    // Retained for the life of the process, as XLA and Numba do: both use
    // the same primary context, so the three agree on device memory.
    r = driver.cuDevicePrimaryCtxRetain(&c, device);
    if (r != CUDA_SUCCESS) return r;
    __atomic_store_n(&contexts[ordinal], c, __ATOMIC_RELEASE);
  }
  *out = contexts[ordinal];
  return CUDA_SUCCESS;
}

CUresult LaunchKernel(const Driver& driver, CUfunction function,
                      const unsigned grid[3], const unsigned block[3],
                      unsigned shared_mem, bool cooperative, CUstream stream,
                      void** params) {
  if (!cooperative) {
    return driver.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0],
                                 block[1], block[2], shared_mem, stream, params,
                                 nullptr);
  }
  if (!driver.cuLaunchCooperativeKernel) return CUDA_ERROR_NOT_FOUND;
  return driver.cuLaunchCooperativeKernel(function, grid[0], grid[1], grid[2],
                                          block[0], block[1], block[2],
                                          shared_mem, stream, params);
}

bool CaptureTail(const Driver& driver, CUstream stream,
                 std::vector<CUgraphNode>* nodes) {
  int status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUgraphNode* deps = nullptr;
  size_t count = 0;
  CUresult r;
  if (driver.cuStreamGetCaptureInfo_v3) {
    const GraphEdgeData* edges = nullptr;
    r = driver.cuStreamGetCaptureInfo_v3(stream, &status, nullptr, nullptr,
                                         &deps, &edges, &count);
    // A programmatic (or otherwise special) edge is not a plain chain.
    for (size_t i = 0; r == CUDA_SUCCESS && edges && i < count; ++i) {
      const GraphEdgeData& e = edges[i];
      if (e.from_port || e.to_port || e.type) return false;
    }
  } else if (driver.cuStreamGetCaptureInfo_v2) {
    r = driver.cuStreamGetCaptureInfo_v2(stream, &status, nullptr, nullptr,
                                         &deps, &count);
  } else {
    return false;
  }
  if (r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    return false;
  }
  nodes->assign(deps, deps + count);
  return true;
}

bool KernelFunction(const Driver& driver, CUkernel kernel, int64_t shared_mem,
                    CUfunction* out, std::string* error) {
  CUfunction f = nullptr;
  if (driver.cuKernelGetFunction) {
    CUresult r = driver.cuKernelGetFunction(&f, kernel);
    if (r != CUDA_SUCCESS) {
      *error = "cuKernelGetFunction: " + ErrorText(driver, r);
      return false;
    }
  } else {
    f = reinterpret_cast<CUfunction>(kernel);
  }
  if (shared_mem > 48 * 1024 && driver.cuFuncSetAttribute) {
    CUresult r = driver.cuFuncSetAttribute(
        f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        static_cast<int>(shared_mem));
    if (r != CUDA_SUCCESS) {
      *error = "shared_mem=" + std::to_string(shared_mem) +
               " bytes is more than the device allows: " + ErrorText(driver, r);
      return false;
    }
  }
  *out = f;
  return true;
}

ScopedDevice::ScopedDevice(const Driver& driver, int ordinal)
    : driver_(driver) {
  CUcontext target = nullptr;
  status_ = PrimaryContext(driver, ordinal, &target);
  if (status_ != CUDA_SUCCESS) return;
  status_ = driver.cuCtxGetCurrent(&previous_);
  if (status_ != CUDA_SUCCESS) return;
  if (previous_ != target) {
    status_ = driver.cuCtxSetCurrent(target);
    switched_ = status_ == CUDA_SUCCESS;
  }
}

ScopedDevice::~ScopedDevice() {
  if (switched_) driver_.cuCtxSetCurrent(previous_);
}

}  // namespace numbax::cuda
