// NVTX ranges named after each op's calls, for Nsight Systems and other
// NVTX tools, at no measurable cost when no tool is attached.
//
// NVTX v3 is a header-only API whose calls reach a tool through function
// pointers the tool fills in: at the first call, NVTX loads the library that
// NVTX_INJECTION64_PATH names (Nsight Systems and Nsight Compute set it for
// the processes they profile), calls its InitializeInjectionNvtx2 with an
// export-table getter, and the tool writes its own functions into the
// tables it gets. numbax implements that handshake itself, for the core
// module's RangePushA and RangePop, so that building needs no CUDA toolkit
// and nothing is linked: the protocol's types and table layouts below are
// NVTX's (nvtx3/nvtxDetail/nvtxTypes.h and nvtxImpl.h, Apache-2.0 WITH
// LLVM-exception), spelled out.
//
// Attach() runs once, at the extension's import (module.cc). Without a
// tool, a call's Range costs one load and one predictable branch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace numbax::nvtx {

// NVTX's callback modules (NvtxCallbackModule) and the core module's ids
// (NvtxCallbackIdCore) numbax fills, as NVTX numbers them.
enum Module : int {
  kModuleInvalid = 0,
  kModuleCore = 1,
  kModuleCuda = 2,
  kModuleOpenCL = 3,
  kModuleCudaRt = 4,
  kModuleCore2 = 5,
  kModuleSync = 6,
};
constexpr int kCoreRangePushA = 9;
constexpr int kCoreRangePop = 11;
// Each module's NVTX_CBID_*_SIZE: the ids of a table run from 1 to size-1.
constexpr unsigned kCoreSize = 16, kCudaSize = 9, kOpenCLSize = 15,
                   kCudaRtSize = 7, kCore2Size = 16, kSyncSize = 7;

// Export table ids (NvtxExportTableID).
constexpr uint32_t kExportTableCallbacks = 1;
constexpr uint32_t kExportTableVersionInfo = 3;
constexpr uint32_t kNvtxVersion = 3;

using FunctionPointer = void (*)();
using FunctionTable = FunctionPointer**;
using GetExportTableFn = const void* (*)(uint32_t export_table_id);
// The tool's entry point: non-zero when it attached.
using InitializeInjectionFn = int (*)(GetExportTableFn);

// NvtxExportTableCallbacks and NvtxExportTableVersionInfo.
struct ExportTableCallbacks {
  std::size_t struct_size;
  int (*GetModuleFunctionTable)(int module, FunctionTable* out_table,
                                unsigned* out_size);
};
struct ExportTableVersionInfo {
  std::size_t struct_size;
  uint32_t version;
  uint32_t reserved0;
  void (*SetInjectionNvtxVersion)(uint32_t version);
};

// What NVTX hands a tool: the getter InitializeInjectionNvtx2 receives.
const void* GetExportTable(uint32_t export_table_id);

// Attaches to the tool NVTX_INJECTION64_PATH names, if any (once per
// process: later calls return the first result). True when a tool filled
// in both RangePushA and RangePop.
bool AttachFromEnvironment();
// The same for a library path (tests), or an entry point already in hand
// (tests): any earlier tool is detached first. False, with nothing
// attached, when the library does not load, lacks the entry point, the
// entry point returns 0, or the tool leaves either function unset.
bool AttachLibrary(const char* path);
bool Attach(InitializeInjectionFn initialize);
// Forgets the tool's functions (tests): ranges cost nothing again.
void Detach();
bool Attached();

namespace detail {
using RangePushA = int (*)(const char*);
using RangePop = int (*)();
// Set together, pop first: a non-null push implies a non-null pop.
extern std::atomic<RangePushA> range_push;
extern std::atomic<RangePop> range_pop;
}  // namespace detail

// One NVTX range on this thread for the object's life: pushed with `name`,
// popped when it goes out of scope. Does nothing without a tool.
class Range {
 public:
  explicit Range(const char* name) {
    detail::RangePushA push =
        detail::range_push.load(std::memory_order_acquire);
    if (__builtin_expect(push != nullptr, 0)) {
      pop_ = detail::range_pop.load(std::memory_order_relaxed);
      push(name);
    }
  }
  ~Range() {
    if (pop_) pop_();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  detail::RangePop pop_ = nullptr;
};

}  // namespace numbax::nvtx
