// A tiny reader over libFuzzer's bytes: each call takes what it needs and
// returns zeros once the input is used up, so every input decodes to some
// call frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace numbax_fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T Take() {
    T value{};
    const size_t n = size_ < sizeof(T) ? size_ : sizeof(T);
    std::memcpy(&value, data_, n);
    data_ += n;
    size_ -= n;
    return value;
  }

  uint8_t Byte() { return Take<uint8_t>(); }
  bool Bool() { return Byte() & 1; }

  // A dimension: mostly small, sometimes 0, negative or huge, so that
  // shapes that overflow (or nearly) are common.
  int64_t Dim() {
    switch (Byte() % 8) {
      case 0:
        return 0;
      case 1:
        return Take<int64_t>();  // anything
      case 2:
        return int64_t{1} << (Byte() % 63);  // powers of two
      case 3:
        return INT64_MAX - (Byte() % 4);
      case 4:
        return -static_cast<int64_t>(Byte());
      default:
        return Byte() % 9;
    }
  }

  size_t remaining() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

// A device address the decoder must never read through: a host read of it
// faults, which libFuzzer reports as a crash.
inline void* FakeDevicePtr(uint64_t i) {
  return reinterpret_cast<void*>(uintptr_t{0xdead0000} + (i % 4096) * 0x1000);
}

}  // namespace numbax_fuzz
