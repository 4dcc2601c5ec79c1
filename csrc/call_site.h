// The Python call site of one numba_cuda_callable custom call.
//
// A CallSite is the instantiate-stage state of one custom call in one
// compiled program: the Python function its stable key resolved to, and a
// small cache of the Numba arrays built around XLA's buffers (the streams
// are cached process-wide: stream_cache.h). Everything here runs with the
// GIL held; the cache needs no other lock.
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aliases.h"
#include "call_frame.h"
#include "graph_cache.h"
#include "launch_log.h"
#include "python_errors.h"
#include "python_hooks.h"

namespace numbax {

// Benchmarks only (numbax.bench.bridge_cost): where every plain-mode call
// of a callable returns, so that the bridge can be timed stage by stage
// (capture-mode calls always run whole). kFull, the default, is the only
// setting numbax itself uses; the others return success without calling
// func (outputs are left unwritten).
enum class BridgeStop : int {
  kFull = 0,
  kAfterDecode = 1,  // call frame decoded, device bound; no Python
  kAfterGil = 2,     // + the GIL taken
  kAfterArrays = 3,  // + the stream and the arrays for func found
  kAfterGuard = 4,   // + the JAX-call guard entered and left
};
void SetBridgeStop(BridgeStop stop);
BridgeStop GetBridgeStop();

class CallSite {
 public:
  // Resolves `key` through the resolve hook. Takes the GIL itself. `Site`
  // is CpuCallSite or CudaCallSite.
  template <typename Site>
  static ::xla::ffi::ErrorOr<std::unique_ptr<Site>> Create(std::string_view key,
                                                           Platform platform) {
    std::unique_ptr<Site> site(new Site);
    if (::xla::ffi::Error err = site->Resolve(key, platform); err.failure()) {
      return ::xla::ffi::Unexpected(std::move(err));
    }
    return site;
  }

  virtual ~CallSite();
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

  const std::string& key() const { return key_; }
  // The op's name in profiles (its name=, else its function's or kernel's
  // qualified name; the key where the resolver gave none): each call is an
  // NVTX range with this name (nvtx.h).
  const std::string& name() const { return name_; }

  // The error a call returns when numbax's exit hook has stopped Python
  // use (InterpreterUse not admitted).
  ::xla::ffi::Error ShuttingDown() const;
  int64_t num_inputs() const { return num_inputs_; }
  int64_t num_outputs() const { return num_outputs_; }
  int64_t num_scratch() const { return num_scratch_; }
  // Whether func's kernel launches may take numbax's fast path
  // (csrc/fast_launch.h); fixed when the key is resolved.
  bool fast_launch() const { return fast_launch_; }
  // input_output_aliases of the op, (input, output) pairs; checked against
  // the counts when the key is resolved.
  const AliasList& aliases() const { return aliases_; }

  // Decodes XLA's call frame into `buffers`, checked against the counts
  // this site resolved; a failure names the op. Inline: every call of every
  // callable handler starts here.
  ::xla::ffi::Error DecodeBuffers(const ::xla::ffi::RemainingArgs& args,
                                  const ::xla::ffi::RemainingRets& rets,
                                  std::vector<BufferView>* buffers) const {
    if (::xla::ffi::Error err = DecodeCallBuffers(
            args, rets, num_inputs_, num_outputs_ + num_scratch_, buffers);
        err.failure()) {
      return ::xla::ffi::Error::InvalidArgument(
          OpMessage(OpKind::kCallable, key_, err.message()));
    }
    if (!lead_units_.empty() || !trail_units_.empty()) {
      if (::xla::ffi::Error err =
              DropUnitAxes(lead_units_, trail_units_, buffers);
          err.failure()) {
        return ::xla::ffi::Error::InvalidArgument(
            OpMessage(OpKind::kCallable, key_, err.message()));
      }
    }
    return ::xla::ffi::Error::Success();
  }

  // Calls func(*arrays, stream) with the GIL held by the caller. `buffers`
  // are the inputs, outputs and scratch buffers in that order. For CUDA,
  // the device's primary context must already be current. `plain`: a
  // plain-mode call (func runs on every call). Only those may take func's
  // first launches from numbax's cache entries (fast_launch.h): a
  // capture-mode warm-up must have Numba load every kernel before the
  // recording call, where nothing may be loaded. Only those stop early
  // for the bridge benchmark (BridgeStop): a capture-mode call stopped
  // early would warm up or record nothing, and replay that later. `log`:
  // func's launches are being captured on `stream`; they are logged there
  // (launch_log.h).
  //
  // A sequential vmap's call (sliced(): one flag per buffer) calls func
  // once per slice of the batch, in order, each time with views of slice s
  // of the sliced buffers and the others whole (call_frame.h, SelectSlice):
  // what an XLA loop of one call per slice did, inside one custom call
  // that XLA's batch partitioner can split. `log` then covers every
  // slice's launches, patched against the whole buffers.
  ::xla::ffi::Error Invoke(const std::vector<BufferView>& buffers,
                           Platform platform, int device, void* stream,
                           bool plain, LaunchLog* log = nullptr);

  // Per buffer, 1 where func gets one slice of it per call (a sequential
  // vmap's batched buffers), 0 where it gets it whole; empty for a call
  // that is not a sequential vmap.
  const std::vector<int64_t>& sliced() const { return sliced_; }

  // Drops every cached array (tests, and numbax.clear_caches()).
  void ClearCache();

 protected:
  CallSite() = default;

 private:
  ::xla::ffi::Error Resolve(std::string_view key, Platform platform);

  struct CachedArray {
    void* data;
    int device;
    bool writable;
    PyObject* array;  // strong reference
    // The object every view of `array` refers to (the simulator's numpy
    // array, the device memory's owner), or null; strong reference.
    PyObject* root;
    // Reference counts with only numbax holding them: more after func
    // returns means func kept the array or a view of it.
    Py_ssize_t array_refs;
    Py_ssize_t root_refs;
    // CUDA: the stream object the array is bound to, part of the key
    // (strong reference, so comparing it by identity is safe); null on
    // the CPU.
    PyObject* stream = nullptr;
  };
  // A few arrays per buffer slot: XLA rotates among a handful of addresses
  // for the same call site, so a tiny most-recently-used list hits.
  static constexpr size_t kArraysPerSlot = 8;

  // The cached array over `view` on `stream` (made on a miss). On CUDA its
  // `stream` attribute is `stream`, the call's: Numba's array methods that
  // run device work (a 2-D transpose, copy_to_host, copy_to_device, slice
  // assignment) use the array's own stream, and on the default one they
  // would not be ordered with XLA's.
  // `buffer` is the buffer's index among the call's (naming it), `slot`
  // its cache slot (SlotOf).
  PyObject* ArrayFor(size_t slot, size_t buffer, const BufferView& view,
                     Platform platform, int device, bool writable,
                     PyObject* stream);
  // After func returned: the error naming the first argument func kept a
  // reference to (and drops that array from the cache), or success.
  // `slice`: the slice func got (SlotOf), 0 outside a sequential vmap.
  ::xla::ffi::Error CheckNothingKept(PyObject* const* args, size_t n,
                                     Platform platform, int64_t slice);
  // func called once with `views` (the whole buffers, or slice `slice` of
  // a sequential vmap's), the arrays from the cache slots of that slice.
  // `log`: logged (begun and ended around the call) unless `log_open`
  // (the caller began it, for every slice at once).
  ::xla::ffi::Error CallFunc(const std::vector<BufferView>& views,
                             int64_t slice, Platform platform, int device,
                             void* stream, bool plain, LaunchLog* log,
                             bool log_open);
  // The cache slot of buffer `buffer` for slice `slice`: each of the first
  // kCachedSlices slices of a sliced buffer has slots of its own (its
  // address differs per slice), later slices share the last; a whole
  // buffer's slot is its index, whatever the slice.
  size_t SlotOf(size_t buffer, int64_t slice) const {
    if (sliced_.empty() || !sliced_[buffer] || slice <= 0) return buffer;
    const int64_t group = slice < kCachedSlices ? slice : kCachedSlices - 1;
    return static_cast<size_t>(group) * sliced_.size() + buffer;
  }
  static constexpr int64_t kCachedSlices = 64;

  std::string key_;
  std::string name_;
  PyObject* func_ = nullptr;  // strong reference
  int64_t num_inputs_ = 0;
  int64_t num_outputs_ = 0;
  int64_t num_scratch_ = 0;
  bool fast_launch_ = false;
  AliasList aliases_;
  // Per buffer, the unit axes a partitioned call adds at the start and at
  // the end (call_frame.h, DropUnitAxes), dropped before func sees the
  // arrays; empty when the key's call added none.
  std::vector<int64_t> lead_units_;
  std::vector<int64_t> trail_units_;
  // A sequential vmap's sliced buffers (sliced()); empty otherwise.
  std::vector<int64_t> sliced_;
  std::vector<std::vector<CachedArray>> slots_;
  int active_calls_ = 0;  // Invoke calls running func now (under the GIL)
};

// One state type per platform. XLA's CPU runtime and the CUDA plugin keep
// separate type registries and each writes the id it assigns into the
// TypeId it is given: a TypeId shared by both would carry the CPU id into
// the plugin, where it names another type (and another deleter).
struct CpuCallSite final : CallSite {
  static ::xla::ffi::TypeId id;
};
struct CudaCallSite final : CallSite {
  static ::xla::ffi::TypeId id;
  GraphCache graphs;  // used by capture mode only
};

}  // namespace numbax
