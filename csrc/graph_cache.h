// numbax's own CUDA graphs for capture-mode callables.
//
// Where XLA does not record a capture-mode call into its command buffer
// (single-op programs, command buffers off), numbax records the launches
// `func` makes into a CUDA graph itself and replays it from C++ without the
// GIL. A call site whose launches numbax packed itself keeps one graph per
// device, re-bound to each call's buffers (graph_rebind.h); any other keeps
// one graph per set of buffer addresses, in a small LRU per call site.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"
#include "graph_rebind.h"
#include "launch_log.h"

namespace numbax {

struct GraphCounters {
  std::atomic<uint64_t> hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> xla_captures{0};  // calls made while XLA recorded
  // Replays of a recording re-bound to other buffers (numbax's graph, or
  // the launches issued into XLA's command buffer), with no Python.
  std::atomic<uint64_t> rebinds{0};
  // Call sites (per device) found not re-bindable: recorded per address
  // set from then on.
  std::atomic<uint64_t> rebind_refusals{0};
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

  // Launches on `stream` the graph recorded for these buffers on this
  // device, if there is one (`*result` is then the driver's answer). Found
  // and launched under the lock: another thread's eviction or
  // clear_caches() must not destroy it in between.
  bool LaunchFound(const cuda::Driver& driver, int device,
                   const std::vector<BufferView>& buffers,
                   cuda::CUstream stream, cuda::CUresult* result);

  enum class Replay { kHit, kRebound, kNone };
  // Launches on `stream` the graph for `buffers`: one recorded at these
  // addresses, or the call site's graph re-bound to them. kNone: there is
  // none (func must be recorded); else `*result` is the driver's answer.
  // Counts graph_hits and graph_rebinds.
  Replay Launch(const cuda::Driver& driver, int device,
                const std::vector<BufferView>& buffers, cuda::CUstream stream,
                cuda::CUresult* result);

  // After numbax recorded `graph` for `buffers` (with `log` of func's
  // launches): keeps it, re-bindable or in the LRU, and launches it on
  // `stream`. Takes ownership of `graph`. On failure `*stage` says which
  // step failed. `*refusal` says why, when this recording showed that the
  // call site cannot be re-bound.
  cuda::CUresult AddRecording(const cuda::Driver& driver, int device,
                              const std::vector<BufferView>& buffers,
                              cuda::CUgraph graph, LaunchLog&& log,
                              cuda::CUstream stream, std::string* stage,
                              std::string* refusal);

  // While XLA records a command buffer: issues the recorded launches,
  // re-bound to `buffers`, on `stream`. False when there is no confirmed
  // recording for them (func must run, logged, then Learn its log).
  bool LaunchRecorded(const cuda::Driver& driver, int device,
                      const std::vector<BufferView>& buffers,
                      cuda::CUstream stream, cuda::CUresult* result);
  // Returns why, when `log` showed that the call site cannot be re-bound.
  std::string Learn(int device, LaunchLog&& log);

  // Takes ownership of `exec`; evicts the least recently used beyond the
  // capacity.
  void Insert(int device, const std::vector<BufferView>& buffers,
              cuda::CUgraphExec exec);

  // Whether the call site was found not re-bindable on `device`: its
  // recordings need no launch log.
  bool Refused(int device);

  // Whether the call site is never captured again: func read device memory
  // on the host while it was recorded (HostReadWatch). Every call then runs
  // func plainly. Kept by Clear: it says what func does.
  bool Plain() const { return plain_.load(std::memory_order_acquire); }
  void MarkPlain() { plain_.store(true, std::memory_order_release); }

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
  // The LRU's graph for these buffers (now the most recent), or null.
  cuda::CUgraphExec FindLocked(int device,
                               const std::vector<BufferView>& buffers);
  void InsertLocked(int device, std::vector<void*> pointers,
                    cuda::CUgraphExec exec);
  // This call site's re-binding state on `device` (made on first use).
  Rebinding& RebindingLocked(int device);
  // Learns `log`; on a refusal, counts it, and moves a re-bindable graph
  // into the LRU. Returns why it was refused now, or an empty string.
  std::string LearnLocked(Rebinding& rebinding, LaunchLog&& log);

  std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  std::vector<int> warmed_;
  std::atomic<bool> plain_{false};
  std::vector<std::pair<int, std::vector<void*>>> last_miss_;
  std::vector<std::unique_ptr<Rebinding>> rebindings_;
};

// Why call sites were found not re-bindable: (op key, reason), the most
// recent last, at most 64 (numbax.diagnostics.rebind_refusals()).
std::vector<std::pair<std::string, std::string>> RebindRefusals();
void NoteRebindRefusal(const std::string& key, const std::string& why);

// This thread's recording stream on `device` (whose context is current),
// created on first use and kept for the thread's life: numbax records its
// graphs there, never on XLA's stream, which other threads may use.
cuda::CUresult RecordingStream(const cuda::Driver& driver, int device,
                               cuda::CUstream* out);

}  // namespace numbax
