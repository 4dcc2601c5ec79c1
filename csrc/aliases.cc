#include "aliases.h"

#include <algorithm>
#include <cstring>

namespace numbax {

std::string CheckAliases(const AliasList& aliases, int64_t num_inputs,
                         int64_t num_outputs) {
  std::vector<bool> taken(
      static_cast<size_t>(std::max<int64_t>(num_outputs, 0)));
  for (const Alias& a : aliases) {
    if (a.input < 0 || a.input >= num_inputs) {
      return "alias input index " + std::to_string(a.input) +
             " is not one of the " + std::to_string(num_inputs) + " inputs";
    }
    if (a.output < 0 || a.output >= num_outputs) {
      return "alias output index " + std::to_string(a.output) +
             " is not one of the " + std::to_string(num_outputs) + " outputs";
    }
    if (taken[static_cast<size_t>(a.output)]) {
      return "two inputs alias output " + std::to_string(a.output);
    }
    taken[static_cast<size_t>(a.output)] = true;
  }
  return "";
}

std::atomic<uint64_t>& AliasCopyCount() {
  static std::atomic<uint64_t> count{0};
  return count;
}

namespace {

bool Overlap(const BufferView& a, const BufferView& b) {
  if (a.nbytes == 0 || b.nbytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a.data);
  const auto y = reinterpret_cast<uintptr_t>(b.data);
  return x < y + b.nbytes && y < x + a.nbytes;
}

// Why the pair `a` cannot be kept by a copy, or an empty string; `copy` is
// set where a copy is due.
std::string CheckPair(const std::vector<BufferView>& buffers,
                      int64_t num_inputs, const Alias& a, bool* copy) {
  *copy = false;
  const size_t in = static_cast<size_t>(a.input);
  const size_t out = static_cast<size_t>(num_inputs + a.output);
  if (in >= buffers.size() || out >= buffers.size()) {
    return "input_output_aliases names input " + std::to_string(a.input) +
           " and output " + std::to_string(a.output) +
           ", which the call does not both have";
  }
  const BufferView& src = buffers[in];
  const BufferView& dst = buffers[out];
  if (src.data == dst.data || dst.nbytes == 0) return "";
  if (src.nbytes != dst.nbytes) {
    return "input " + std::to_string(a.input) + " (" +
           std::to_string(src.nbytes) + " bytes) is aliased to output " +
           std::to_string(a.output) + " (" + std::to_string(dst.nbytes) +
           " bytes), but XLA gave them buffers of different sizes";
  }
  if (Overlap(src, dst)) {
    return "input " + std::to_string(a.input) + " is aliased to output " +
           std::to_string(a.output) +
           ", but XLA gave them buffers that overlap without being the "
           "same buffer; numbax cannot give the output the input's values";
  }
  // The copy must not change another input before the kernel (or func, or
  // the next pair's copy) reads it: XLA's GPU dynamic_slice_fusion inside a
  // loop over slices of an in-place carry can put the output there.
  for (int64_t j = 0; j < num_inputs; ++j) {
    const BufferView& other = buffers[static_cast<size_t>(j)];
    if (j == a.input) continue;
    if (Overlap(dst, other)) {
      return "input " + std::to_string(a.input) + " is aliased to output " +
             std::to_string(a.output) +
             ", but XLA gave the output a buffer "
             "that overlaps input " +
             std::to_string(j) + ", so copying input " +
             std::to_string(a.input) + " into it would change input " +
             std::to_string(j) +
             " before it is read; numbax cannot keep the alias here. XLA's "
             "GPU dynamic_slice_fusion inside loops does this: set "
             "XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=false";
    }
  }
  *copy = true;
  return "";
}

}  // namespace

std::string KeepAliasedInputs(const cuda::Driver* driver, cuda::CUstream stream,
                              const std::vector<BufferView>& buffers,
                              int64_t num_inputs, const AliasList& aliases) {
  // Every pair is checked before anything is copied: an error leaves every
  // buffer as XLA handed it.
  for (const Alias& a : aliases) {
    bool copy = false;
    if (std::string bad = CheckPair(buffers, num_inputs, a, &copy);
        !bad.empty()) {
      return bad;
    }
  }
  for (const Alias& a : aliases) {
    bool copy = false;
    CheckPair(buffers, num_inputs, a, &copy);
    if (!copy) continue;
    const BufferView& src = buffers[static_cast<size_t>(a.input)];
    const BufferView& dst = buffers[static_cast<size_t>(num_inputs + a.output)];
    if (driver == nullptr) {
      std::memcpy(dst.data, src.data, dst.nbytes);
    } else {
      const cuda::CUresult r = driver->cuMemcpyDtoDAsync(
          reinterpret_cast<cuda::CUdeviceptr>(dst.data),
          reinterpret_cast<cuda::CUdeviceptr>(src.data), dst.nbytes, stream);
      if (r != cuda::CUDA_SUCCESS) {
        return "copying input " + std::to_string(a.input) +
               " into its aliased output " + std::to_string(a.output) +
               " failed: " + cuda::ErrorText(*driver, r);
      }
    }
    AliasCopyCount().fetch_add(1, std::memory_order_relaxed);
  }
  return "";
}

}  // namespace numbax
