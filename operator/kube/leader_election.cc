// Lease-based leader election (see leader_election.h).
#include "longhaul/kube/leader_election.h"

#include <cstdio>
#include <random>

#include <unistd.h>

#include "longhaul/base/log.h"
#include "longhaul/base/rfc3339.h"

namespace longhaul::kube {

namespace {

int64_t whole_seconds(std::chrono::milliseconds d) {
  return std::max<int64_t>(1, (d.count() + 999) / 1000);
}

}  // namespace

std::string format_micro_time(std::chrono::system_clock::time_point t) {
  return format_rfc3339_micro(t);
}
std::string format_time(std::chrono::system_clock::time_point t) { return format_rfc3339(t); }

std::string default_identity() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  std::random_device rd;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", rd(), rd());
  return std::string(host) + "_" + suffix;
}

LeaderElector::LeaderElector(std::shared_ptr<Client> client, LeaderElectionConfig config)
    : client_(std::move(client)), config_(std::move(config)) {
  if (config_.identity.empty()) config_.identity = default_identity();
  if (config_.lease_name.empty() || config_.lease_namespace.empty()) {
    throw InvalidArgument("leader election: the lease name and namespace must be set");
  }
  if (!(config_.retry_period.count() > 0 && config_.renew_deadline > config_.retry_period &&
        config_.lease_duration > config_.renew_deadline)) {
    throw InvalidArgument(
        "leader election: need lease_duration > renew_deadline > retry_period > 0 (got " +
        std::to_string(config_.lease_duration.count()) + " ms, " +
        std::to_string(config_.renew_deadline.count()) + " ms, " +
        std::to_string(config_.retry_period.count()) + " ms)");
  }
}

LeaderElector::~LeaderElector() { stop(); }

void LeaderElector::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void LeaderElector::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string LeaderElector::leader() const {
  MutexLock lock(mu_);
  return observed_spec_.is_object() ? observed_spec_.value("holderIdentity", "") : "";
}

bool LeaderElector::wait(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  cv_.wait_for(mu_, d, [this]() REQUIRES(mu_) { return stopping_; });
  return !stopping_;
}

json LeaderElector::lease_spec(const std::string& holder, const std::string& acquire_time,
                               int64_t transitions, int64_t duration_seconds) const {
  return {{"holderIdentity", holder},
          {"leaseDurationSeconds", duration_seconds},
          {"acquireTime", acquire_time},
          {"renewTime", format_micro_time(std::chrono::system_clock::now())},
          {"leaseTransitions", transitions}};
}

void LeaderElector::observe(const json& spec) {
  std::string old_holder;
  std::string new_holder = spec.value("holderIdentity", "");
  {
    MutexLock lock(mu_);
    if (spec == observed_spec_) return;
    old_holder = observed_spec_.is_object() ? observed_spec_.value("holderIdentity", "") : "";
    observed_spec_ = spec;
    observed_time_ = std::chrono::steady_clock::now();  // our clock, not the remote renewTime
  }
  if (new_holder != old_holder && config_.on_new_leader) {
    try {
      config_.on_new_leader(new_holder);
    } catch (const std::exception& e) {
      LH_LOG(ERROR) << "on_new_leader threw" << kv("error", e.what());
    }
  }
}

bool LeaderElector::try_acquire_or_renew() {
  const Resource& leases = resources::kLeases;
  const int64_t duration = whole_seconds(config_.lease_duration);
  const std::string now = format_micro_time(std::chrono::system_clock::now());
  json lease;
  try {
    lease = client_->get(leases, config_.lease_namespace, config_.lease_name);
  } catch (const NotFoundError&) {
    json fresh = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
        {"spec", lease_spec(config_.identity, now, 0, duration)}};
    try {
      json created = client_->create(leases, config_.lease_namespace, fresh);
      observe(created.value("spec", fresh["spec"]));
      return true;
    } catch (const std::exception& e) {
      LH_LOG(DEBUG) << "lease create lost" << kv("identity", config_.identity)
                    << kv("error", e.what());
      return false;
    }
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "cannot read the leader-election lease" << kv("lease", config_.lease_name)
                    << kv("error", e.what());
    return false;
  }

  json spec = lease.value("spec", json::object());
  observe(spec);
  const std::string holder = spec.value("holderIdentity", "");
  const bool mine = holder == config_.identity;
  if (!holder.empty() && !mine) {
    const auto held_for = std::chrono::seconds(spec.value("leaseDurationSeconds", int64_t{0}));
    MutexLock lock(mu_);
    if (observed_time_ + held_for > std::chrono::steady_clock::now()) return false;  // valid
  }
  const int64_t transitions = spec.value("leaseTransitions", int64_t{0});
  lease["spec"] = lease_spec(config_.identity, mine ? spec.value("acquireTime", now) : now,
                             mine ? transitions : transitions + 1, duration);
  try {
    // metadata.resourceVersion from the GET makes this a compare-and-swap.
    json updated = client_->update(leases, config_.lease_namespace, lease);
    observe(updated.value("spec", lease["spec"]));
    return true;
  } catch (const std::exception& e) {
    LH_LOG(DEBUG) << "lease update failed" << kv("identity", config_.identity)
                  << kv("error", e.what());
    return false;
  }
}

void LeaderElector::release() {
  try {
    json lease = client_->get(resources::kLeases, config_.lease_namespace, config_.lease_name);
    json spec = lease.value("spec", json::object());
    if (spec.value("holderIdentity", "") != config_.identity) return;
    const std::string now = format_micro_time(std::chrono::system_clock::now());
    lease["spec"] = lease_spec("", now, spec.value("leaseTransitions", int64_t{0}), 1);
    client_->update(resources::kLeases, config_.lease_namespace, lease);
    LH_LOG(INFO) << "released leadership" << kv("lease", config_.lease_name)
                 << kv("identity", config_.identity);
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "could not release the lease; a successor waits for it to expire"
                    << kv("lease", config_.lease_name) << kv("error", e.what());
  }
}

void LeaderElector::run() {
  std::mt19937_64 rng(std::random_device{}());
  auto jittered = [&](std::chrono::milliseconds d) {
    return std::chrono::milliseconds(static_cast<int64_t>(
        static_cast<double>(d.count()) * std::uniform_real_distribution<double>(1.0, 1.2)(rng)));
  };
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    if (!try_acquire_or_renew()) {
      if (!wait(jittered(config_.retry_period))) return;
      continue;
    }
    leading_ = true;
    LH_LOG(INFO) << "became leader" << kv("lease", config_.lease_name)
                 << kv("identity", config_.identity);
    if (config_.on_started_leading) {
      try {
        config_.on_started_leading();
      } catch (const std::exception& e) {
        LH_LOG(ERROR) << "on_started_leading threw" << kv("error", e.what());
      }
    }
    auto last_renew = std::chrono::steady_clock::now();
    bool stopping = false;
    for (;;) {
      if (!wait(config_.retry_period)) {
        stopping = true;
        break;
      }
      if (try_acquire_or_renew()) {
        last_renew = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_renew > config_.renew_deadline) {
        LH_LOG(WARNING) << "lost leadership: no renewal within the renew deadline"
                        << kv("lease", config_.lease_name) << kv("identity", config_.identity);
        break;
      }
    }
    if (stopping && config_.release_on_stop) release();
    leading_ = false;
    if (config_.on_stopped_leading) {
      try {
        config_.on_stopped_leading();
      } catch (const std::exception& e) {
        LH_LOG(ERROR) << "on_stopped_leading threw" << kv("error", e.what());
      }
    }
    if (stopping) return;
  }
}

}  // namespace longhaul::kube
