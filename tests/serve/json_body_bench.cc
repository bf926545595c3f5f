// Time and peak memory of the bounded request-body parser (serve/json_body.h) on the bodies of issue 35
// point 4, for the closing note (figures are reported, not asserted):
//   serve_json_body_bench            16 MB objects of 1M keys and 16 MB of `[{},{},...]`, with the
//                                    default limits (refused) and with limits raised to accept them
//   serve_json_body_bench --baseline the same shapes through nlohmann::ordered_json::parse, at sizes it
//                                    finishes in seconds (its object insert is a linear search)
// Peak memory is the live heap's high-water mark over the parse (a counting operator new) and the
// growth of VmHWM (reset through /proc/self/clear_refs before each run).
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "serve/api/json_body.h"

namespace {

std::atomic<size_t> g_live{0}, g_peak{0};

void note_alloc(void* p) {
  if (!p) return;
  const size_t now = g_live.fetch_add(malloc_usable_size(p)) + malloc_usable_size(p);
  size_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

void* operator new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  g_live.fetch_sub(malloc_usable_size(p));
  std::free(p);
}
void operator delete(void* p, size_t) noexcept { operator delete(p); }

namespace {

using cedar::serve::JsonLimits;
using cedar::serve::OrderedJson;

size_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + std::strlen(field), nullptr, 10);
  return 0;
}

void reset_hwm() { std::ofstream("/proc/self/clear_refs") << "5"; }

// `{"k0000000":0,"k0000001":1,...}` with `keys` members.
std::string object_body(size_t keys) {
  std::string text = "{";
  text.reserve(keys * 18 + 2);
  char member[48];
  for (size_t i = 0; i < keys; ++i) {
    const int n = std::snprintf(member, sizeof member, "%s\"k%07zu\":%zu", i ? "," : "", i, i % 100000);
    text.append(member, static_cast<size_t>(n));
  }
  return text + "}";
}

// `[{},{},...]` of about `bytes` bytes.
std::string empty_objects_body(size_t bytes) {
  std::string text = "[{}";
  text.reserve(bytes + 4);
  while (text.size() + 3 < bytes) text += ",{}";
  return text + "]";
}

template <class Parse>
void measure(const char* name, const std::string& body, Parse&& parse) {
  const size_t rss_before = status_kib("VmRSS:");
  reset_hwm();
  const size_t live_before = g_live.load();
  g_peak.store(live_before);
  const auto start = std::chrono::steady_clock::now();
  const std::string outcome = parse();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t heap_peak = g_peak.load() - live_before;
  const size_t hwm_growth = status_kib("VmHWM:") - std::min(rss_before, status_kib("VmHWM:"));
  std::printf("%-58s %6.1f MB body: %-44s %7.3f s, heap peak +%6.1f MB (%4.1fx body), VmHWM +%6.1f MB\n", name,
              body.size() / 1e6, outcome.c_str(), seconds, heap_peak / 1e6,
              static_cast<double>(heap_peak) / static_cast<double>(body.size()), hwm_growth * 1024 / 1e6);
}

std::string bounded(const std::string& body, const JsonLimits& limits) {
  OrderedJson out;
  auto error = cedar::serve::parse_json_bounded(body, limits, &out);
  if (!error) return "accepted (" + std::to_string(out.size()) + " members/elements)";
  std::string message = error->message.substr(0, 60);
  return "refused: " + message.substr(message.find(' ', 12) + 1) + "...";
}

}  // namespace

int main(int argc, char** argv) {
  const bool baseline = argc > 1 && std::strcmp(argv[1], "--baseline") == 0;
  JsonLimits raised;
  raised.max_object_keys = 1u << 22;
  raised.max_values = 1u << 24;
  raised.memory_factor = 64;
  if (!baseline) {
    const std::string object = object_body(1000000);
    measure("1M-key object, default limits", object, [&] { return bounded(object, JsonLimits{}); });
    measure("1M-key object, limits raised", object, [&] { return bounded(object, raised); });
    const std::string empties = empty_objects_body(16u << 20);
    measure("[{},{},...], default limits", empties, [&] { return bounded(empties, JsonLimits{}); });
    measure("[{},{},...], limits raised", empties, [&] { return bounded(empties, raised); });
    return 0;
  }
  for (size_t keys : {25000, 50000, 100000}) {
    const std::string object = object_body(keys);
    const std::string name = "nlohmann::ordered_json::parse, " + std::to_string(keys / 1000) + "k-key object";
    measure(name.c_str(), object, [&] { return "parsed, " + std::to_string(OrderedJson::parse(object).size()) + " keys"; });
  }
  const std::string empties = empty_objects_body(16u << 20);
  measure("nlohmann::ordered_json::parse, [{},{},...]", empties,
          [&] { return "parsed, " + std::to_string(OrderedJson::parse(empties).size()) + " elements"; });
  return 0;
}
