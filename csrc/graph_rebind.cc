#include "graph_rebind.h"

#include <algorithm>
#include <utility>

namespace numbax {
namespace {

// Whether a kernel node runs `launched`, the handle numbax passed to
// cuLaunchKernel: a CUfunction, or a CUkernel (a plan recorded during a
// capture keeps Numba's), which the node may report as the current
// context's function of it.
bool SameFunction(const cuda::Driver& driver,
                  const cuda::KernelNodeParams& node, cuda::CUfunction launched,
                  bool kernel_handle) {
  if (node.func == launched) return true;
  if (node.func == nullptr) {
    return reinterpret_cast<cuda::CUfunction>(node.kern) == launched;
  }
  cuda::CUfunction resolved = nullptr;
  return kernel_handle && driver.cuKernelGetFunction &&
         driver.cuKernelGetFunction(
             &resolved, reinterpret_cast<cuda::CUkernel>(launched)) ==
             cuda::CUDA_SUCCESS &&
         resolved == node.func;
}

}  // namespace

bool Rebinding::MayRebind(const std::vector<BufferView>& buffers) const {
  if (refused_ || !has_reference_) return false;
  const std::vector<void*>& at = reference_.addresses();
  if (at.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].data != at[i] && !confirmed_[i]) return false;
  }
  return true;
}

void Rebinding::Refuse(const std::string& why) {
  refused_ = true;
  why_ = why;
}

bool Rebinding::Learn(LaunchLog&& log) {
  if (refused_) return false;
  if (!log.mapped()) {
    Refuse(log.why());
    return false;
  }
  if (!has_reference_) {
    has_reference_ = true;
    confirmed_.assign(log.addresses().size(), 0);
    reference_ = log;
    last_ = std::move(log);
    return true;
  }
  std::string why;
  if (log.addresses().size() != confirmed_.size() ||
      !SameWork(reference_, log, &why)) {
    Refuse("with its buffers elsewhere, " + why);
    return false;
  }
  for (size_t i = 0; i < confirmed_.size(); ++i) {
    if (log.addresses()[i] != reference_.addresses()[i]) confirmed_[i] = 1;
  }
  last_ = std::move(log);
  return true;
}

bool Rebinding::BoundTo(const std::vector<BufferView>& buffers) const {
  return AtAddresses(bound_, buffers);
}

std::string Rebinding::AdoptGraph(const cuda::Driver& driver,
                                  cuda::CUgraph graph) {
  if (!driver.cuGraphKernelNodeGetParams ||
      !driver.cuGraphExecKernelNodeSetParams || !driver.cuGraphGetNodes) {
    return "the CUDA driver cannot update a graph's kernel nodes";
  }
  const std::vector<RecordedLaunch>& launches = last_.launches();
  // Every node must be a logged launch. A node the log never saw (another
  // thread launching onto the recording stream while func ran) would keep
  // its recorded addresses on every re-bind.
  size_t count = 0;
  if (cuda::CUresult r = driver.cuGraphGetNodes(graph, nullptr, &count);
      r != cuda::CUDA_SUCCESS) {
    return "the graph's nodes cannot be counted: " + cuda::ErrorText(driver, r);
  }
  if (count != launches.size()) {
    return "the recording holds " + std::to_string(count) +
           " nodes but func launched " + std::to_string(launches.size()) +
           " kernels through numbax: other work reached the stream while "
           "func ran";
  }
  std::vector<Node> nodes(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    const RecordedLaunch& l = launches[i];
    Node& n = nodes[i];
    n.node = l.node;
    const std::string which = "kernel node " + std::to_string(i);
    if (cuda::CUresult r = driver.cuGraphKernelNodeGetParams(l.node, &n.params);
        r != cuda::CUDA_SUCCESS) {
      return which + " cannot be read: " + cuda::ErrorText(driver, r);
    }
    // The node must be the launch logged for it.
    if (!SameFunction(driver, n.params, l.function, l.kernel_handle)) {
      return which + " runs another function";
    }
    if (n.params.shared_mem != l.shared_mem || n.params.grid[0] != l.grid[0] ||
        n.params.grid[1] != l.grid[1] || n.params.grid[2] != l.grid[2] ||
        n.params.block[0] != l.block[0] || n.params.block[1] != l.block[1] ||
        n.params.block[2] != l.block[2]) {
      return which + " has another launch configuration";
    }
    if (n.params.extra != nullptr) return which + " passes `extra`";
    n.words = l.words;
    n.pointers.resize(n.words.size());
    for (size_t w = 0; w < n.words.size(); ++w) n.pointers[w] = &n.words[w];
    n.params.kernel_params = n.pointers.data();
  }
  cuda::CUgraphExec exec = nullptr;
  if (cuda::CUresult r = driver.cuGraphInstantiateWithFlags(&exec, graph, 0);
      r != cuda::CUDA_SUCCESS) {
    return "cannot instantiate the graph: " + cuda::ErrorText(driver, r);
  }
  DropGraph();
  driver_ = &driver;
  graph_ = graph;  // kept: its nodes name the executable graph's nodes
  exec_ = exec;
  nodes_ = std::move(nodes);
  bound_ = last_.addresses();
  return "";
}

cuda::CUresult Rebinding::Rebind(const cuda::Driver& driver,
                                 const std::vector<BufferView>& buffers) {
  const std::vector<RecordedLaunch>& launches = reference_.launches();
  thread_local std::vector<int64_t> words;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    BindWords(launches[i], buffers, &words);
    Node& n = nodes_[i];
    if (n.in_sync && words == n.words) continue;  // its buffers stayed
    // Copied in place: the pointers the driver reads stay valid.
    std::copy(words.begin(), words.end(), n.words.begin());
    cuda::CUresult r =
        driver.cuGraphExecKernelNodeSetParams(exec_, n.node, &n.params);
    n.in_sync = r == cuda::CUDA_SUCCESS;
    if (!n.in_sync) {
      bound_.clear();  // partly re-bound: bound to nothing
      return r;
    }
  }
  AddressesOf(buffers, &bound_);
  return cuda::CUDA_SUCCESS;
}

cuda::CUgraphExec Rebinding::ReleaseExec(std::vector<void*>* bound) {
  cuda::CUgraphExec exec = exec_;
  *bound = bound_;
  exec_ = nullptr;
  DropGraph();
  return exec;
}

cuda::CUresult Rebinding::LaunchRebound(const cuda::Driver& driver,
                                        const std::vector<BufferView>& buffers,
                                        cuda::CUstream stream) const {
  thread_local std::vector<int64_t> words;
  thread_local std::vector<void*> pointers;
  for (const RecordedLaunch& l : reference_.launches()) {
    BindWords(l, buffers, &words);
    pointers.resize(words.size());
    for (size_t w = 0; w < words.size(); ++w) pointers[w] = &words[w];
    cuda::CUresult r =
        cuda::LaunchKernel(driver, l.function, l.grid, l.block, l.shared_mem,
                           /*cooperative=*/false, stream, pointers.data());
    if (r != cuda::CUDA_SUCCESS) return r;
  }
  return cuda::CUDA_SUCCESS;
}

void Rebinding::DropGraph() {
  const cuda::Driver* d = driver_;
  // A launched graph may still run: the driver defers the release.
  if (exec_ && d && d->cuGraphExecDestroy) d->cuGraphExecDestroy(exec_);
  if (graph_ && d && d->cuGraphDestroy) d->cuGraphDestroy(graph_);
  driver_ = nullptr;
  exec_ = nullptr;
  graph_ = nullptr;
  nodes_.clear();
  bound_.clear();
}

}  // namespace numbax
