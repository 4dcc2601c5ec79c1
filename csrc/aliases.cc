#include "aliases.h"

#include <algorithm>
#include <cstring>

namespace numbax {

std::string CheckAliases(const AliasList& aliases, int64_t num_inputs,
                         int64_t num_outputs) {
  std::vector<bool> taken(static_cast<size_t>(std::max<int64_t>(num_outputs, 0)));
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

// Whether two buffers share any byte (empty ones share none).
bool Overlap(const BufferView& a, const BufferView& b) {
  if (a.nbytes == 0 || b.nbytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a.data);
  const auto y = reinterpret_cast<uintptr_t>(b.data);
  return x < y + b.nbytes && y < x + a.nbytes;
}

}  // namespace

std::string KeepAliasedInputs(const cuda::Driver* driver,
                              cuda::CUstream stream,
                              const std::vector<BufferView>& buffers,
                              int64_t num_inputs, const AliasList& aliases) {
  for (const Alias& a : aliases) {
    const size_t in = static_cast<size_t>(a.input);
    const size_t out = static_cast<size_t>(num_inputs + a.output);
    if (out >= buffers.size()) {
      return "input_output_aliases names output " + std::to_string(a.output) +
             ", which the call does not have";
    }
    const BufferView& src = buffers[in];
    const BufferView& dst = buffers[out];
    if (src.data == dst.data || dst.nbytes == 0) continue;
    if (src.nbytes != dst.nbytes) {
      return "input " + std::to_string(a.input) + " (" +
             std::to_string(src.nbytes) + " bytes) is aliased to output " +
             std::to_string(a.output) + " (" + std::to_string(dst.nbytes) +
             " bytes), but XLA gave them buffers of different sizes";
    }
    const auto s = reinterpret_cast<uintptr_t>(src.data);
    const auto d = reinterpret_cast<uintptr_t>(dst.data);
    if (Overlap(src, dst)) {
      return "input " + std::to_string(a.input) + " is aliased to output " +
             std::to_string(a.output) +
             ", but XLA gave them buffers that overlap without being the "
             "same buffer; numbax cannot give the output the input's values";
    }
    // The copy must not write over another input (one a later pair copies
    // from, or one the kernel reads).
    for (int64_t i = 0; i < num_inputs; ++i) {
      if (i != a.input && Overlap(buffers[static_cast<size_t>(i)], dst)) {
        return "output " + std::to_string(a.output) + " (aliased to input " +
               std::to_string(a.input) + ") shares memory with input " +
               std::to_string(i) +
               "; numbax cannot copy input " + std::to_string(a.input) +
               " into it without changing input " + std::to_string(i);
      }
    }
    if (driver == nullptr) {
      std::memcpy(dst.data, src.data, dst.nbytes);
    } else {
      const cuda::CUresult r = driver->cuMemcpyDtoDAsync(
          static_cast<cuda::CUdeviceptr>(d), static_cast<cuda::CUdeviceptr>(s),
          dst.nbytes, stream);
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
