// Expectations: the pod creates and deletes the reconciler issued that its ClusterView (an
// informer cache) has not shown yet, per job. They only avoid redundant writes while the cache
// lags behind the operator's own writes; correctness never depends on them (pods are named
// deterministically, a create of an existing name is a 409, decisions live in the job's status).
// Entries expire after `ttl`, so a write whose watch event was lost is retried.
//
// Thread-safety: every method takes one mutex.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "longhaul/base/mutex.h"

namespace longhaul::controller {

class Expectations {
 public:
  using json = nlohmann::json;

  explicit Expectations(std::chrono::steady_clock::duration ttl = std::chrono::seconds(60))
      : ttl_(ttl) {}
  void expect_deletion(const std::string& job_key, const std::string& pod, const std::string& uid);
  void expect_creation(const std::string& job_key, const std::string& pod);
  // Drops what the observed pods satisfy: deletions whose uid is gone or terminating, creations
  // whose name is present. Expired entries (ttl) are dropped too.
  void observe(const std::string& job_key, const std::vector<json>& pods);
  // A create that failed: nothing is expected under that name any more.
  void creation_failed(const std::string& job_key, const std::string& pod);
  bool deletion_pending(const std::string& job_key, const std::string& pod) const;
  bool creation_pending(const std::string& job_key, const std::string& pod) const;
  void forget(const std::string& job_key);

 private:
  struct Pending {
    std::string uid;  // deletions only
    std::chrono::steady_clock::time_point since;
  };
  std::chrono::steady_clock::duration ttl_;
  mutable Mutex mu_;
  std::map<std::string, std::map<std::string, Pending>> deletions_ GUARDED_BY(mu_);
  std::map<std::string, std::map<std::string, Pending>> creations_ GUARDED_BY(mu_);
};

}  // namespace longhaul::controller
