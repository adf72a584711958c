// Where the reconciler's Kubernetes Events go: one per decision ("kubectl describe tj x" shows
// them). The operator records through kube::EventRecorder (RecorderEventSink); tests pass a sink
// that keeps what it is given.
//
// Thread-safety: implementations must be safe for concurrent use (reconciles of different jobs
// run at once) and must not throw.
#pragma once

#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "longhaul/kube/events.h"

namespace longhaul::controller {

class EventSink {
 public:
  virtual ~EventSink() = default;
  // type: "Normal" or "Warning".
  virtual void record(const nlohmann::json& involved_object, std::string_view type,
                      std::string_view reason, std::string_view message) = 0;
};

// Records through operator/kube's EventRecorder (aggregates repeats into one Event with a count).
class RecorderEventSink : public EventSink {
 public:
  explicit RecorderEventSink(std::shared_ptr<kube::EventRecorder> recorder)
      : recorder_(std::move(recorder)) {}
  void record(const nlohmann::json& involved_object, std::string_view type, std::string_view reason,
              std::string_view message) override {
    recorder_->record(involved_object, type, reason, message);
  }

 private:
  std::shared_ptr<kube::EventRecorder> recorder_;
};

}  // namespace longhaul::controller
