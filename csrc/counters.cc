#include "counters.h"

#include "aliases.h"

#include "fast_launch.h"
#include "graph_cache.h"

namespace numbax {

std::vector<std::pair<std::string, uint64_t>> CounterSnapshot() {
  const BridgeCounters& c = Counters();
  std::vector<std::pair<std::string, uint64_t>> all = {
      {"calls", c.calls},
      {"array_hits", c.array_hits},
      {"array_misses", c.array_misses},
      {"stream_hits", c.stream_hits},
      {"stream_misses", c.stream_misses},
      {"errors", c.errors},
      {"resolves", c.resolves},
  };
  all.emplace_back("alias_copies", AliasCopyCount().load());
  const GraphCounters& g = GraphStats();
  all.emplace_back("graph_hits", g.hits.load());
  all.emplace_back("graph_misses", g.misses.load());
  all.emplace_back("graph_evictions", g.evictions.load());
  all.emplace_back("graph_rebinds", g.rebinds.load());
  all.emplace_back("graph_rebind_refusals", g.rebind_refusals.load());
  all.emplace_back("xla_captures", g.xla_captures.load());
  all.emplace_back("slice_graph_records", g.slice_records.load());
  all.emplace_back("slice_graph_replays", g.slice_replays.load());
  const FastLaunchCounters& f = FastCounters();
  all.emplace_back("fast_launches", f.fast);
  all.emplace_back("cached_launch_plans", f.cached_plans);
  uint64_t fallbacks = 0;
  for (int i = 0; i < kFallbackReasonCount; ++i) {
    all.emplace_back("fallback_" + std::string(FallbackReasonName(i)),
                     f.fallbacks[i]);
    fallbacks += f.fallbacks[i];
  }
  all.emplace_back("fast_launch_fallbacks", fallbacks);
  return all;
}

void ResetCounters() {
  Counters() = {};
  AliasCopyCount() = 0;
  GraphCounters& g = GraphStats();
  g.hits = 0;
  g.misses = 0;
  g.evictions = 0;
  g.rebinds = 0;
  g.rebind_refusals = 0;
  g.xla_captures = 0;
  g.slice_records = 0;
  g.slice_replays = 0;
  FastCounters() = {};
}

}  // namespace numbax
