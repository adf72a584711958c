// Expectations (see expectations.h).
#include "longhaul/controller/expectations.h"

namespace longhaul::controller {

void Expectations::expect_deletion(const std::string& key, const std::string& pod,
                                   const std::string& uid) {
  MutexLock lock(mu_);
  deletions_[key][pod] = Pending{uid, std::chrono::steady_clock::now()};
}

void Expectations::expect_creation(const std::string& key, const std::string& pod) {
  MutexLock lock(mu_);
  creations_[key][pod] = Pending{"", std::chrono::steady_clock::now()};
}

void Expectations::observe(const std::string& key, const std::vector<json>& pods) {
  std::map<std::string, std::pair<std::string, bool>> seen;  // name -> (uid, terminating)
  for (const json& p : pods) {
    const json& md = p.at("metadata");
    seen[md.value("name", std::string())] = {
        md.value("uid", std::string()),
        md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null()};
  }
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  if (auto it = deletions_.find(key); it != deletions_.end()) {
    std::erase_if(it->second, [&](const auto& entry) {
      auto s = seen.find(entry.first);
      const bool gone = s == seen.end() || s->second.first != entry.second.uid || s->second.second;
      return gone || now - entry.second.since > ttl_;
    });
    if (it->second.empty()) deletions_.erase(it);
  }
  if (auto it = creations_.find(key); it != creations_.end()) {
    std::erase_if(it->second, [&](const auto& entry) {
      return seen.contains(entry.first) || now - entry.second.since > ttl_;
    });
    if (it->second.empty()) creations_.erase(it);
  }
}

void Expectations::creation_failed(const std::string& key, const std::string& pod) {
  MutexLock lock(mu_);
  if (auto it = creations_.find(key); it != creations_.end()) {
    it->second.erase(pod);
    if (it->second.empty()) creations_.erase(it);
  }
}

bool Expectations::deletion_pending(const std::string& key, const std::string& pod) const {
  MutexLock lock(mu_);
  auto it = deletions_.find(key);
  return it != deletions_.end() && it->second.contains(pod);
}

bool Expectations::creation_pending(const std::string& key, const std::string& pod) const {
  MutexLock lock(mu_);
  auto it = creations_.find(key);
  return it != creations_.end() && it->second.contains(pod);
}

void Expectations::forget(const std::string& key) {
  MutexLock lock(mu_);
  deletions_.erase(key);
  creations_.erase(key);
}

}  // namespace longhaul::controller
