// Event sinks (see event_sink.h).
#include "longhaul/controller/event_sink.h"

#include <atomic>
#include <chrono>
#include <cstdio>

#include "longhaul/api/trainingjob.h"
#include "longhaul/base/log.h"

namespace longhaul::controller {

namespace res = kube::resources;
using std::chrono::duration_cast;

void ApiEventSink::record(const json& obj, std::string_view type, std::string_view reason,
                          std::string_view message) {
  static std::atomic<uint64_t> counter{0};
  const json& md = obj.at("metadata");
  const std::string ns = md.value("namespace", std::string("default"));
  const auto now = std::chrono::system_clock::now();
  const uint64_t unique =
      static_cast<uint64_t>(
          duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()) +
      counter.fetch_add(1);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(unique));
  const std::string ts = api::format_time(now);
  json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", md.value("name", std::string()) + "." + suffix}, {"namespace", ns}}},
      {"involvedObject",
       {{"apiVersion", obj.value("apiVersion", std::string())},
        {"kind", obj.value("kind", std::string())},
        {"name", md.value("name", std::string())},
        {"namespace", ns},
        {"uid", md.value("uid", std::string())},
        {"resourceVersion", md.value("resourceVersion", std::string())}}},
      {"reason", reason},
      {"message", message},
      {"type", type},
      {"source", {{"component", component_}}},
      {"reportingComponent", component_},
      {"firstTimestamp", ts},
      {"lastTimestamp", ts},
      {"count", 1}};
  try {
    client_.create(res::kEvents, ns, event);
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "could not record event" << kv("reason", reason) << kv("error", e.what());
  }
}

}  // namespace longhaul::controller
