// The CUDA driver API, loaded with dlopen at run time.
//
// numbax never links libcuda: the extension must import, and the CPU path must
// work, on a machine with no GPU and no driver. The few driver types we need
// are declared here with the driver's own ABI (opaque pointers and ints), so
// building needs no CUDA toolkit either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "status_codes.h"

namespace numbax::cuda {

using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUfunction = struct CUfunc_st*;
using CUkernel = struct CUkern_st*;
using CUdeviceptr = unsigned long long;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUgraphNode = struct CUgraphNode_st*;

constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr int CU_GRAPH_NODE_TYPE_KERNEL = 0;

// CUDA_KERNEL_NODE_PARAMS_v2: a kernel node's launch, as the graph API
// reads and writes it (`kern`/`ctx` are used when `func` is null).
struct KernelNodeParams {
  CUfunction func;
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_mem;
  void** kernel_params;
  void** extra;
  CUkernel kern;
  CUcontext ctx;
};

// CUgraphEdgeData: all zero for a plain (full) dependency.
struct GraphEdgeData {
  unsigned char from_port;
  unsigned char to_port;
  unsigned char type;
  unsigned char reserved[5];
};

// Function table filled by dlsym. A null entry means the symbol is missing
// from the installed driver; callers check the ones that are optional.
struct Driver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, unsigned, CUstream, void**,
                             void**);
  CUresult (*cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned,
                                        unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void**);
  CUresult (*cuKernelGetFunction)(CUfunction*, CUkernel);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int,
                                                          size_t);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph,
                                          unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  // Re-binding recorded graphs (graph_rebind.h); optional. The capture
  // info's _v3 (CUDA 12.3) adds edge data; _v2 is the fallback.
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int*, uint64_t*, CUgraph*,
                                        const CUgraphNode**,
                                        const GraphEdgeData**, size_t*);
  CUresult (*cuStreamGetCaptureInfo_v2)(CUstream, int*, uint64_t*, CUgraph*,
                                        const CUgraphNode**, size_t*);
  CUresult (*cuGraphNodeGetType)(CUgraphNode, int*);
  CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode*, size_t*);
  CUresult (*cuGraphKernelNodeGetParams)(CUgraphNode, KernelNodeParams*);
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode,
                                             const KernelNodeParams*);
};

// Loads libcuda once (thread-safe) and returns its table, or nullptr when no
// driver can be loaded; `why` then says what failed.
const Driver* Load(std::string* why = nullptr);

// "CUDA_ERROR_X (text)" for a driver result code.
std::string ErrorText(const Driver& driver, CUresult result);

// The primary context of `ordinal`, retained once per process and cached.
// Returns CUDA_SUCCESS or the driver's error.
CUresult PrimaryContext(const Driver& driver, int ordinal, CUcontext* out);

// Launches `function` (cooperatively when asked), or returns
// CUDA_ERROR_NOT_FOUND when the driver has no cooperative launch.
CUresult LaunchKernel(const Driver& driver, CUfunction function,
                      const unsigned grid[3], const unsigned block[3],
                      unsigned shared_mem, bool cooperative, CUstream stream,
                      void** params);

// The function of a Numba kernel handle in the current context, loaded
// there now (a CUkernel, where the driver has cuKernelGetFunction; else the
// handle is already a CUfunction), with its dynamic shared memory limit
// raised when `shared_mem` is above the default 48 KiB. Returns false, with
// `error` saying why, when the driver refuses.
bool KernelFunction(const Driver& driver, CUkernel kernel, int64_t shared_mem,
                    CUfunction* out, std::string* error);

// The nodes the next work captured on `stream` will depend on (the capture's
// tail), in `nodes`. Returns false when `stream` is not being captured, the
// driver cannot say, or a dependency is not a plain one (edge data).
bool CaptureTail(const Driver& driver, CUstream stream,
                 std::vector<CUgraphNode>* nodes);

// Makes the primary context of a device current on this thread for the
// lifetime of the object, then restores whatever was current before.
class ScopedDevice {
 public:
  ScopedDevice(const Driver& driver, int ordinal);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  CUresult status() const { return status_; }

 private:
  const Driver& driver_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
  CUresult status_ = CUDA_SUCCESS;
};

}  // namespace numbax::cuda
