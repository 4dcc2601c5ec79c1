// numbax's own CUDA graphs for capture-mode callables.
//
// Where XLA does not record a capture-mode call into its command buffer
// (single-op programs, command buffers off), numbax records the launches
// `func` makes into a CUDA graph itself, once per device and set of buffer
// addresses, and replays it from C++ without the GIL. A small LRU per call
// site bounds the graphs kept.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"

namespace numbax {

struct GraphCounters {
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> xla_captures{0};  // calls made while XLA recorded
  // numba_cuda_kernel batches launched slice by slice (kernel_handler.cc):
  // graphs recorded, and calls that replayed one.
  std::atomic<uint64_t> slice_records{0};
  std::atomic<uint64_t> slice_replays{0};
};
GraphCounters& GraphStats();

class GraphCache {
 public:
  GraphCache();
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The executable graph recorded for these buffers on this device, or null.
  cuda::CUgraphExec Find(int device, const std::vector<BufferView>& buffers);

  // Takes ownership of `exec`; evicts the least recently used beyond the
  // capacity.
  void Insert(int device, const std::vector<BufferView>& buffers,
              cuda::CUgraphExec exec);

  // Whether `func` already ran once on `device` outside a capture (so its
  // kernels are compiled and loaded there before any capture begins).
  bool Warmed(int device);
  void MarkWarmed(int device);

  // Whether the previous call that found no graph on `device` had exactly
  // these buffers; remembers these for the next such call. Recording only
  // on a repeat keeps a call site whose buffers move every call from
  // recording (and instantiating) a graph it never replays.
  bool RepeatsLastMiss(int device, const std::vector<BufferView>& buffers);

  void Clear();

  // Graphs kept per call site (default 16); applies to every cache.
  static void SetCapacity(size_t capacity);
  static size_t Capacity();
  // Clears every live cache (numbax.clear_caches()).
  static void ClearAll();

 private:
  struct Entry {
    int device;
    std::vector<void*> pointers;
    cuda::CUgraphExec exec;
  };
  void DestroyLocked(Entry& e);

  std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  std::vector<int> warmed_;
  std::vector<std::pair<int, std::vector<void*>>> last_miss_;
};

// This thread's recording stream on `device` (whose context is current),
// created on first use and kept for the thread's life: numbax records its
// graphs there, never on XLA's stream, which other threads may use.
cuda::CUresult RecordingStream(const cuda::Driver& driver, int device,
                               cuda::CUstream* out);

}  // namespace numbax
