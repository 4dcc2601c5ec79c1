// Call frame -> device binding -> cuLaunchKernel, for numba_cuda_kernel.
#include "kernel_handler.h"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"
#include "device_binding.h"
#include "ffi_binding.h"
#include "kernel_args.h"
#include "kernel_site.h"
#include "python_errors.h"

namespace numbax {
namespace {

ffi::ErrorOr<std::unique_ptr<KernelSite>> Instantiate(
    ffi::RemainingArgs, ffi::RemainingRets, std::string_view key) {
  return KernelSite::Create(key);
}

ffi::Error Fail(const KernelSite& site, const std::string& what) {
  return ffi::Error::Internal(OpMessage(OpKind::kKernel, site.key(), what));
}

ffi::Error LaunchError(const KernelSite& site, const cuda::Driver& driver,
                       cuda::CUresult r) {
  return Fail(site, "launch failed: " + cuda::ErrorText(driver, r));
}

cuda::CUresult Launch(const cuda::Driver& driver, const LaunchPlan& plan,
                      cuda::CUfunction function, cuda::CUstream stream,
                      const std::array<unsigned, 3>& grid, void** params) {
  return cuda::LaunchKernel(driver, function, grid.data(), plan.block.data(),
                            plan.shared_mem, plan.cooperative, stream, params);
}

// vmap in one launch: the generated batched kernel gets whole batched
// buffers and takes slice blockIdx.<fold_axis> of each; batches above the
// axis's limit are split into chunks, each launched over its own slices.
ffi::Error LaunchFolded(const KernelSite& site, const cuda::Driver& driver,
                        cuda::CUfunction function, cuda::CUstream stream,
                        const std::vector<BufferView>& buffers) {
  const LaunchPlan& plan = site.plan();
  thread_local KernelArgs packed;
  for (int64_t start = 0; start < plan.batch; start += plan.max_slices) {
    const int64_t count = std::min(plan.max_slices, plan.batch - start);
    packed.Reset(plan.abi);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const bool reuse = i < plan.broadcast.size() && plan.broadcast[i];
      if (!AddBatchChunk(buffers[i], plan.batch, start, count, reuse,
                         &packed)) {
        return Fail(site, "buffer " + std::to_string(i) + " (rank " +
                              std::to_string(buffers[i].rank) +
                              ") does not hold " + std::to_string(plan.batch) +
                              " slices along axis 0 for a vmapped launch");
      }
    }
    std::array<unsigned, 3> grid = plan.grid;
    grid[plan.fold_axis] = static_cast<unsigned>(count);
    cuda::CUresult r =
        Launch(driver, plan, function, stream, grid, packed.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(site, driver, r);
  }
  return ffi::Error::Success();
}

ffi::Error Execute(void* stream_ptr, int32_t device, KernelSite* site,
                   std::string_view /*key*/, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  const LaunchPlan& plan = site->plan();
  thread_local std::vector<BufferView> buffers;
  if (ffi::Error err = DecodeCallBuffers(args, rets, plan.num_inputs,
                                         plan.num_outputs, &buffers);
      err.failure()) {
    return Fail(*site, err.message());
  }
  std::string why;
  const cuda::Driver* driver = cuda::Load(&why);
  if (!driver) return Fail(*site, why);
  auto stream = static_cast<cuda::CUstream>(stream_ptr);
  DeviceBinding bind(*driver, device);
  if (!bind.ok()) return Fail(*site, bind.Error());

  if (plan.empty_launch) {
    // Nothing to launch, but outputs must never be returned uninitialised.
    // An output aliased to an input (XLA hands both the same buffer) keeps
    // the input's values: no kernel ran to change them.
    for (size_t i = plan.num_inputs; i < buffers.size(); ++i) {
      if (buffers[i].nbytes == 0) continue;
      bool aliased = false;
      for (size_t j = 0; j < static_cast<size_t>(plan.num_inputs); ++j) {
        aliased |= buffers[j].data == buffers[i].data;
      }
      if (aliased) continue;
      cuda::CUresult r = driver->cuMemsetD8Async(
          reinterpret_cast<cuda::CUdeviceptr>(buffers[i].data), 0,
          buffers[i].nbytes, stream);
      if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
    }
    return ffi::Error::Success();
  }

  if (device < 0 || static_cast<size_t>(device) >= plan.functions.size() ||
      plan.functions[device] == nullptr) {
    return Fail(
        *site, "the kernel was not loaded on device " + std::to_string(device));
  }
  cuda::CUfunction function = plan.functions[device];

  thread_local KernelArgs packed;
  if (plan.batch > 0 && plan.fold_axis >= 0) {
    return LaunchFolded(*site, *driver, function, stream, buffers);
  }
  const int64_t slices = plan.batch > 0 ? plan.batch : 1;
  for (int64_t s = 0; s < slices; ++s) {
    packed.Reset(plan.abi);
    for (size_t i = 0; i < buffers.size(); ++i) {
      const BufferView& b = buffers[i];
      const size_t itemsize = LookupDType(b.dtype)->itemsize;
      if (plan.batch == 0) {
        packed.AddArray(b.data, b.dims, b.rank, itemsize);
        continue;
      }
      // Batched: axis 0 is the vmap axis; the kernel sees one slice.
      const bool reuse = i < plan.broadcast.size() && plan.broadcast[i];
      if (!AddBatchSlice(b, plan.batch, s, reuse, &packed)) {
        return Fail(*site, "buffer " + std::to_string(i) + " (rank " +
                               std::to_string(b.rank) + ") does not hold " +
                               std::to_string(plan.batch) +
                               " slices along axis 0 for a vmapped launch");
      }
    }
    cuda::CUresult r =
        Launch(*driver, plan, function, stream, plan.grid, packed.params());
    if (r != cuda::CUDA_SUCCESS) return LaunchError(*site, *driver, r);
  }
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
