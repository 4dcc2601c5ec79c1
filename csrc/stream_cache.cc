#include "stream_cache.h"

#include <cstdint>
#include <vector>

#include "counters.h"

namespace numbax {
namespace {

struct CachedStream {
  int device;
  void* stream;
  PyObject* object;  // strong reference
};
std::vector<CachedStream>& StreamCache() {
  static auto* cache = new std::vector<CachedStream>();  // leaked on purpose
  return *cache;
}
constexpr size_t kMaxStreams = 64;

}  // namespace

PyObject* StreamFor(Platform platform, int device, void* stream) {
  auto& cache = StreamCache();
  for (auto& c : cache) {
    if (c.device == device && c.stream == stream) {
      ++Counters().stream_hits;
      return c.object;
    }
  }
  ++Counters().stream_misses;
  PyObject* object =
      platform == Platform::kCuda
          ? PyObject_CallFunction(Hooks().device_stream, "Ki",
                                  static_cast<unsigned long long>(
                                      reinterpret_cast<uintptr_t>(stream)),
                                  device)
          : PyObject_CallNoArgs(Hooks().host_stream);
  if (!object) return nullptr;
  if (cache.size() == kMaxStreams) {
    Py_DECREF(cache.front().object);
    cache.erase(cache.begin());
  }
  cache.push_back(CachedStream{device, stream, object});
  return object;
}

void ClearStreamCache() {
  for (auto& c : StreamCache()) Py_DECREF(c.object);
  StreamCache().clear();
}

}  // namespace numbax
