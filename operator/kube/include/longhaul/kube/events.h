// EventRecorder: writes core/v1 Events about objects ("kubectl describe tj x" shows them), like
// client-go's recorder: source.component and reportingComponent "longhaul-operator", first and
// last timestamps, and a count. A repeat of the same (object, type, reason, message) patches
// the existing Event's count and lastTimestamp instead of creating another Event (the Event is
// re-created if it was garbage-collected meanwhile).
//
// Recording never throws into the caller: API failures are logged and the event is dropped.
// Calls are synchronous (one API request each) and serialised per recorder.
//
// Thread-safety: safe for concurrent use.
#pragma once

#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "longhaul/base/mutex.h"
#include "longhaul/kube/client.h"

namespace longhaul::kube {

struct EventRecorderOptions {
  std::string component = "longhaul-operator";  // source.component and reportingComponent
  std::string host;                             // source.host (node name), optional
  std::string reporting_instance;               // e.g. the operator pod name; hostname if empty
  size_t cache_size = 4096;                     // aggregated (object, reason, message) entries
};

class EventRecorder {
 public:
  static constexpr const char* kNormal = "Normal";
  static constexpr const char* kWarning = "Warning";

  explicit EventRecorder(std::shared_ptr<Client> client, EventRecorderOptions options = {});

  // `object` is the involved object as read from the API (apiVersion, kind, metadata name,
  // namespace, uid, resourceVersion are used). `type` is kNormal or kWarning.
  void record(const json& object, std::string_view type, std::string_view reason,
              std::string_view message);
  void normal(const json& object, std::string_view reason, std::string_view message) {
    record(object, kNormal, reason, message);
  }
  void warning(const json& object, std::string_view reason, std::string_view message) {
    record(object, kWarning, reason, message);
  }

 private:
  struct Aggregate {
    std::string ns;
    std::string name;  // the Event's name
    int64_t count = 0;
    std::list<std::string>::iterator lru;
  };
  json make_event(const json& object, std::string_view type, std::string_view reason,
                  const std::string& message, const std::string& now) const;

  const std::shared_ptr<Client> client_;
  EventRecorderOptions options_;
  Mutex mu_;  // serialises recording
  std::unordered_map<std::string, Aggregate> cache_ GUARDED_BY(mu_);
  std::list<std::string> lru_ GUARDED_BY(mu_);  // most recent first
};

}  // namespace longhaul::kube
