// The chief's training progress (see progress.h).
#include "longhaul/controller/progress.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/log.h"

namespace longhaul::controller {

using json = nlohmann::json;
using std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Parsing

namespace {

constexpr std::string_view kGlobalStep = "longhaul_train_global_step";
constexpr std::string_view kMaxSteps = "longhaul_train_max_steps";
constexpr std::string_view kCheckpointStep = "longhaul_checkpoint_last_step";
constexpr std::string_view kCheckpointTime = "longhaul_checkpoint_last_timestamp_seconds";
constexpr std::string_view kIsChief = "longhaul_worker_is_chief";

// One sample line "name{labels} value [timestamp]" -> (name, value); nullopt when malformed.
std::optional<std::pair<std::string_view, double>> parse_sample(std::string_view line) {
  size_t i = 0;
  while (i < line.size() &&
         (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_' || line[i] == ':')) {
    ++i;
  }
  if (i == 0) return std::nullopt;
  const std::string_view name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    bool quoted = false;
    for (++i; i < line.size(); ++i) {
      if (quoted && line[i] == '\\') {
        ++i;  // an escaped character inside a label value
      } else if (line[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && line[i] == '}') {
        break;
      }
    }
    if (i >= line.size()) return std::nullopt;
    ++i;
  }
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  const std::string value(line.substr(i, line.find_first_of(" \t", i) - i));
  if (value.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end != value.c_str() + value.size()) return std::nullopt;
  return std::make_pair(name, v);
}

// A non-negative finite value as an integer; nullopt otherwise.
std::optional<int64_t> count(double v) {
  if (!std::isfinite(v) || v < 0 || v > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(std::llround(v));
}

}  // namespace

std::optional<ProgressSample> parse_progress_metrics(std::string_view text) {
  std::map<std::string_view, double> first;  // the first sample of each wanted metric
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    auto sample = parse_sample(line);
    if (!sample) continue;
    const auto& [name, value] = *sample;
    if (name != kGlobalStep && name != kMaxSteps && name != kCheckpointStep &&
        name != kCheckpointTime && name != kIsChief) {
      continue;
    }
    first.emplace(name, value);
  }
  auto get = [&](std::string_view name) -> std::optional<int64_t> {
    auto it = first.find(name);
    return it == first.end() ? std::nullopt : count(it->second);
  };
  const auto step = get(kGlobalStep);
  if (!step) return std::nullopt;
  ProgressSample s;
  s.step = *step;
  s.max_steps = get(kMaxSteps).value_or(0);
  const int64_t when = get(kCheckpointTime).value_or(0);
  if (when > 0) {
    s.last_checkpoint_unix = when;
    s.last_checkpoint_step = get(kCheckpointStep).value_or(0);
  }
  if (const auto chief = get(kIsChief)) s.is_chief = *chief == 0 ? 0 : 1;
  return s;
}

std::optional<MetricsEndpoint> metrics_endpoint(const json& pod) {
  if (!pod.is_object()) return std::nullopt;
  const json status = pod.value("status", json::object());
  if (!status.is_object() || status.value("phase", "") != "Running") return std::nullopt;
  const std::string ip = status.value("podIP", std::string());
  if (ip.empty()) return std::nullopt;
  const json spec = pod.value("spec", json::object());
  if (!spec.is_object()) return std::nullopt;
  for (const json& c : spec.value("containers", json::array())) {
    if (!c.is_object()) continue;
    for (const json& port : c.value("ports", json::array())) {
      if (!port.is_object() || port.value("name", "") != "metrics") continue;
      const auto number = port.find("containerPort");
      if (number == port.end() || !number->is_number_integer()) continue;
      const int p = number->get<int>();
      if (p > 0 && p < 65536) {
        return MetricsEndpoint{ip, p, pod.value("metadata", json::object()).value("name", "")};
      }
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// One HTTP/1.0 GET with a deadline for the whole exchange

namespace {

// A non-blocking TCP connection whose every step shares one deadline. Errors are Unavailable
// naming `where` ("reading the chief's progress from http://10.0.0.7:9090/metrics: ...").
class DeadlineConnection {
 public:
  DeadlineConnection(std::string where, milliseconds timeout)
      : where_(std::move(where)),
        timeout_(timeout),
        deadline_(std::chrono::steady_clock::now() + timeout) {}
  ~DeadlineConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  DeadlineConnection(const DeadlineConnection&) = delete;
  DeadlineConnection& operator=(const DeadlineConnection&) = delete;

  Unavailable fail(const std::string& what) const {
    return Unavailable("reading the chief's progress from " + where_ + ": " + what);
  }

  // Connects to the numeric `host`:`port`.
  void connect(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
      throw fail(std::string("not an IP address: ") + ::gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
    fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw fail(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd_, found->ai_addr, found->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) throw fail(std::string("connect: ") + std::strerror(errno));
      wait(POLLOUT);
      int error = 0;
      socklen_t len = sizeof error;
      ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) throw fail(std::string("connect: ") + std::strerror(error));
    }
  }

  void send(const std::string& data) {
    for (size_t sent = 0; sent < data.size();) {
      wait(POLLOUT);
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        throw fail(std::string("send: ") + std::strerror(errno));
      }
      if (n > 0) sent += static_cast<size_t>(n);
    }
  }

  // Everything until the peer closes, at most `max_bytes`.
  std::string read_all(size_t max_bytes) {
    std::string reply;
    char buf[16384];
    for (;;) {
      wait(POLLIN);
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return reply;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        throw fail(std::string("recv: ") + std::strerror(errno));
      }
      reply.append(buf, static_cast<size_t>(n));
      if (reply.size() > max_bytes) {
        throw fail("answer larger than " + std::to_string(max_bytes >> 20) + " MiB");
      }
    }
  }

 private:
  // Until `events` are ready on the socket; throws once the deadline passed.
  void wait(short events) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline_ - std::chrono::steady_clock::now());
      if (left <= milliseconds(0)) {
        throw fail("no answer within " + std::to_string(timeout_.count()) + " ms");
      }
      pollfd pfd{fd_, events, 0};
      const int n = ::poll(&pfd, 1, static_cast<int>(left.count()) + 1);
      if (n > 0) return;
      if (n < 0 && errno != EINTR) throw fail(std::string("poll: ") + std::strerror(errno));
    }
  }

  std::string where_;
  milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  int fd_ = -1;
};

}  // namespace

std::string fetch_metrics(const MetricsEndpoint& endpoint, milliseconds timeout) {
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  const std::string host_port =
      (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
  DeadlineConnection connection("http://" + host_port + "/metrics", timeout);
  connection.connect(endpoint.host, endpoint.port);
  connection.send("GET /metrics HTTP/1.0\r\nHost: " + host_port +
                  "\r\nAccept: text/plain\r\nUser-Agent: longhaul-operator\r\n\r\n");
  const std::string reply = connection.read_all(16u << 20);
  // "HTTP/1.x 200 OK\r\n<headers>\r\n\r\n<body>"
  if (reply.size() < 12 || reply.compare(0, 5, "HTTP/") != 0) {
    throw connection.fail("not an HTTP answer");
  }
  const size_t space = reply.find(' ');
  const int status = space == std::string::npos ? 0 : std::atoi(reply.c_str() + space + 1);
  if (status != 200) throw connection.fail("HTTP status " + std::to_string(status));
  const size_t header_end = reply.find("\r\n\r\n");
  if (header_end == std::string::npos) throw connection.fail("the answer has no end of headers");
  return reply.substr(header_end + 4);
}

// ---------------------------------------------------------------------------------------------
// The rate limit

std::optional<milliseconds> apply_progress(api::TrainingJobStatus& status,
                                           const ProgressSample& sample,
                                           std::chrono::seconds interval, api::Time now) {
  api::TrainingProgress next;
  next.step = sample.step;
  next.max_steps = sample.max_steps;
  if (sample.last_checkpoint_unix > 0) {
    next.last_checkpoint_step = sample.last_checkpoint_step;
    next.last_checkpoint_time =
        api::format_time(api::Time(std::chrono::seconds(sample.last_checkpoint_unix)));
  }
  next.steps = std::to_string(sample.step) +
               (sample.max_steps > 0 ? "/" + std::to_string(sample.max_steps) : std::string());
  next.pod = sample.pod;
  if (status.progress) {
    // A chief at step 0 without a checkpoint has not restored yet (a restarted incarnation
    // serves its metrics before its session starts): never a step back to 0 over a recorded one.
    if (sample.step == 0 && sample.last_checkpoint_unix == 0) return std::nullopt;
    next.observed_time = status.progress->observed_time;
    if (next == *status.progress) return std::nullopt;
    // An observedTime further in the future than one interval was written by a clock that was
    // wrong (another operator replica before a leader change): it does not hold changes back.
    if (auto last = api::parse_time_or_null(status.progress->observed_time);
        last && *last <= now + interval) {
      const api::Time allowed = *last + interval + std::chrono::seconds(1);
      if (now < allowed) {
        return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(allowed - now));
      }
    }
  }
  next.observed_time = api::format_time(now);
  status.progress = std::move(next);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// ProgressTracker

ProgressTracker::ProgressTracker(ProgressTrackerOptions options) : options_(std::move(options)) {
  if (!options_.fetch) options_.fetch = fetch_metrics;
  const int n = std::max(1, options_.threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { scrape_loop(); });
}

ProgressTracker::~ProgressTracker() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::optional<milliseconds> ProgressTracker::track(const std::string& key, const json* chief_pod,
                                                   std::chrono::seconds interval,
                                                   api::TrainingJobStatus& status, api::Time now,
                                                   const std::vector<const json*>& other_pods) {
  const std::optional<MetricsEndpoint> tf_config_chief =
      chief_pod ? metrics_endpoint(*chief_pod) : std::nullopt;
  std::vector<MetricsEndpoint> endpoints;
  if (tf_config_chief) endpoints.push_back(*tf_config_chief);
  for (const json* pod : other_pods) {
    if (pod == nullptr) continue;
    if (auto e = metrics_endpoint(*pod);
        e && std::find(endpoints.begin(), endpoints.end(), *e) == endpoints.end()) {
      endpoints.push_back(*e);
    }
  }
  std::optional<ProgressSample> sample;
  std::optional<milliseconds> wait;
  bool queued = false;
  {
    MutexLock lock(mu_);
    if (endpoints.empty()) {
      // No pod to read: keep the newest sample (it may still be written, rate limits
      // permitting) but start nothing.
      if (auto it = entries_.find(key); it != entries_.end()) sample = it->second.sample;
    } else {
      auto [it, created] = entries_.try_emplace(key);
      Entry& e = it->second;
      if (created) e.id = next_id_++;
      if (e.endpoints != endpoints || e.first_is_tf_config_chief != tf_config_chief.has_value()) {
        e.endpoints = endpoints;
        e.first_is_tf_config_chief = tf_config_chief.has_value();
        e.last_attempt.reset();  // a new incarnation of some pod: read at once
      }
      if (!e.in_flight &&
          (!e.last_attempt || now - *e.last_attempt >= interval || now < *e.last_attempt)) {
        e.in_flight = true;
        e.last_attempt = now;
        // The pod that last said it is the chief first, then the rest in rank order.
        std::vector<MetricsEndpoint> order;
        if (e.chief && std::find(endpoints.begin(), endpoints.end(), *e.chief) != endpoints.end()) {
          order.push_back(*e.chief);
        }
        for (const auto& ep : endpoints) {
          if (order.empty() || !(ep == order.front())) order.push_back(ep);
        }
        queue_.push_back(Read{key, e.id, std::move(order), tf_config_chief});
        queued = true;
      }
      wait = std::max(milliseconds(1),
                      std::chrono::duration_cast<milliseconds>(*e.last_attempt + interval - now));
      sample = e.sample;
    }
  }
  if (queued) work_cv_.notify_one();
  if (sample) {
    if (auto limited = apply_progress(status, *sample, interval, now)) {
      wait = wait ? std::min(*wait, *limited) : *limited;
    }
  }
  return wait;
}

void ProgressTracker::forget(const std::string& key) {
  MutexLock lock(mu_);
  entries_.erase(key);
  std::erase_if(queue_, [&](const Read& r) { return r.key == key; });
  idle_cv_.notify_all();
}

bool ProgressTracker::wait_idle(milliseconds timeout) {
  MutexLock lock(mu_);
  return idle_cv_.wait_for(mu_, timeout,
                           [&]() REQUIRES(mu_) { return queue_.empty() && busy_ == 0; });
}

void ProgressTracker::scrape_loop() {
  MutexLock lock(mu_);
  for (;;) {
    work_cv_.wait(mu_, [&]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Read read = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.Unlock();

    // The first endpoint that holds the chief role answers (see progress.h).
    std::optional<ProgressSample> sample;
    std::optional<MetricsEndpoint> answered;
    std::string error;
    // A hand-over tries several pods; the whole read stays within twice the per-pod deadline,
    // so a group of unreachable pods cannot hold a scrape thread for long.
    const auto budget_end = std::chrono::steady_clock::now() + 2 * options_.timeout;
    for (const MetricsEndpoint& endpoint : read.endpoints) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(budget_end - std::chrono::steady_clock::now());
      if (left <= milliseconds(0)) break;
      try {
        auto s = parse_progress_metrics(options_.fetch(endpoint, std::min(left, options_.timeout)));
        if (!s) {
          error = "no longhaul_train_global_step in its /metrics";
        } else if (s->is_chief == 1 || (s->is_chief < 0 && endpoint == read.tf_config_chief)) {
          s->pod = endpoint.pod;
          sample = s;
          answered = endpoint;
          break;
        } else {
          error = "no pod of the group says longhaul_worker_is_chief 1";
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }

    lock.Lock();
    --busy_;
    bool changed = false;
    auto it = entries_.find(read.key);
    if (it != entries_.end() && it->second.id == read.id) {
      Entry& e = it->second;
      e.in_flight = false;
      if (sample) {
        changed = e.sample != sample;
        e.sample = sample;
        e.failing = false;
        if (e.chief != answered) {
          LH_LOG(INFO) << "reading the training progress from the pod that holds the chief role"
                       << kv("job", read.key) << kv("pod", answered->pod)
                       << kv("endpoint", answered->host + ":" + std::to_string(answered->port));
        }
        e.chief = answered;
      } else if (!e.failing) {
        e.failing = true;
        LH_LOG(INFO) << "could not read the chief's training progress; status.progress keeps "
                        "its last value"
                     << kv("job", read.key) << kv("error", error);
      }
    }
    idle_cv_.notify_all();
    if (changed && options_.on_update) {
      lock.Unlock();
      options_.on_update(read.key);
      lock.Lock();
    }
  }
}

}  // namespace longhaul::controller
