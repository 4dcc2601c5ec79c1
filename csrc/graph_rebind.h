// A capture-mode call site's recording, re-bound to the buffers of each call.
//
// XLA hands a call site new buffer addresses whenever its inputs are new
// arrays (a fresh batch per step). A graph recorded at some addresses is
// wrong at others, so without this each new address set ran func in Python
// and recorded a new graph. A Rebinding keeps one recording per call site
// and device, whose launches were all packed by numbax (launch_log.h), and
// patches the address words of its graph's kernel nodes to each call's
// buffers (cuGraphExecKernelNodeSetParams) before launching it.
//
// Never a guess: the first recording's log is the reference; a buffer may
// be re-bound to a new address only after a second recording, made with
// that buffer elsewhere, launched exactly the same work (SameWork: a grid,
// a scalar or a launch count that depended on the address shows there). A
// recording numbax cannot map, or one that differs, refuses the call site
// for good: it is recorded per address set, as before (GraphCache's LRU).
#pragma once

#include <string>
#include <vector>

#include "call_frame.h"
#include "cuda_driver.h"
#include "launch_log.h"

namespace numbax {

class Rebinding {
 public:
  explicit Rebinding(int device) : device_(device) {}
  ~Rebinding() { DropGraph(); }
  Rebinding(const Rebinding&) = delete;
  Rebinding& operator=(const Rebinding&) = delete;

  int device() const { return device_; }
  // The call site launched work numbax cannot re-bind; why.
  bool refused() const { return refused_; }
  const std::string& why() const { return why_; }

  // Whether a call with `buffers` may replay the reference's launches:
  // every buffer at its recorded address or at one already confirmed.
  bool MayRebind(const std::vector<BufferView>& buffers) const;

  // Takes the log of a recording made with `buffers`: the first becomes the
  // reference, a later one confirms the buffers it moved, or refuses the
  // call site (returns false) when it launched other work or is unmapped.
  bool Learn(LaunchLog&& log);

  // --- numbax's own graph (a call XLA does not record).
  bool has_graph() const { return exec_ != nullptr; }
  bool BoundTo(const std::vector<BufferView>& buffers) const;
  // Adopts `graph`, recorded with the log Learn took last (its node
  // handles): instantiates it and keeps both, in place of any graph before.
  // An empty string; else why not, leaving `graph` to the caller: its nodes
  // cannot be updated (the driver lacks the calls, or a node is not the
  // launch logged for it), or it holds work the log did not see (another
  // thread launched onto the stream during the recording). `driver` must
  // outlive the Rebinding: it destroys the graph.
  std::string AdoptGraph(const cuda::Driver& driver, cuda::CUgraph graph);
  // Points every kernel node at `buffers` (MayRebind must hold).
  cuda::CUresult Rebind(const cuda::Driver& driver,
                        const std::vector<BufferView>& buffers);
  cuda::CUgraphExec exec() const { return exec_; }
  // Gives up the graph: its executable graph (the caller owns it, or null)
  // and the addresses it is bound to.
  cuda::CUgraphExec ReleaseExec(std::vector<void*>* bound);

  // --- a call XLA records into its command buffer: the reference's
  // launches, re-bound to `buffers`, issued on `stream` (captured there).
  cuda::CUresult LaunchRebound(const cuda::Driver& driver,
                               const std::vector<BufferView>& buffers,
                               cuda::CUstream stream) const;

  // Marks the call site not re-bindable, for `why`.
  void Refuse(const std::string& why);

 private:
  struct Node {
    cuda::CUgraphNode node = nullptr;
    cuda::KernelNodeParams params{};
    std::vector<int64_t> words;
    std::vector<void*> pointers;  // &words[i], as the driver takes them
    // Whether the executable graph's node holds `words`. Cleared when the
    // driver refused an update: the node's parameters are then unknown,
    // so the next re-bind sets them whatever `words` says.
    bool in_sync = true;
  };
  void DropGraph();

  int device_;
  bool refused_ = false;
  std::string why_;
  bool has_reference_ = false;
  LaunchLog reference_;
  LaunchLog last_;                  // the log of the most recent recording
  std::vector<uint8_t> confirmed_;  // per buffer: may move
  // The driver that made the graph, which also destroys it.
  const cuda::Driver* driver_ = nullptr;
  cuda::CUgraph graph_ = nullptr;
  cuda::CUgraphExec exec_ = nullptr;
  std::vector<Node> nodes_;
  std::vector<void*> bound_;
};

}  // namespace numbax
