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

bool SameBuffers(const std::vector<void*>& pointers,
                 const std::vector<BufferView>& buffers) {
  if (pointers.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (pointers[i] != buffers[i].data) return false;
  }
  return true;
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

cuda::CUgraphExec GraphCache::Find(int device,
                                   const std::vector<BufferView>& buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->device == device && SameBuffers(it->pointers, buffers)) {
      if (it != entries_.begin()) {
        entries_.splice(entries_.begin(), entries_, it);
      }
      return entries_.front().exec;
    }
  }
  return nullptr;
}

void GraphCache::Insert(int device, const std::vector<BufferView>& buffers,
                        cuda::CUgraphExec exec) {
  Entry e{device, {}, exec};
  e.pointers.reserve(buffers.size());
  for (const BufferView& b : buffers) e.pointers.push_back(b.data);
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_front(std::move(e));
  const size_t capacity = std::max<size_t>(1, g_capacity.load());
  while (entries_.size() > capacity) {
    DestroyLocked(entries_.back());
    entries_.pop_back();
    ++GraphStats().evictions;
  }
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
    const bool repeat = SameBuffers(pointers, buffers);
    if (!repeat) {
      pointers.clear();
      for (const BufferView& b : buffers) pointers.push_back(b.data);
    }
    return repeat;
  }
  std::vector<void*> pointers;
  for (const BufferView& b : buffers) pointers.push_back(b.data);
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
