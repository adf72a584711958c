// Kubernetes Events (see events.h).
#include "longhaul/kube/events.h"

#include <cstdio>

#include <unistd.h>

#include "longhaul/base/log.h"
#include "longhaul/kube/leader_election.h"

namespace longhaul::kube {

namespace {

constexpr size_t kMaxMessage = 1024;

std::string meta(const json& object, const char* field) {
  if (!object.is_object() || !object.contains("metadata")) return "";
  const json& m = object["metadata"];
  if (!m.is_object() || !m.contains(field) || !m[field].is_string()) return "";
  return m[field].get<std::string>();
}

std::string hostname() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

}  // namespace

EventRecorder::EventRecorder(std::shared_ptr<Client> client, EventRecorderOptions options)
    : client_(std::move(client)), options_(std::move(options)) {
  if (options_.reporting_instance.empty()) options_.reporting_instance = hostname();
}

json EventRecorder::make_event(const json& object, std::string_view type, std::string_view reason,
                               const std::string& message, const std::string& now) const {
  const std::string ns = meta(object, "namespace");
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, "%llx", static_cast<unsigned long long>(nanos));
  json involved = {{"kind", object.value("kind", "")},
                   {"apiVersion", object.value("apiVersion", "")},
                   {"name", meta(object, "name")}};
  if (!ns.empty()) involved["namespace"] = ns;
  if (auto uid = meta(object, "uid"); !uid.empty()) involved["uid"] = uid;
  if (auto rv = meta(object, "resourceVersion"); !rv.empty()) involved["resourceVersion"] = rv;
  json source = {{"component", options_.component}};
  if (!options_.host.empty()) source["host"] = options_.host;
  return {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata",
       {{"name", meta(object, "name") + "." + suffix}, {"namespace", ns.empty() ? "default" : ns}}},
      {"involvedObject", involved},
      {"reason", std::string(reason)},
      {"message", message},
      {"type", std::string(type)},
      {"source", source},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1},
      {"reportingComponent", options_.component},
      {"reportingInstance", options_.reporting_instance}};
}

void EventRecorder::record(const json& object, std::string_view type, std::string_view reason,
                           std::string_view message_view) {
  std::string message(message_view.substr(0, kMaxMessage));
  const std::string key = object.value("kind", "") + "\x1f" + meta(object, "namespace") + "\x1f" +
                          meta(object, "name") + "\x1f" + meta(object, "uid") + "\x1f" +
                          std::string(type) + "\x1f" + std::string(reason) + "\x1f" + message;
  const std::string now = format_time(std::chrono::system_clock::now());
  try {
    MutexLock lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      Aggregate& agg = it->second;
      lru_.erase(agg.lru);
      lru_.push_front(key);
      agg.lru = lru_.begin();
      try {
        client_->patch(resources::kEvents, agg.ns, agg.name,
                       {{"count", agg.count + 1}, {"lastTimestamp", now}}, PatchType::kMerge);
        ++agg.count;
        return;
      } catch (const NotFoundError&) {
        // The Event expired (the API server keeps them about an hour): create a new one.
        lru_.erase(agg.lru);
        cache_.erase(it);
      }
    }
    json event = make_event(object, type, reason, message, now);
    json created = client_->create(resources::kEvents,
                                   event["metadata"]["namespace"].get<std::string>(), event);
    lru_.push_front(key);
    cache_[key] =
        Aggregate{event["metadata"]["namespace"].get<std::string>(),
                  created.contains("metadata") ? meta(created, "name")
                                               : event["metadata"]["name"].get<std::string>(),
                  1, lru_.begin()};
    if (cache_[key].name.empty()) cache_[key].name = event["metadata"]["name"].get<std::string>();
    while (cache_.size() > options_.cache_size && !lru_.empty()) {
      cache_.erase(lru_.back());
      lru_.pop_back();
    }
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "could not record event" << kv("object", meta(object, "name"))
                    << kv("reason", reason) << kv("message", message) << kv("error", e.what());
  }
}

}  // namespace longhaul::kube
