// Tests for keeping input_output_aliases (csrc/aliases.*) without a GPU:
// the host copy the CPU handlers make, and the driver copy through a fake
// driver table.
#include "aliases.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using numbax::Alias;
using numbax::AliasList;
using numbax::BufferView;
using numbax::KeepAliasedInputs;

BufferView View(float* data, int64_t n) {
  BufferView v;
  v.data = data;
  v.element_count = n;
  v.nbytes = static_cast<size_t>(n) * sizeof(float);
  return v;
}

TEST(Aliases, CheckRefusesBadPairs) {
  EXPECT_EQ(numbax::CheckAliases({{0, 0}, {1, 1}}, 2, 2), "");
  EXPECT_NE(numbax::CheckAliases({{2, 0}}, 2, 1), "");
  EXPECT_NE(numbax::CheckAliases({{-1, 0}}, 2, 1), "");
  EXPECT_NE(numbax::CheckAliases({{0, 1}}, 2, 1), "");
  EXPECT_NE(numbax::CheckAliases({{0, 0}, {1, 0}}, 2, 1), "");
}

// Two buffers where XLA promised one: the output gets the input's values;
// the other outputs are left alone.
TEST(Aliases, HostCopyWhereXlaHandedTwoBuffers) {
  std::vector<float> in = {1, 2, 3}, other = {9, 9, 9};
  std::vector<float> out = {0, 0, 0}, free_out = {7, 7, 7};
  const auto before = numbax::AliasCopyCount().load();
  std::vector<BufferView> buffers = {View(in.data(), 3), View(other.data(), 3),
                                     View(free_out.data(), 3),
                                     View(out.data(), 3)};
  EXPECT_EQ(KeepAliasedInputs(nullptr, nullptr, buffers, 2, {{0, 1}}), "");
  EXPECT_EQ(out, in);
  EXPECT_EQ(free_out, (std::vector<float>{7, 7, 7}));
  EXPECT_EQ(numbax::AliasCopyCount().load(), before + 1);
}

TEST(Aliases, NoCopyWhenXlaKeptThePromise) {
  std::vector<float> in = {1, 2, 3};
  const auto before = numbax::AliasCopyCount().load();
  std::vector<BufferView> buffers = {View(in.data(), 3), View(in.data(), 3)};
  EXPECT_EQ(KeepAliasedInputs(nullptr, nullptr, buffers, 1, {{0, 0}}), "");
  EXPECT_EQ(numbax::AliasCopyCount().load(), before);
}

TEST(Aliases, RefusesDifferentSizesAndPartialOverlap) {
  std::vector<float> a(8, 1.0f), b(4, 0.0f);
  std::vector<BufferView> sizes = {View(a.data(), 8), View(b.data(), 4)};
  EXPECT_NE(KeepAliasedInputs(nullptr, nullptr, sizes, 1, {{0, 0}}), "");
  std::vector<BufferView> overlap = {View(a.data(), 4), View(a.data() + 2, 4)};
  const std::string why =
      KeepAliasedInputs(nullptr, nullptr, overlap, 1, {{0, 0}});
  EXPECT_NE(why.find("overlap"), std::string::npos) << why;
  EXPECT_EQ(a[2], 1.0f);  // nothing was written
}

// Two pairs whose buffers cross (output 1 is input 1's buffer while input
// 0 aliases output 1): copying would overwrite input 1 before it is read.
TEST(Aliases, RefusesACopyOverAnotherInput) {
  std::vector<float> a(4, 1.0f), b(4, 2.0f), c(4, 0.0f);
  std::vector<BufferView> buffers = {View(a.data(), 4), View(b.data(), 4),
                                     View(c.data(), 4), View(b.data(), 4)};
  const std::string why =
      KeepAliasedInputs(nullptr, nullptr, buffers, 2, {{0, 1}, {1, 0}});
  EXPECT_NE(why.find("overlaps input 1"), std::string::npos) << why;
  EXPECT_EQ(b, std::vector<float>(4, 2.0f));
}

// XLA's GPU dynamic_slice_fusion inside a loop reads the call's inputs from
// slices of a stacked buffer and writes the output into a slice of one: an
// in-place carry (acc.at[i + 1].set(op(acc[i], acc[i + 1]))) puts the
// aliased output on another input's slice. Copying the aliased input there
// would change that input before the kernel reads it (silently): refused,
// with nothing written, and the XLA flag that avoids it named.
TEST(Aliases, RefusesAnOutputOverAnotherInput) {
  std::vector<float> acc = {1, 2, 3, 4, 5, 6};
  std::vector<BufferView> buffers = {View(acc.data(), 2),       // x: acc[0:2]
                                     View(acc.data() + 2, 2),   // y: acc[2:4]
                                     View(acc.data() + 2, 2)};  // out over y
  const std::string why =
      KeepAliasedInputs(nullptr, nullptr, buffers, 2, {{0, 0}});
  EXPECT_NE(why.find("input 1"), std::string::npos) << why;
  EXPECT_NE(why.find("dynamic_slice_fusion"), std::string::npos) << why;
  EXPECT_EQ(acc, (std::vector<float>{1, 2, 3, 4, 5, 6}));

  // Crossed pairs handed each other's inputs: the first copy would destroy
  // what the second reads.
  std::vector<float> a = {1, 1}, b = {2, 2};
  std::vector<BufferView> crossed = {View(a.data(), 2), View(b.data(), 2),
                                     View(a.data(), 2), View(b.data(), 2)};
  EXPECT_NE(KeepAliasedInputs(nullptr, nullptr, crossed, 2, {{0, 1}, {1, 0}}),
            "");
  EXPECT_EQ(a, (std::vector<float>{1, 1}));
  EXPECT_EQ(b, (std::vector<float>{2, 2}));

  // An input XLA passes twice in one buffer is no conflict; nor is an
  // empty input, wherever its pointer points.
  std::vector<float> x = {3, 4}, out = {0, 0};
  BufferView empty = View(out.data(), 0);
  std::vector<BufferView> fine = {View(x.data(), 2), View(x.data(), 2), empty,
                                  View(out.data(), 2)};
  EXPECT_EQ(KeepAliasedInputs(nullptr, nullptr, fine, 3, {{0, 0}}), "");
  EXPECT_EQ(out, x);
}

// On CUDA the copy goes through cuMemcpyDtoDAsync on the op's stream.
struct Copy {
  numbax::cuda::CUdeviceptr dst, src;
  size_t bytes;
  numbax::cuda::CUstream stream;
};
std::vector<Copy> g_copies;
numbax::cuda::CUresult g_copy_result = numbax::cuda::CUDA_SUCCESS;

numbax::cuda::CUresult FakeCopy(numbax::cuda::CUdeviceptr dst,
                                numbax::cuda::CUdeviceptr src, size_t bytes,
                                numbax::cuda::CUstream stream) {
  g_copies.push_back({dst, src, bytes, stream});
  return g_copy_result;
}

numbax::cuda::CUresult FakeErrorName(numbax::cuda::CUresult,
                                     const char** name) {
  *name = "CUDA_ERROR_FAKE";
  return numbax::cuda::CUDA_SUCCESS;
}

TEST(Aliases, DriverCopyOnTheOpsStream) {
  numbax::cuda::Driver driver{};
  driver.cuMemcpyDtoDAsync = FakeCopy;
  driver.cuGetErrorName = FakeErrorName;
  std::vector<float> in(16), out(16);
  std::vector<BufferView> buffers = {View(in.data(), 16), View(out.data(), 16)};
  auto* stream = reinterpret_cast<numbax::cuda::CUstream>(0x5);
  g_copies.clear();
  EXPECT_EQ(KeepAliasedInputs(&driver, stream, buffers, 1, {{0, 0}}), "");
  ASSERT_EQ(g_copies.size(), 1u);
  EXPECT_EQ(g_copies[0].dst, reinterpret_cast<uintptr_t>(out.data()));
  EXPECT_EQ(g_copies[0].src, reinterpret_cast<uintptr_t>(in.data()));
  EXPECT_EQ(g_copies[0].bytes, 64u);
  EXPECT_EQ(g_copies[0].stream, stream);

  g_copy_result = static_cast<numbax::cuda::CUresult>(700);
  const std::string why =
      KeepAliasedInputs(&driver, stream, buffers, 1, {{0, 0}});
  g_copy_result = numbax::cuda::CUDA_SUCCESS;
  EXPECT_NE(why.find("CUDA_ERROR_FAKE"), std::string::npos) << why;
}

}  // namespace
