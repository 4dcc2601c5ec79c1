// A stand-in for an NVTX tool's injection library (Nsight Systems' is one),
// loaded by nvtx_test.cc through the path NVTX_INJECTION64_PATH would give:
// its InitializeInjectionNvtx2 fills the core module's RangePushA and
// RangePop with functions that log the ranges, which the test reads back
// through fake_tool_log() (fake_tool_clear() empties the log).
#include <cstdint>
#include <string>

namespace {

using FunctionPointer = void (*)();
using FunctionTable = FunctionPointer**;
struct ExportTableCallbacks {
  size_t struct_size;
  int (*GetModuleFunctionTable)(int module, FunctionTable* out_table,
                                unsigned* out_size);
};

std::string g_log;

int PushA(const char* name) {
  g_log += "push(" + std::string(name) + ")";
  return 0;
}

int Pop() {
  g_log += "pop";
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const char* fake_tool_log() {
  return g_log.c_str();
}

extern "C" __attribute__((visibility("default"))) void fake_tool_clear() {
  g_log.clear();
}

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    const void* (*get_export_table)(uint32_t)) {
  const auto* callbacks =
      static_cast<const ExportTableCallbacks*>(get_export_table(1));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(*callbacks)) {
    return 0;
  }
  FunctionTable table = nullptr;
  unsigned size = 0;
  if (!callbacks->GetModuleFunctionTable(1, &table, &size) || size <= 11) {
    return 0;
  }
  *table[9] = reinterpret_cast<FunctionPointer>(&PushA);
  *table[11] = reinterpret_cast<FunctionPointer>(&Pop);
  return 1;
}
