#include "nvtx.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace numbax::nvtx {
namespace detail {
std::atomic<RangePushA> range_push{nullptr};
std::atomic<RangePop> range_pop{nullptr};
}  // namespace detail

namespace {

// The slots a tool writes its functions into, one array per module, and
// each module's table of pointers to them as NVTX lays it out: entry 0 and
// the last entry null, entry i pointing at slot i. numbax calls only the
// core module's RangePushA and RangePop; the other modules' slots exist so
// that a tool that fills every module it knows finds them (NVTX's own
// headers hand out all six).
template <unsigned Size>
struct ModuleTable {
  FunctionPointer slots[Size] = {};
  FunctionPointer* table[Size + 1] = {};
  ModuleTable() {
    for (unsigned i = 1; i < Size; ++i) table[i] = &slots[i];
  }
  void Clear() {
    for (FunctionPointer& s : slots) s = nullptr;
  }
};

struct Tables {
  ModuleTable<kCoreSize> core;
  ModuleTable<kCudaSize> cuda;
  ModuleTable<kOpenCLSize> opencl;
  ModuleTable<kCudaRtSize> cudart;
  ModuleTable<kCore2Size> core2;
  ModuleTable<kSyncSize> sync;
  void Clear() {
    core.Clear();
    cuda.Clear();
    opencl.Clear();
    cudart.Clear();
    core2.Clear();
    sync.Clear();
  }
};

Tables& GetTables() {
  static Tables tables;
  return tables;
}

template <unsigned Size>
int Hand(ModuleTable<Size>& m, FunctionTable* out_table, unsigned* out_size) {
  // NVTX's size: the entries of the table less one (the ids 0..Size-1).
  if (out_size) *out_size = Size;
  if (out_table) *out_table = m.table;
  return 1;
}

int GetModuleFunctionTable(int module, FunctionTable* out_table,
                           unsigned* out_size) {
  Tables& t = GetTables();
  switch (module) {
    case kModuleCore:
      return Hand(t.core, out_table, out_size);
    case kModuleCuda:
      return Hand(t.cuda, out_table, out_size);
    case kModuleOpenCL:
      return Hand(t.opencl, out_table, out_size);
    case kModuleCudaRt:
      return Hand(t.cudart, out_table, out_size);
    case kModuleCore2:
      return Hand(t.core2, out_table, out_size);
    case kModuleSync:
      return Hand(t.sync, out_table, out_size);
    default:
      return 0;  // as NVTX: a module this instance does not have
  }
}

void SetInjectionNvtxVersion(uint32_t) {}

const ExportTableCallbacks kCallbacks{sizeof(ExportTableCallbacks),
                                      &GetModuleFunctionTable};
const ExportTableVersionInfo kVersionInfo{
    sizeof(ExportTableVersionInfo), kNvtxVersion, 0, &SetInjectionNvtxVersion};

std::mutex& AttachMutex() {
  static std::mutex mu;
  return mu;
}

// A tool's library, once attached, stays loaded for the process (as NVTX
// leaves it): a range pushed before a Detach() is still popped through a
// pointer into it.
void DetachLocked() {
  detail::range_push.store(nullptr, std::memory_order_release);
  detail::range_pop.store(nullptr, std::memory_order_release);
  GetTables().Clear();
}

bool AttachLocked(InitializeInjectionFn initialize) {
  DetachLocked();
  if (initialize == nullptr || initialize(&GetExportTable) == 0) {
    GetTables().Clear();
    return false;
  }
  Tables& t = GetTables();
  auto push =
      reinterpret_cast<detail::RangePushA>(t.core.slots[kCoreRangePushA]);
  auto pop = reinterpret_cast<detail::RangePop>(t.core.slots[kCoreRangePop]);
  if (push == nullptr || pop == nullptr) {
    // A push without its pop would leave ranges open: neither.
    GetTables().Clear();
    return false;
  }
  detail::range_pop.store(pop, std::memory_order_release);
  detail::range_push.store(push, std::memory_order_release);
  return true;
}

bool AttachLibraryLocked(const char* path) {
  DetachLocked();
  if (path == nullptr || *path == '\0') return false;
  void* lib = dlopen(path, RTLD_LAZY);
  if (lib == nullptr) return false;
  auto initialize = reinterpret_cast<InitializeInjectionFn>(
      dlsym(lib, "InitializeInjectionNvtx2"));
  if (initialize == nullptr || !AttachLocked(initialize)) {
    dlclose(lib);
    return false;
  }
  return true;
}

}  // namespace

const void* GetExportTable(uint32_t export_table_id) {
  switch (export_table_id) {
    case kExportTableCallbacks:
      return &kCallbacks;
    case kExportTableVersionInfo:
      return &kVersionInfo;
    default:
      return nullptr;
  }
}

bool AttachFromEnvironment() {
  static const bool attached = [] {
    std::lock_guard<std::mutex> lock(AttachMutex());
    return AttachLibraryLocked(std::getenv("NVTX_INJECTION64_PATH"));
  }();
  return attached;
}

bool AttachLibrary(const char* path) {
  std::lock_guard<std::mutex> lock(AttachMutex());
  return AttachLibraryLocked(path);
}

bool Attach(InitializeInjectionFn initialize) {
  std::lock_guard<std::mutex> lock(AttachMutex());
  return AttachLocked(initialize);
}

void Detach() {
  std::lock_guard<std::mutex> lock(AttachMutex());
  DetachLocked();
}

bool Attached() {
  return detail::range_push.load(std::memory_order_acquire) != nullptr;
}

}  // namespace numbax::nvtx
