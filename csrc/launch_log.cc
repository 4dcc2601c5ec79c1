#include "launch_log.h"

#include <cstring>

namespace numbax {
namespace {

// Whether `address` lies in `b` (one past its end included: a view may
// start there only when empty, and then it is not an address of it).
bool Holds(const BufferView& b, uintptr_t address) {
  const auto base = reinterpret_cast<uintptr_t>(b.data);
  return base != 0 && b.nbytes > 0 && address >= base &&
         address < base + b.nbytes;
}

}  // namespace

void AddArrayPatches(ArrayAbi abi, size_t first, int slot, const void* data,
                     const std::vector<BufferView>& buffers,
                     std::vector<AddressPatch>* patches) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  AddressPatch p;
  if (slot >= 0) {
    p.slot = slot;
    p.offset = static_cast<int64_t>(
        address - reinterpret_cast<uintptr_t>(buffers[slot].data));
  } else {
    p.slot = kAmbiguousSlot;
    int holders = 0;
    for (size_t j = 0; j < buffers.size(); ++j) {
      if (!Holds(buffers[j], address)) continue;
      if (++holders == 1) {
        p.slot = static_cast<int32_t>(j);
        p.offset = static_cast<int64_t>(
            address - reinterpret_cast<uintptr_t>(buffers[j].data));
      }
    }
    if (holders != 1) {
      p.slot = kAmbiguousSlot;
      p.offset = 0;
    }
  }
  // Numba: meminfo, parent, nitems, itemsize, data. A memref: allocated
  // and aligned pointer (numbax passes the same address as both).
  if (abi == ArrayAbi::kMemref) {
    p.word = static_cast<uint32_t>(first);
    patches->push_back(p);
    p.word = static_cast<uint32_t>(first + 1);
    patches->push_back(p);
  } else {
    p.word = static_cast<uint32_t>(first + 4);
    patches->push_back(p);
  }
}

void LaunchLog::ShiftPatches(size_t first,
                             const std::vector<int64_t>& offsets) {
  for (size_t l = first; l < launches_.size(); ++l) {
    for (AddressPatch& p : launches_[l].patches) {
      if (p.slot >= 0 && static_cast<size_t>(p.slot) < offsets.size()) {
        p.offset += offsets[static_cast<size_t>(p.slot)];
      }
    }
  }
}

void LaunchLog::Begin(const cuda::Driver* driver, cuda::CUstream stream,
                      const std::vector<BufferView>& buffers) {
  driver_ = driver;
  stream_ = stream;
  buffers_ = &buffers;
  AddressesOf(buffers, &addresses_);
  launches_.clear();
  why_.clear();
  permanent_ = false;
  tail_.clear();
  if (driver_ && !cuda::CaptureTail(*driver_, stream_, &tail_)) {
    Unmap("the driver cannot report the capture's nodes");
  }
}

bool LaunchLog::TailIs(const std::vector<cuda::CUgraphNode>& expected) {
  if (!driver_) return true;
  thread_local std::vector<cuda::CUgraphNode> now;
  if (!cuda::CaptureTail(*driver_, stream_, &now)) return false;
  return now == expected;
}

bool LaunchLog::BeforeLaunch() {
  if (!mapped()) return false;
  if (!TailIs(tail_)) {
    Unmap(
        "func recorded work other than its kernel launches (a copy, a "
        "memset, or work joined from another stream)");
    return false;
  }
  return true;
}

void LaunchLog::AfterLaunch(cuda::CUfunction function, bool kernel_handle,
                            const unsigned grid[3], const unsigned block[3],
                            unsigned shared_mem, bool cooperative,
                            const std::vector<int64_t>& words,
                            const std::vector<AddressPatch>& patches) {
  if (!mapped()) return;
  if (cooperative) {
    Unmap("a cooperative launch is never re-bound");
    return;
  }
  RecordedLaunch launch;
  launch.function = function;
  launch.kernel_handle = kernel_handle;
  std::memcpy(launch.grid, grid, sizeof launch.grid);
  std::memcpy(launch.block, block, sizeof launch.block);
  launch.shared_mem = shared_mem;
  launch.words = words;
  launch.patches = patches;
  std::vector<uint8_t> patched(words.size(), 0);
  for (const AddressPatch& p : patches) {
    if (p.slot == kAmbiguousSlot) {
      Unmap(
          "an array argument lies in two buffers at once (an in-place "
          "alias), so which one it belongs to is unknown");
      return;
    }
    if (p.word >= words.size()) {
      Unmap("a launch's address words were mislaid (a numbax bug)");
      return;
    }
    patched[p.word] = 1;
  }
  // A word that is not a patched address but points into a buffer is an
  // address numbax did not pack (an int from device_ctypes_pointer): it
  // would go stale at other addresses.
  for (size_t w = 0; w < words.size(); ++w) {
    if (patched[w]) continue;
    const auto value = static_cast<uintptr_t>(words[w]);
    for (const BufferView& b : *buffers_) {
      if (Holds(b, value)) {
        Unmap("a scalar argument holds an address inside a buffer");
        return;
      }
    }
  }
  if (driver_) {
    thread_local std::vector<cuda::CUgraphNode> tail;
    int type = -1;
    if (!cuda::CaptureTail(*driver_, stream_, &tail) || tail.size() != 1 ||
        !driver_->cuGraphNodeGetType ||
        driver_->cuGraphNodeGetType(tail[0], &type) != cuda::CUDA_SUCCESS ||
        type != cuda::CU_GRAPH_NODE_TYPE_KERNEL) {
      Unmap("a launch did not become one kernel node of the capture");
      return;
    }
    launch.node = tail[0];
    tail_ = tail;
  }
  launches_.push_back(std::move(launch));
}

void LaunchLog::End() {
  if (mapped() && !TailIs(tail_)) {
    Unmap(
        "func recorded work other than its kernel launches after its last "
        "launch");
  }
}

void LaunchLog::Unmap(const std::string& why, bool transient) {
  if (why_.empty()) why_ = why;
  if (!transient) permanent_ = true;
}

bool SameWork(const LaunchLog& reference, const LaunchLog& later,
              std::string* why) {
  const auto& a = reference.launches();
  const auto& b = later.launches();
  if (a.size() != b.size()) {
    *why = "func made " + std::to_string(b.size()) + " launches instead of " +
           std::to_string(a.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const RecordedLaunch& x = a[i];
    const RecordedLaunch& y = b[i];
    const std::string which = "launch " + std::to_string(i);
    if (x.function != y.function) {
      *why = which + " ran another kernel";
      return false;
    }
    if (std::memcmp(x.grid, y.grid, sizeof x.grid) != 0 ||
        std::memcmp(x.block, y.block, sizeof x.block) != 0 ||
        x.shared_mem != y.shared_mem) {
      *why = which + " had another launch configuration";
      return false;
    }
    if (x.patches != y.patches || x.words.size() != y.words.size()) {
      *why = which + " passed its arrays differently";
      return false;
    }
    std::vector<uint8_t> patched(x.words.size(), 0);
    for (const AddressPatch& p : x.patches) patched[p.word] = 1;
    for (size_t w = 0; w < x.words.size(); ++w) {
      if (!patched[w] && x.words[w] != y.words[w]) {
        *why = which + " passed another scalar or shape";
        return false;
      }
    }
  }
  return true;
}

void BindWords(const RecordedLaunch& launch,
               const std::vector<BufferView>& buffers,
               std::vector<int64_t>* words) {
  *words = launch.words;
  for (const AddressPatch& p : launch.patches) {
    const auto base = reinterpret_cast<intptr_t>(buffers[p.slot].data);
    (*words)[p.word] = static_cast<int64_t>(base + p.offset);
  }
}

namespace {
thread_local HostReadWatch* t_host_read_watch = nullptr;
}  // namespace

HostReadWatch::HostReadWatch() : previous_(t_host_read_watch) {
  t_host_read_watch = this;
}

HostReadWatch::~HostReadWatch() { t_host_read_watch = previous_; }

bool HostReadWatch::Note() {
  if (t_host_read_watch == nullptr) return false;
  t_host_read_watch->seen_ = true;
  return true;
}

}  // namespace numbax
