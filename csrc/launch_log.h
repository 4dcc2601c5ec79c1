// What numbax saw of func's launches while they were captured into a graph.
//
// A capture-mode call records func's launches into a CUDA graph; replaying
// the graph at other buffer addresses needs to know, for every parameter
// word of every recorded launch, whether it holds an address of one of the
// call's buffers (and at what offset into it) or a value that must stay as
// recorded. numbax packs the parameters of its fast launches itself
// (fast_launch.h), so for those it knows exactly: each one is logged here,
// with an AddressPatch per address word. Anything numbax did not pack (a
// launch that went through Numba, a copy or a memset, work on another
// stream joined into the capture) leaves the log "unmapped": the recording
// can only be replayed at the addresses it was made at.
//
// The log also follows the capture itself: before and after each logged
// launch it asks the driver for the capture's tail (the nodes the next
// captured work will depend on), so the logged launches are known to be the
// captured work, in order, one chain, and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"
#include "kernel_args.h"

namespace numbax {

// Parameter word `word` of a launch holds buffer `slot`'s address plus
// `offset` bytes. slot kAmbiguousSlot: the address lies in more than one of
// the call's buffers (an in-place alias), so which one func meant is unknown.
struct AddressPatch {
  uint32_t word = 0;
  int32_t slot = 0;
  int64_t offset = 0;
  bool operator==(const AddressPatch& o) const {
    return word == o.word && slot == o.slot && offset == o.offset;
  }
};
constexpr int32_t kAmbiguousSlot = -1;

// Appends the patches of an array packed at words [first, ...) under `abi`
// (its data pointer; a memref's two pointers) whose data is at `data`:
// buffer `slot`'s own array, or, with slot < 0, a view whose buffer is
// found here (kAmbiguousSlot when more than one holds `data`).
void AddArrayPatches(ArrayAbi abi, size_t first, int slot, const void* data,
                     const std::vector<BufferView>& buffers,
                     std::vector<AddressPatch>* patches);

struct RecordedLaunch {
  cuda::CUfunction function = nullptr;
  bool kernel_handle = false;  // `function` is a CUkernel
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  unsigned shared_mem = 0;
  std::vector<int64_t> words;
  std::vector<AddressPatch> patches;
  cuda::CUgraphNode node = nullptr;  // its node in the captured graph
};

class LaunchLog {
 public:
  // Starts the log of a call whose `buffers` func gets and whose launches
  // are captured on `stream`. `driver` null: nothing is captured (dry-run
  // tests), so the capture is not followed.
  void Begin(const cuda::Driver* driver, cuda::CUstream stream,
             const std::vector<BufferView>& buffers);

  // Before numbax launches on the stream: false (and the log unmapped) when
  // something other than the previous logged launch was captured since.
  bool BeforeLaunch();

  // After numbax's launch was captured: logs it. `patches` say which of
  // `words` are addresses; any other word that points into a buffer (an
  // address passed as an integer) unmaps the log.
  // `kernel_handle`: `function` is a CUkernel (as Numba launches it).
  void AfterLaunch(cuda::CUfunction function, bool kernel_handle,
                   const unsigned grid[3], const unsigned block[3],
                   unsigned shared_mem, bool cooperative,
                   const std::vector<int64_t>& words,
                   const std::vector<AddressPatch>& patches);

  // After func returned: unmaps the log when work was captured after the
  // last logged launch.
  void End();

  // func ran on slices of the buffers (a sequential vmap, call_frame.h
  // SelectSlice) and its launches were patched against the slices: moves
  // the patches of launches [first, ...) to the whole buffers, buffer i's
  // by offsets[i] bytes (an ambiguous patch stays so).
  void ShiftPatches(size_t first, const std::vector<int64_t>& offsets);

  // Marks the log unmapped (the first reason is kept). `transient`: only
  // because numbax recorded a launch plan during this call (a launch
  // configuration first seen on the recording stream), so a recording made
  // right after maps.
  void Unmap(const std::string& why, bool transient = false);
  // A transient unmap becomes final: recording again would not map either.
  void MakePermanent() { permanent_ = true; }

  bool mapped() const { return why_.empty(); }
  // Unmapped, but only transiently: record again.
  bool transient() const { return !mapped() && !permanent_; }
  const std::string& why() const { return why_; }
  const std::vector<RecordedLaunch>& launches() const { return launches_; }
  // The buffers' addresses when the launches were recorded.
  const std::vector<void*>& addresses() const { return addresses_; }

 private:
  bool TailIs(const std::vector<cuda::CUgraphNode>& expected);

  const cuda::Driver* driver_ = nullptr;
  cuda::CUstream stream_ = nullptr;
  const std::vector<BufferView>* buffers_ = nullptr;
  std::vector<void*> addresses_;
  std::vector<cuda::CUgraphNode> tail_;  // the capture's tail so far
  std::vector<RecordedLaunch> launches_;
  std::string why_;
  bool permanent_ = false;
};

// Watches this thread, for its scope, for device-to-host copies func makes
// while it is recorded (numba_bridge wraps Numba's device_to_host to call
// Note). A value func reads on the host during a recording (copy_to_host(),
// a device array's element) is frozen into the graph, and so is every
// launch it chose with it: a replay would give the first call's answer for
// new contents. Such a call site is never captured (capture_handler.cc).
class HostReadWatch {
 public:
  HostReadWatch();
  ~HostReadWatch();
  HostReadWatch(const HostReadWatch&) = delete;
  HostReadWatch& operator=(const HostReadWatch&) = delete;

  // Whether func copied device memory to the host in this scope.
  bool seen() const { return seen_; }

  // A device-to-host copy on this thread: true (and noted) when a watch is
  // active here, false otherwise (plain calls, other code).
  static bool Note();

 private:
  HostReadWatch* previous_;
  bool seen_ = false;
};

// Whether `later`, recorded with the buffers at other addresses, launched
// exactly `reference`'s work: the same functions, configurations and words,
// addresses apart, with the same patches. Otherwise false and `why`.
bool SameWork(const LaunchLog& reference, const LaunchLog& later,
              std::string* why);

// `launch`'s words with every patch applied for `buffers`.
void BindWords(const RecordedLaunch& launch,
               const std::vector<BufferView>& buffers,
               std::vector<int64_t>* words);

}  // namespace numbax
