// NVTX ranges (csrc/nvtx.h): the injection handshake with a fake tool, in
// process and as a library loaded from a path, and nothing at all without
// a tool. No GPU and no NVTX install needed.
#include "nvtx.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <string>
#include <vector>

namespace nvtx = numbax::nvtx;

namespace {

std::vector<std::string> g_events;

int FakePush(const char* name) {
  g_events.push_back(std::string("push ") + name);
  return 0;
}

int FakePop() {
  g_events.push_back("pop");
  return 0;
}

// What a tool does in InitializeInjectionNvtx2: read the export tables,
// then write its functions into the core module's slots.
nvtx::FunctionTable CoreTable(nvtx::GetExportTableFn get, unsigned* size) {
  const auto* callbacks = static_cast<const nvtx::ExportTableCallbacks*>(
      get(nvtx::kExportTableCallbacks));
  if (callbacks == nullptr) return nullptr;
  nvtx::FunctionTable table = nullptr;
  if (!callbacks->GetModuleFunctionTable(nvtx::kModuleCore, &table, size)) {
    return nullptr;
  }
  return table;
}

int FakeTool(nvtx::GetExportTableFn get) {
  unsigned size = 0;
  nvtx::FunctionTable table = CoreTable(get, &size);
  if (table == nullptr) return 0;
  *table[nvtx::kCoreRangePushA] =
      reinterpret_cast<nvtx::FunctionPointer>(&FakePush);
  *table[nvtx::kCoreRangePop] =
      reinterpret_cast<nvtx::FunctionPointer>(&FakePop);
  return 1;
}

int RefusingTool(nvtx::GetExportTableFn get) {
  FakeTool(get);  // fills the slots, then says it did not attach
  return 0;
}

int PushOnlyTool(nvtx::GetExportTableFn get) {
  unsigned size = 0;
  nvtx::FunctionTable table = CoreTable(get, &size);
  *table[nvtx::kCoreRangePushA] =
      reinterpret_cast<nvtx::FunctionPointer>(&FakePush);
  return 1;
}

class Nvtx : public ::testing::Test {
 protected:
  void SetUp() override {
    nvtx::Detach();
    g_events.clear();
  }
  void TearDown() override { nvtx::Detach(); }
};

TEST_F(Nvtx, WithoutAToolRangesDoNothing) {
  EXPECT_FALSE(nvtx::Attached());
  { nvtx::Range range("op"); }
  EXPECT_TRUE(g_events.empty());
}

TEST_F(Nvtx, AFakeToolSeesEveryRangeWithItsName) {
  ASSERT_TRUE(nvtx::Attach(&FakeTool));
  EXPECT_TRUE(nvtx::Attached());
  {
    nvtx::Range outer("outer_op");
    nvtx::Range inner("double");
  }
  const std::vector<std::string> want = {"push outer_op", "push double", "pop",
                                         "pop"};
  EXPECT_EQ(g_events, want);
}

TEST_F(Nvtx, DetachStopsTheRangesButPopsAnOpenOne) {
  ASSERT_TRUE(nvtx::Attach(&FakeTool));
  {
    nvtx::Range open("open");
    nvtx::Detach();
    nvtx::Range after("after");
  }
  const std::vector<std::string> want = {"push open", "pop"};
  EXPECT_EQ(g_events, want);
}

TEST_F(Nvtx, AToolThatDeclinesOrFillsHalfIsNotUsed) {
  EXPECT_FALSE(nvtx::Attach(&RefusingTool));
  EXPECT_FALSE(nvtx::Attached());
  EXPECT_FALSE(nvtx::Attach(&PushOnlyTool));
  EXPECT_FALSE(nvtx::Attached());
  EXPECT_FALSE(nvtx::Attach(nullptr));
  { nvtx::Range range("op"); }
  EXPECT_TRUE(g_events.empty());
}

TEST_F(Nvtx, ExportTablesAreNvtxs) {
  const auto* version = static_cast<const nvtx::ExportTableVersionInfo*>(
      nvtx::GetExportTable(nvtx::kExportTableVersionInfo));
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version->struct_size, sizeof(nvtx::ExportTableVersionInfo));
  EXPECT_EQ(version->version, 3u);
  ASSERT_NE(version->SetInjectionNvtxVersion, nullptr);
  version->SetInjectionNvtxVersion(3);
  EXPECT_EQ(nvtx::GetExportTable(0), nullptr);
  EXPECT_EQ(nvtx::GetExportTable(2), nullptr);
  EXPECT_EQ(nvtx::GetExportTable(4), nullptr);

  const auto* callbacks = static_cast<const nvtx::ExportTableCallbacks*>(
      nvtx::GetExportTable(nvtx::kExportTableCallbacks));
  ASSERT_NE(callbacks, nullptr);
  EXPECT_EQ(callbacks->struct_size, sizeof(nvtx::ExportTableCallbacks));
  // Every module NVTX v3 has, with its size; slot 0 and the last are null,
  // every other entry a distinct writable slot.
  const struct {
    int module;
    unsigned size;
  } modules[] = {{nvtx::kModuleCore, 16},   {nvtx::kModuleCuda, 9},
                 {nvtx::kModuleOpenCL, 15}, {nvtx::kModuleCudaRt, 7},
                 {nvtx::kModuleCore2, 16},  {nvtx::kModuleSync, 7}};
  for (const auto& m : modules) {
    SCOPED_TRACE(m.module);
    nvtx::FunctionTable table = nullptr;
    unsigned size = 0;
    ASSERT_EQ(callbacks->GetModuleFunctionTable(m.module, &table, &size), 1);
    EXPECT_EQ(size, m.size);
    EXPECT_EQ(table[0], nullptr);
    EXPECT_EQ(table[size], nullptr);
    for (unsigned i = 1; i < size; ++i) {
      ASSERT_NE(table[i], nullptr);
      if (i > 1) {
        EXPECT_NE(table[i], table[i - 1]);
      }
    }
  }
  nvtx::FunctionTable table = nullptr;
  unsigned size = 0;
  EXPECT_EQ(callbacks->GetModuleFunctionTable(0, &table, &size), 0);
  EXPECT_EQ(callbacks->GetModuleFunctionTable(7, &table, &size), 0);
}

TEST_F(Nvtx, AToolLibraryLoadedFromItsPath) {
  ASSERT_TRUE(nvtx::AttachLibrary(NUMBAX_FAKE_NVTX_TOOL));
  void* lib = dlopen(NUMBAX_FAKE_NVTX_TOOL, RTLD_LAZY | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto log = reinterpret_cast<const char* (*)()>(dlsym(lib, "fake_tool_log"));
  auto clear = reinterpret_cast<void (*)()>(dlsym(lib, "fake_tool_clear"));
  ASSERT_NE(log, nullptr);
  clear();
  { nvtx::Range range("numbax_op"); }
  EXPECT_EQ(std::string(log()), "push(numbax_op)pop");
  nvtx::Detach();
  { nvtx::Range range("unseen"); }
  EXPECT_EQ(std::string(log()), "push(numbax_op)pop");
  dlclose(lib);
}

// CTest runs each test in a process of its own (gtest_discover_tests), so
// AttachFromEnvironment's once-per-process answer is this test's.
TEST_F(Nvtx, TheEnvironmentNamesTheTool) {
  ASSERT_EQ(setenv("NVTX_INJECTION64_PATH", NUMBAX_FAKE_NVTX_TOOL, 1), 0);
  EXPECT_TRUE(nvtx::AttachFromEnvironment());
  EXPECT_TRUE(nvtx::Attached());
  // Once per process: the variable is not read again.
  unsetenv("NVTX_INJECTION64_PATH");
  EXPECT_TRUE(nvtx::AttachFromEnvironment());
}

TEST_F(Nvtx, NoVariableNoTool) {
  unsetenv("NVTX_INJECTION64_PATH");
  EXPECT_FALSE(nvtx::AttachFromEnvironment());
  EXPECT_FALSE(nvtx::Attached());
}

TEST_F(Nvtx, LibrariesThatAreNoToolAreNotUsed) {
  EXPECT_FALSE(nvtx::AttachLibrary(nullptr));
  EXPECT_FALSE(nvtx::AttachLibrary(""));
  EXPECT_FALSE(nvtx::AttachLibrary("/nonexistent/libNoSuchTool.so"));
  // Loads, but has no InitializeInjectionNvtx2.
  EXPECT_FALSE(nvtx::AttachLibrary("libm.so.6"));
  EXPECT_FALSE(nvtx::Attached());
}

}  // namespace
