#include "kernel_args.h"

namespace numbax {

void KernelArgs::Reset() { words_.clear(); }

void KernelArgs::AddArray(void* data, const int64_t* dims, int64_t rank,
                          size_t itemsize) {
  int64_t count = 1;
  for (int64_t i = 0; i < rank; ++i) count *= dims[i];
  words_.push_back(0);  // meminfo
  words_.push_back(0);  // parent
  words_.push_back(count);
  words_.push_back(static_cast<int64_t>(itemsize));
  words_.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(data)));
  for (int64_t i = 0; i < rank; ++i) words_.push_back(dims[i]);
  // C-contiguous strides in bytes, innermost last.
  const size_t first_stride = words_.size();
  words_.resize(first_stride + static_cast<size_t>(rank));
  int64_t stride = static_cast<int64_t>(itemsize);
  for (int64_t i = rank - 1; i >= 0; --i) {
    words_[first_stride + static_cast<size_t>(i)] = stride;
    stride *= dims[i];
  }
}

void** KernelArgs::params() {
  // Pointers are taken only once every word is in place, since growing the
  // word vector moves it.
  params_.resize(words_.size());
  for (size_t i = 0; i < words_.size(); ++i) params_[i] = &words_[i];
  return params_.data();
}

}  // namespace numbax
