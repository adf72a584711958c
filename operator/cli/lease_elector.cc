// Lease-based leader election (see lease_elector.h).
#include "lease_elector.h"

#include <cstdio>
#include <ctime>

#include "longhaul/base/log.h"

namespace longhaul::operator_cli {
namespace {

// metav1.MicroTime: RFC 3339 with microseconds.
std::string micro_time_now() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::time_point_cast<std::chrono::seconds>(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now - secs).count();
  const std::time_t t = std::chrono::system_clock::to_time_t(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));
  return buf;
}

}  // namespace

LeaseElector::LeaseElector(std::shared_ptr<kube::Client> client, LeaseElectorOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

LeaseElector::~LeaseElector() { stop(false); }

void LeaseElector::start() {
  thread_ = std::thread([this] { run(); });
}

void LeaseElector::stop(bool release) {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (leading_.exchange(false)) {
    if (options_.on_stopped_leading) options_.on_stopped_leading();
    if (release) release_lease();
  }
}

void LeaseElector::run() {
  auto last_renew = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    bool ok = false;
    try {
      ok = try_acquire_or_renew();
    } catch (const std::exception& e) {
      LH_LOG(WARNING) << "leader election: lease request failed" << kv("error", e.what());
    }
    const auto now = std::chrono::steady_clock::now();
    if (ok) {
      last_renew = now;
      if (!leading_.exchange(true)) {
        LH_LOG(INFO) << "leader election: became the leader" << kv("identity", options_.identity)
                     << kv("lease", options_.lease_namespace + "/" + options_.lease_name);
        if (options_.on_started_leading) options_.on_started_leading();
      }
    } else if (leading_ && now - last_renew > options_.renew_deadline) {
      leading_ = false;
      LH_LOG(WARNING) << "leader election: could not renew the lease in time, stepping down"
                      << kv("identity", options_.identity);
      if (options_.on_stopped_leading) options_.on_stopped_leading();
    }
    lock.lock();
    cv_.wait_for(lock, options_.retry_period, [this] { return stopping_; });
  }
}

bool LeaseElector::try_acquire_or_renew() {
  const auto& r = kube::resources::kLeases;
  const std::string now = micro_time_now();
  const int duration_s = static_cast<int>(std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(options_.lease_duration).count()));
  kube::json lease;
  try {
    lease = client_->get(r, options_.lease_namespace, options_.lease_name);
  } catch (const kube::NotFoundError&) {
    try {
      client_->create(
          r, options_.lease_namespace,
          {{"apiVersion", "coordination.k8s.io/v1"},
           {"kind", "Lease"},
           {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
           {"spec",
            {{"holderIdentity", options_.identity},
             {"leaseDurationSeconds", duration_s},
             {"acquireTime", now},
             {"renewTime", now},
             {"leaseTransitions", 0}}}});
      return true;
    } catch (const kube::AlreadyExistsError&) {
      return false;
    }
  }
  kube::json spec = lease.value("spec", kube::json::object());
  const std::string holder = spec.value("holderIdentity", std::string());
  if (!holder.empty() && holder != options_.identity) {
    const std::string record = holder + "|" + spec.value("renewTime", std::string());
    const auto steady_now = std::chrono::steady_clock::now();
    if (record != observed_record_) {
      observed_record_ = record;
      observed_at_ = steady_now;
    }
    const auto their_duration = std::chrono::seconds(spec.value("leaseDurationSeconds", 15));
    if (steady_now < observed_at_ + their_duration) return false;
    LH_LOG(INFO) << "leader election: lease expired, taking over" << kv("previous", holder);
  }
  if (holder != options_.identity) {
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + (holder.empty() ? 0 : 1);
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration_s;
  spec["renewTime"] = now;
  lease["spec"] = spec;
  try {
    client_->update(r, options_.lease_namespace, lease);
    return true;
  } catch (const kube::ConflictError&) {
    return false;
  }
}

void LeaseElector::release_lease() {
  try {
    kube::json lease =
        client_->get(kube::resources::kLeases, options_.lease_namespace, options_.lease_name);
    kube::json& spec = lease["spec"];
    if (spec.value("holderIdentity", std::string()) != options_.identity) return;
    spec["holderIdentity"] = "";
    spec["leaseDurationSeconds"] = 1;
    spec["renewTime"] = micro_time_now();
    client_->update(kube::resources::kLeases, options_.lease_namespace, lease);
    LH_LOG(INFO) << "leader election: released the lease" << kv("identity", options_.identity);
  } catch (const std::exception& e) {
    LH_LOG(WARNING) << "leader election: could not release the lease" << kv("error", e.what());
  }
}

}  // namespace longhaul::operator_cli
