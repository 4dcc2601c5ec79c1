// numbax's counters, for tests and diagnostics (numbax._core.counters()).
//
// The bridge's own counters live here; the graph cache and the fast launch
// path keep theirs beside their code (graph_cache.h, fast_launch.h), and
// CounterSnapshot reads all three.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace numbax {

// Updated under the GIL.
struct BridgeCounters {
  uint64_t calls = 0;
  uint64_t array_hits = 0;
  uint64_t array_misses = 0;
  uint64_t stream_hits = 0;
  uint64_t stream_misses = 0;
  uint64_t errors = 0;
  uint64_t resolves = 0;  // keys resolved at XLA's instantiate stage
};

// Inline (one object for the whole program): bumped several times per call
// from the call site, the stream cache and the handlers.
inline BridgeCounters& Counters() {
  static BridgeCounters counters;
  return counters;
}

// Every counter by name, in a fixed order: the bridge's, the graph
// cache's, then the fast launch path's (one per fallback reason, and
// their sum).
std::vector<std::pair<std::string, uint64_t>> CounterSnapshot();

// Sets every counter above to zero.
void ResetCounters();

}  // namespace numbax
