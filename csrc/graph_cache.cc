#include "graph_cache.h"

#include <algorithm>
#include <set>

namespace numbax {
namespace {

std::atomic<size_t> g_capacity{16};

std::mutex& LiveMutex() {
  static auto* m = new std::mutex;  // leaked: used during shutdown
  return *m;
}
std::set<GraphCache*>& Live() {
  static auto* s = new std::set<GraphCache*>;
  return *s;
}

}  // namespace

GraphCounters& GraphStats() {
  static GraphCounters counters;
  return counters;
}

GraphCache::GraphCache() {
  std::lock_guard<std::mutex> lock(LiveMutex());
  Live().insert(this);
}

GraphCache::~GraphCache() {
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().erase(this);
  }
  Clear();
}

cuda::CUgraphExec GraphCache::FindLocked(
    int device, const std::vector<BufferView>& buffers) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->device == device && AtAddresses(it->pointers, buffers)) {
      if (it != entries_.begin()) {
        entries_.splice(entries_.begin(), entries_, it);
      }
      return entries_.front().exec;
    }
  }
  return nullptr;
}

bool GraphCache::LaunchFound(const cuda::Driver& driver, int device,
                             const std::vector<BufferView>& buffers,
                             cuda::CUstream stream, cuda::CUresult* result) {
  std::lock_guard<std::mutex> lock(mutex_);
  cuda::CUgraphExec exec = FindLocked(device, buffers);
  if (exec) *result = driver.cuGraphLaunch(exec, stream);
  return exec != nullptr;
}

void GraphCache::Insert(int device, const std::vector<BufferView>& buffers,
                        cuda::CUgraphExec exec) {
  std::vector<void*> pointers;
  AddressesOf(buffers, &pointers);
  std::lock_guard<std::mutex> lock(mutex_);
  InsertLocked(device, std::move(pointers), exec);
}

void GraphCache::InsertLocked(int device, std::vector<void*> pointers,
                              cuda::CUgraphExec exec) {
  entries_.push_front(Entry{device, std::move(pointers), exec});
  const size_t capacity = std::max<size_t>(1, g_capacity.load());
  while (entries_.size() > capacity) {
    DestroyLocked(entries_.back());
    entries_.pop_back();
    ++GraphStats().evictions;
  }
}

Rebinding& GraphCache::RebindingLocked(int device) {
  for (auto& r : rebindings_) {
    if (r->device() == device) return *r;
  }
  rebindings_.push_back(std::make_unique<Rebinding>(device));
  return *rebindings_.back();
}

std::string GraphCache::LearnLocked(Rebinding& rebinding, LaunchLog&& log) {
  // A transiently unmapped log teaches nothing: the next recording maps.
  if (rebinding.refused() || log.transient()) return "";
  if (rebinding.Learn(std::move(log))) return "";
  ++GraphStats().rebind_refusals;
  if (rebinding.has_graph()) {
    // Still right at the addresses it is bound to: kept as any recording.
    std::vector<void*> bound;
    cuda::CUgraphExec exec = rebinding.ReleaseExec(&bound);
    if (!bound.empty()) {
      InsertLocked(rebinding.device(), std::move(bound), exec);
    } else if (const cuda::Driver* d = cuda::Load();
               d && d->cuGraphExecDestroy) {
      d->cuGraphExecDestroy(exec);
    }
  }
  return rebinding.why();
}

GraphCache::Replay GraphCache::Launch(const cuda::Driver& driver, int device,
                                      const std::vector<BufferView>& buffers,
                                      cuda::CUstream stream,
                                      cuda::CUresult* result) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& r : rebindings_) {
    if (r->device() != device || !r->has_graph()) continue;
    // Re-bound and launched under the lock: another thread's call must not
    // re-bind the graph between the two.
    if (r->BoundTo(buffers)) {
      *result = driver.cuGraphLaunch(r->exec(), stream);
      ++GraphStats().hits;
      return Replay::kHit;
    }
    if (!r->MayRebind(buffers)) break;
    *result = r->Rebind(driver, buffers);
    if (*result == cuda::CUDA_SUCCESS) {
      *result = driver.cuGraphLaunch(r->exec(), stream);
    }
    ++GraphStats().rebinds;
    return Replay::kRebound;
  }
  if (cuda::CUgraphExec exec = FindLocked(device, buffers)) {
    *result = driver.cuGraphLaunch(exec, stream);
    ++GraphStats().hits;
    return Replay::kHit;
  }
  return Replay::kNone;
}

cuda::CUresult GraphCache::AddRecording(const cuda::Driver& driver, int device,
                                        const std::vector<BufferView>& buffers,
                                        cuda::CUgraph graph, LaunchLog&& log,
                                        cuda::CUstream stream,
                                        std::string* stage,
                                        std::string* refusal) {
  std::lock_guard<std::mutex> lock(mutex_);
  Rebinding& rebinding = RebindingLocked(device);
  const bool learnable = !log.transient();
  *refusal = LearnLocked(rebinding, std::move(log));
  if (learnable && !rebinding.refused()) {
    const std::string why = rebinding.AdoptGraph(driver, graph);
    if (why.empty()) {
      *stage = "launching the graph";
      return driver.cuGraphLaunch(rebinding.exec(), stream);
    }
    rebinding.Refuse(why);
    *refusal = why;
    ++GraphStats().rebind_refusals;
  }
  cuda::CUgraphExec exec = nullptr;
  cuda::CUresult r = driver.cuGraphInstantiateWithFlags(&exec, graph, 0);
  driver.cuGraphDestroy(graph);
  if (r != cuda::CUDA_SUCCESS) {
    *stage = "instantiating the captured graph";
    return r;
  }
  std::vector<void*> pointers;
  AddressesOf(buffers, &pointers);
  InsertLocked(device, std::move(pointers), exec);
  *stage = "launching the graph";
  return driver.cuGraphLaunch(exec, stream);
}

bool GraphCache::LaunchRecorded(const cuda::Driver& driver, int device,
                                const std::vector<BufferView>& buffers,
                                cuda::CUstream stream, cuda::CUresult* result) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& r : rebindings_) {
    if (r->device() != device) continue;
    if (!r->MayRebind(buffers)) return false;
    *result = r->LaunchRebound(driver, buffers, stream);
    ++GraphStats().rebinds;
    return true;
  }
  return false;
}

std::string GraphCache::Learn(int device, LaunchLog&& log) {
  std::lock_guard<std::mutex> lock(mutex_);
  return LearnLocked(RebindingLocked(device), std::move(log));
}

bool GraphCache::Refused(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : rebindings_) {
    if (r->device() == device) return r->refused();
  }
  return false;
}

bool GraphCache::Warmed(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::find(warmed_.begin(), warmed_.end(), device) != warmed_.end();
}

void GraphCache::MarkWarmed(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(warmed_.begin(), warmed_.end(), device) == warmed_.end()) {
    warmed_.push_back(device);
  }
}

bool GraphCache::RepeatsLastMiss(int device,
                                 const std::vector<BufferView>& buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [where, pointers] : last_miss_) {
    if (where != device) continue;
    const bool repeat = AtAddresses(pointers, buffers);
    if (!repeat) AddressesOf(buffers, &pointers);
    return repeat;
  }
  std::vector<void*> pointers;
  AddressesOf(buffers, &pointers);
  last_miss_.emplace_back(device, std::move(pointers));
  return false;
}

void GraphCache::DestroyLocked(Entry& e) {
  // A launched graph may still be running: cuGraphExecDestroy is safe to
  // call then (the driver defers the release until the work completes).
  if (const cuda::Driver* d = cuda::Load(); d && d->cuGraphExecDestroy) {
    d->cuGraphExecDestroy(e.exec);
  }
  e.exec = nullptr;
}

void GraphCache::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Entry& e : entries_) DestroyLocked(e);
  entries_.clear();
  rebindings_.clear();
}

namespace {
std::mutex& RefusalMutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::pair<std::string, std::string>>& Refusals() {
  static auto* v = new std::vector<std::pair<std::string, std::string>>;
  return *v;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> RebindRefusals() {
  std::lock_guard<std::mutex> lock(RefusalMutex());
  return Refusals();
}

void NoteRebindRefusal(const std::string& key, const std::string& why) {
  std::lock_guard<std::mutex> lock(RefusalMutex());
  auto& all = Refusals();
  if (all.size() >= 64) all.erase(all.begin());
  all.emplace_back(key, why);
}

void GraphCache::SetCapacity(size_t capacity) {
  g_capacity = std::max<size_t>(1, capacity);
}

size_t GraphCache::Capacity() { return g_capacity.load(); }

void GraphCache::ClearAll() {
  std::lock_guard<std::mutex> lock(LiveMutex());
  for (GraphCache* c : Live()) c->Clear();
}

cuda::CUresult RecordingStream(const cuda::Driver& driver, int device,
                               cuda::CUstream* out) {
  thread_local std::vector<cuda::CUstream> streams;
  if (device < 0) return cuda::CUDA_ERROR_INVALID_DEVICE;
  if (static_cast<size_t>(device) >= streams.size()) {
    streams.resize(static_cast<size_t>(device) + 1, nullptr);
  }
  if (!streams[device]) {
    if (!driver.cuStreamCreate) return cuda::CUDA_ERROR_NOT_FOUND;
    // A blocking stream on purpose: a launch that forgets the stream goes to
    // the legacy default stream, which must then wait for the capturing
    // stream, and the driver refuses that (CAPTURE_IMPLICIT) instead of
    // running the launch outside the graph.
    cuda::CUresult r = driver.cuStreamCreate(&streams[device], 0);
    if (r != cuda::CUDA_SUCCESS) return r;
  }
  *out = streams[device];
  return cuda::CUDA_SUCCESS;
}

}  // namespace numbax
