// Call frame -> device binding -> cuLaunchKernel, for numba_cuda_kernel.
#include "kernel_handler.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "aliases.h"
#include "call_frame.h"
#include "cuda_driver.h"
#include "device_binding.h"
#include "ffi_binding.h"
#include "graph_cache.h"
#include "kernel_args.h"
#include "kernel_site.h"
#include "nvtx.h"
#include "python_errors.h"

namespace numbax {
namespace {

ffi::ErrorOr<std::unique_ptr<KernelSite>> Instantiate(ffi::RemainingArgs,
                                                      ffi::RemainingRets,
                                                      std::string_view key) {
  return KernelSite::Create(key);
}

ffi::Error Fail(const KernelSite& site, const std::string& what) {
  return ffi::Error::Internal(OpMessage(OpKind::kKernel, site.key(), what));
}

ffi::Error LaunchError(const KernelSite& site, const cuda::Driver& driver,
                       cuda::CUresult r) {
  return Fail(site, "launch failed: " + cuda::ErrorText(driver, r));
}

cuda::CUresult Launch(const cuda::Driver& driver, const LoadedKernel& loaded,
                      cuda::CUfunction function, cuda::CUstream stream,
                      const std::array<unsigned, 3>& grid, void** params) {
  return cuda::LaunchKernel(driver, function, grid.data(), loaded.block.data(),
                            loaded.shared_mem, loaded.cooperative, stream,
                            params);
}

// vmap in one launch: the generated batched kernel gets whole batched
// buffers and takes slice blockIdx.<fold_axis> of each; batches above the
// axis's limit are split into chunks, each launched over its own slices.
ffi::Error LaunchFolded(const KernelSite& site, const cuda::Driver& driver,
                        cuda::CUfunction function, cuda::CUstream stream,
                        const std::vector<BufferView>& buffers, int64_t batch,
                        const std::array<unsigned, 3>& slice_grid) {
  const LoadedKernel& loaded = site.loaded();
  thread_local KernelArgs packed;
  for (int64_t start = 0; start < batch; start += loaded.max_slices) {
    const int64_t count = std::min(loaded.max_slices, batch - start);
    packed.Reset(loaded.abi);
    size_t bad = 0;
    const bool ok =
        AddParams(loaded.scalars, buffers.size(), &packed, [&](size_t i) {
          const bool reuse = i < loaded.broadcast.size() && loaded.broadcast[i];
          bad = i;
          return AddBatchChunk(buffers[i], batch, start, count, reuse, &packed);
        });
    if (!ok) {
      return Fail(site, "buffer " + std::to_string(bad) + " (rank " +
                            std::to_string(buffers[bad].rank) +
                            ") does not hold " + std::to_string(batch) +
                            " slices along axis 0 for a vmapped launch");
    }
    std::array<unsigned, 3> grid = slice_grid;
    grid[loaded.fold_axis] = static_cast<unsigned>(count);
    cuda::CUresult r =
        Launch(driver, loaded, function, stream, grid, packed.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
  }
  return ffi::Error::Success();
}

// Batches of at least this many slices are replayed from a CUDA graph of
// their launches (below): one graph launch costs the host about what a
// couple of kernel launches do, and the device runs the recorded nodes
// back to back.
constexpr int64_t kGraphMinSlices = 16;

// Whether a batch launched slice by slice may be recorded into a graph of
// numbax's own: not while XLA itself records this stream (the launches
// then land in XLA's command buffer already), not for cooperative kernels
// (graph support for cooperative launches varies between drivers), and
// only with the driver's graph API.
bool MayRecord(const LoadedKernel& loaded, int64_t batch,
               const cuda::Driver& driver, cuda::CUstream stream) {
  if (batch < kGraphMinSlices || loaded.cooperative ||
      !driver.cuStreamIsCapturing || !driver.cuStreamBeginCapture ||
      !driver.cuStreamEndCapture || !driver.cuGraphInstantiateWithFlags ||
      !driver.cuGraphLaunch || !driver.cuGraphDestroy) {
    return false;
  }
  int status = cuda::CU_STREAM_CAPTURE_STATUS_NONE;
  return driver.cuStreamIsCapturing(stream, &status) == cuda::CUDA_SUCCESS &&
         status == cuda::CU_STREAM_CAPTURE_STATUS_NONE;
}

ffi::Error LaunchSlices(const KernelSite& site, const cuda::Driver& driver,
                        cuda::CUfunction function, cuda::CUstream stream,
                        SliceParams& slices, int64_t batch,
                        const std::array<unsigned, 3>& grid) {
  const LoadedKernel& loaded = site.loaded();
  for (int64_t s = 0; s < batch; ++s) {
    slices.Select(s);
    cuda::CUresult r =
        Launch(driver, loaded, function, stream, grid, slices.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
  }
  return ffi::Error::Success();
}

// Records the batch's launches on numbax's recording stream into an
// executable graph, or returns null where the driver would not record them
// (nothing was launched then: the caller launches them plainly, which
// also reports a launch error as such, not as a recording problem).
cuda::CUgraphExec RecordSlices(const KernelSite& site,
                               const cuda::Driver& driver, int device,
                               cuda::CUfunction function, SliceParams& slices,
                               int64_t batch,
                               const std::array<unsigned, 3>& grid) {
  cuda::CUstream recorder = nullptr;
  if (RecordingStream(driver, device, &recorder) != cuda::CUDA_SUCCESS ||
      driver.cuStreamBeginCapture(recorder,
                                  cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) !=
          cuda::CUDA_SUCCESS) {
    return nullptr;
  }
  const bool launched =
      LaunchSlices(site, driver, function, recorder, slices, batch, grid)
          .success();
  cuda::CUgraph graph = nullptr;
  const cuda::CUresult ended = driver.cuStreamEndCapture(recorder, &graph);
  cuda::CUgraphExec exec = nullptr;
  if (launched && ended == cuda::CUDA_SUCCESS && graph != nullptr &&
      driver.cuGraphInstantiateWithFlags(&exec, graph, 0) !=
          cuda::CUDA_SUCCESS) {
    exec = nullptr;
  }
  if (graph) driver.cuGraphDestroy(graph);
  return exec;
}

// vmap, one launch per slice (a kernel that cannot fold, or
// vmap_method='sequential'): all of the batch's launches from this one
// handler call, in slice order on XLA's stream, so each slice runs after
// the one before, as an XLA loop would run them, without the loop. The
// parameters are packed once; each launch moves the per-slice buffers'
// data pointers to its slice (SliceParams). Large batches seen twice with
// the same buffers are recorded into a graph (per device and buffer
// addresses, the call site's GraphCache) and replayed with one graph
// launch from then on: the same launches in the same order, for a
// fraction of the host's time per slice. Nothing here is host work a CUDA
// graph of XLA's would miss: the launches are the whole effect.
ffi::Error LaunchPerSlice(KernelSite& site, const cuda::Driver& driver,
                          int device, cuda::CUfunction function,
                          cuda::CUstream stream,
                          const std::vector<BufferView>& buffers, int64_t batch,
                          const std::array<unsigned, 3>& grid) {
  const LoadedKernel& loaded = site.loaded();
  const bool may_record = MayRecord(loaded, batch, driver, stream);
  if (may_record) {
    cuda::CUresult r = cuda::CUDA_SUCCESS;
    if (site.graphs().LaunchFound(driver, device, buffers, stream, &r)) {
      ++GraphStats().slice_replays;
      if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
      return ffi::Error::Success();
    }
  }
  thread_local SliceParams slices;
  size_t bad = 0;
  if (!slices.Pack(buffers, batch, loaded.broadcast, loaded.abi, &bad,
                   loaded.scalars)) {
    return Fail(site, "buffer " + std::to_string(bad) + " (rank " +
                          std::to_string(buffers[bad].rank) +
                          ") does not hold " + std::to_string(batch) +
                          " slices along axis 0 for a vmapped launch");
  }
  if (may_record && site.graphs().RepeatsLastMiss(device, buffers)) {
    if (cuda::CUgraphExec exec =
            RecordSlices(site, driver, device, function, slices, batch, grid)) {
      ++GraphStats().slice_records;
      // Recording ran nothing: this call's launches are the graph's.
      cuda::CUresult r = driver.cuGraphLaunch(exec, stream);
      site.graphs().Insert(device, buffers, exec);
      if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
      return ffi::Error::Success();
    }
  }
  return LaunchSlices(site, driver, function, stream, slices, batch, grid);
}

// The batch and grid of this call. A call XLA partitioned gets each
// device's shards: the batch is the leading extent of output 0 (outputs are
// never broadcast), and grid axes tied to an axis of output 0 cover that
// axis's extent as received (loaded_kernel.h). Unpartitioned calls get the
// kernel's own values the same way (their buffers are the global arrays).
// False when output 0 lacks an axis the loaded kernel names.
bool LocalLaunch(const LoadedKernel& loaded,
                 const std::vector<BufferView>& buffers, int64_t* batch,
                 std::array<unsigned, 3>* grid) {
  *batch = loaded.batch;
  *grid = loaded.grid;
  const bool tied = loaded.grid_from[0] >= 0 || loaded.grid_from[1] >= 0 ||
                    loaded.grid_from[2] >= 0;
  if (loaded.batch <= 0 && !tied) return true;
  const size_t first_output = static_cast<size_t>(loaded.num_inputs);
  if (first_output >= buffers.size()) return false;
  const BufferView& out = buffers[first_output];
  if (loaded.batch > 0) {
    if (out.rank < 1) return false;
    *batch = out.dims[0];
  }
  for (size_t a = 0; a < 3; ++a) {
    const int axis = loaded.grid_from[a];
    if (axis < 0) continue;
    if (axis >= out.rank) return false;
    const int64_t extent = out.dims[axis];
    const int64_t block = std::max<int64_t>(1, loaded.block[a]);
    const int64_t blocks = (extent + block - 1) / block;
    if (blocks > static_cast<int64_t>(std::numeric_limits<unsigned>::max())) {
      return false;
    }
    (*grid)[a] = static_cast<unsigned>(blocks);
  }
  return true;
}

ffi::Error Execute(void* stream_ptr, int32_t device, KernelSite* site,
                   std::string_view /*key*/, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const LoadedKernel& loaded = site->loaded();
  // The call as an NVTX range named after the op (free without a tool).
  nvtx::Range range(loaded.name.c_str());
  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = DecodeCallBuffers(args, rets, loaded.num_inputs,
                                         loaded.num_outputs, &buffers);
      err.failure()) {
    return Fail(*site, err.message());
  }
  if (ffi::Error err =
          DropUnitAxes(loaded.lead_units, loaded.trail_units, &buffers);
      err.failure()) {
    return Fail(*site, err.message());
  }
  int64_t batch = 0;
  std::array<unsigned, 3> grid{};
  if (!LocalLaunch(loaded, buffers, &batch, &grid)) {
    return Fail(*site,
                "output 0 does not have the axes the launch plan reads its "
                "batch or grid from");
  }
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return Fail(*site, why);
  auto stream = static_cast<cuda::CUstream>(stream_ptr);
  DeviceBinding bind(*driver, device);
  if (!bind.ok()) return Fail(*site, bind.Error());

  // An aliased output starts out holding its input's values, whatever
  // buffers XLA handed us (aliases.h).
  if (!loaded.aliases.empty()) {
    if (std::string bad = KeepAliasedInputs(driver, stream, buffers,
                                            loaded.num_inputs, loaded.aliases);
        !bad.empty()) {
      return Fail(*site, bad);
    }
  }

  // A shard may leave nothing to launch (an axis of extent 0 here).
  const bool empty = loaded.empty_launch || grid[0] == 0 || grid[1] == 0 ||
                     grid[2] == 0 || (loaded.batch > 0 && batch == 0);
  if (empty) {
    // Nothing to launch, but outputs must never be returned uninitialised.
    // An output aliased to an input keeps the input's values (copied in
    // above where XLA did not hand both the same buffer): no kernel ran to
    // change them.
    for (size_t i = loaded.num_inputs; i < buffers.size(); ++i) {
      if (buffers[i].nbytes == 0) continue;
      const int64_t output = static_cast<int64_t>(i) - loaded.num_inputs;
      const bool aliased =
          std::any_of(loaded.aliases.begin(), loaded.aliases.end(),
                      [output](const Alias& a) { return a.output == output; });
      if (aliased) continue;
      cuda::CUresult r = driver->cuMemsetD8Async(
          reinterpret_cast<cuda::CUdeviceptr>(buffers[i].data), 0,
          buffers[i].nbytes, stream);
      if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
    }
    return ffi::Error::Success();
  }

  if (device < 0 || static_cast<size_t>(device) >= loaded.functions.size() ||
      loaded.functions[device] == nullptr) {
    return Fail(
        *site, "the kernel was not loaded on device " + std::to_string(device));
  }
  cuda::CUfunction function = loaded.functions[device];

  if (loaded.batch > 0 && loaded.fold_axis >= 0) {
    return LaunchFolded(*site, *driver, function, stream, buffers, batch, grid);
  }
  if (loaded.batch > 0) {
    return LaunchPerSlice(*site, *driver, device, function, stream, buffers,
                          batch, grid);
  }
  thread_local KernelArgs packed;
  packed.Reset(loaded.abi);
  AddParams(loaded.scalars, buffers.size(), &packed, [&](size_t i) {
    const BufferView& b = buffers[i];
    packed.AddArray(b.data, b.dims, b.rank, LookupDType(b.dtype)->itemsize);
    return true;
  });
  cuda::CUresult r =
      Launch(*driver, loaded, function, stream, grid, packed.params());
  if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace numbax

XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxKernelInstantiateCuda, numbax::Instantiate,
                              numbax::BindInstantiate());

// No Python and no host work per call: safe to record into CUDA graphs.
XLA_FFI_DEFINE_HANDLER_SYMBOL(NumbaxKernelExecuteCuda, numbax::Execute,
                              numbax::BindCudaExecute<numbax::KernelSite>(),
                              {numbax::ffi::Traits::kCmdBufferCompatible});
