// Rendezvous through the shared logdir and the Gloo communicator. See communicator.h.
#include "longhaul/distributed/communicator.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"
#include "longhaul/base/mutex.h"
#include "longhaul/base/poll.h"

namespace longhaul::dist {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kGenerationFile = "generation";

std::string random_id() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(::getpid()) ^
                      static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
  std::ostringstream s;
  s << std::hex << gen();
  return s.str();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::optional<std::string> read_if_exists(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    return file::read_file(path);
  } catch (const NotFound&) {
    return std::nullopt;  // removed between the check and the read
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::chrono::milliseconds to_ms(double secs) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(secs, 0.001) * 1000.0));
}

// Sleeps until `until`, looking at `cancelled` every 50 ms; throws Cancelled(what) when it says
// stop.
void sleep_checking(Clock::time_point until, const std::function<bool()>& cancelled,
                    const std::string& what) {
  while (true) {
    if (cancelled && cancelled()) throw Cancelled(what);
    const auto now = Clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(until - now, std::chrono::milliseconds(50)));
  }
}

// The whole text of a small file, or "" when it cannot be read (absent, being replaced).
std::string read_small_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The names in `dir` (one listing; empty when it does not exist).
std::set<std::string> list_names(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.insert(it->path().filename().string());
  }
  return names;
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

// The numeric address of `host` that this machine can bind, so that Gloo (which crashes on a
// name it cannot resolve) only ever sees a usable address. Throws Unavailable when the name
// does not resolve (yet), InvalidArgument when it is not an address of this machine; both name
// the host and the overrides.
std::string bindable_address(const std::string& host, int rank) {
  const std::string hint =
      ". When the TF_CONFIG host names do not resolve to this machine (e.g. pods run as local "
      "processes), set LONGHAUL_HOST_OVERRIDE=127.0.0.1, LONGHAUL_TASK_ADDRESSES or "
      "LONGHAUL_GLOO_IFACE";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw Unavailable("rank " + std::to_string(rank) + " cannot resolve its address '" + host +
                      "': " + ::gai_strerror(rc) + hint);
  }
  std::string error;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    if (a->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    if (a->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) == 0;
    if (!ok) error = std::strerror(errno);
    ::close(fd);
    if (!ok) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr);
    ::inet_ntop(a->ai_family, raw, text, sizeof text);
    ::freeaddrinfo(found);
    return text;
  }
  ::freeaddrinfo(found);
  throw InvalidArgument("rank " + std::to_string(rank) + " cannot bind to its address '" + host +
                        "' (" + error + "): it is not an address of this machine" + hint);
}

// Gloo's tcp::Pair waits this many times its timeout for a pending connection.
constexpr double kGlooConnectWaitFactor = 5;

// The FileStore the mesh connects through, its waits bounded by the connect timeout (Gloo's own
// FileStore::get waits its 30 s default whatever the context's timeout says) and ended by a
// stop request (Cancelled).
class ConnectStore : public gloo::rendezvous::FileStore {
 public:
  ConnectStore(const fs::path& dir, std::chrono::milliseconds timeout,
               std::function<bool()> cancelled)
      : FileStore(dir.string()), timeout_(timeout), cancelled_(std::move(cancelled)) {}

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return FileStore::get(key);
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  // Gloo passes the context's timeout, which during the connect is a fifth of ours (see
  // rendezvous()): the store keeps its own.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& /*gloo_timeout*/) override {
    const auto deadline = Clock::now() + timeout_;
    while (!check(keys)) {
      if (cancelled_ && cancelled_()) {
        throw Cancelled("connecting the group abandoned: a stop was requested");
      }
      if (Clock::now() >= deadline) {
        std::string names;
        for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
        throw Unavailable("a peer did not publish its address (" + names + ") within " +
                          std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  std::chrono::milliseconds timeout_;
  std::function<bool()> cancelled_;
};

// True for 127.0.0.0/8 and ::1 (Debian maps a machine's hostname to 127.0.1.1).
bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1";
}

// The address this replica binds for its TF_CONFIG `host`. When `host` is this pod's own DNS name
// (its first label is this machine's hostname, as Kubernetes sets hostname + subdomain), the
// hostname's address first: the pod's /etc/hosts maps it to the pod IP, the address the DNS name
// stands for, with no DNS query. On a cluster without DNS for pods a query for the name took
// 10 s to fail (two resolver timeouts) before every start and every restart. A loopback
// hostname address (a VM's 127.0.1.1) is used only when the name does not resolve: peers on
// other machines could not reach it. Otherwise bindable_address(host). Peers learn the address
// through the rendezvous store, never by name. Throws what bindable_address(host) threw when
// neither works.
std::string own_address(const std::string& host, int rank) {
  const std::string me = host_name();
  const auto dot = host.find('.');
  std::optional<std::string> by_hostname;
  if (dot != std::string::npos && host.compare(0, dot, me) == 0) {
    try {
      by_hostname = bindable_address(me, rank);
    } catch (const Error&) {
    }
    if (by_hostname && !is_loopback(*by_hostname)) return *by_hostname;
  }
  try {
    return bindable_address(host, rank);
  } catch (const Unavailable&) {
    if (!by_hostname) throw;  // the original error, naming `host`
    LH_LOG(INFO) << "this replica's DNS name does not resolve; binding its hostname's address"
                 << kv("host", host) << kv("hostname", me) << kv("address", *by_hostname);
    return *by_hostname;
  }
}

// A communicator of one: every collective is the identity.
class SoloCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void allreduce_sum(std::span<float>) override {}
  void allreduce_max(std::span<int64_t>) override {}
  void broadcast(std::span<std::byte>, int, std::chrono::milliseconds) override {}
  void barrier() override {}
};

// The heartbeat period of a member (communicator.h, "Liveness").
constexpr std::chrono::milliseconds kHeartbeatInterval{200};

class GlooCommunicator : public Communicator {
 public:
  // `context` is connected; `dir` and `generation` name the heartbeat files; `me` is this
  // process's arrival identity.
  GlooCommunicator(std::shared_ptr<gloo::Context> context, const RendezvousOptions& o, fs::path dir,
                   std::string generation, std::string me)
      : context_(std::move(context)),
        algorithm_(o.algorithm),
        where_("rendezvous " + dir.string()),
        dir_(std::move(dir)),
        generation_(std::move(generation)),
        me_(std::move(me)),
        liveness_timeout_(to_ms(o.liveness_timeout_secs)),
        cancelled_(o.cancelled) {
    // The local end of each connected pair: how break_group finds this group's sockets.
    for (int r = 0; r < context_->size; ++r) {
      if (r == context_->rank) continue;
      const auto* address =
          dynamic_cast<const gloo::transport::tcp::Address*>(&context_->getPair(r)->address());
      if (address != nullptr) local_ends_.push_back(address->getSockaddr());
    }
    write_heartbeat();
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }

  ~GlooCommunicator() override {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    heartbeat_.join();
    std::error_code ec;
    fs::remove(heartbeat_path(rank()), ec);
  }

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  void allreduce_sum(std::span<float> data) override {
    if (data.empty()) return;
    guarded("all-reduce of " + std::to_string(data.size()) + " floats", [&] {
      if (algorithm_ == AllreduceAlgorithm::kHalvingDoubling) {
        auto& algo = halving_doubling_[{data.data(), data.size()}];
        if (!algo) {
          algo = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
              context_, std::vector<float*>{data.data()}, static_cast<int>(data.size()));
        }
        algo->run();
        return;
      }
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setAlgorithm(algorithm_ == AllreduceAlgorithm::kBcube
                            ? gloo::AllreduceOptions::Algorithm::BCUBE
                            : gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }

  void allreduce_max(std::span<int64_t> data) override {
    if (data.empty()) return;
    guarded("all-reduce (max) of " + std::to_string(data.size()) + " integers", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<int64_t>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }

  void broadcast(std::span<std::byte> data, int root, std::chrono::milliseconds timeout) override {
    if (data.empty()) return;
    // A call with its own timeout waits for a slow peer on purpose: a stop request ends it.
    const WaitScope wait(*this, timeout.count() > 0);
    guarded(
        "broadcast of " + std::to_string(data.size()) + " bytes from rank " + std::to_string(root),
        [&] {
          gloo::BroadcastOptions opts(context_);
          opts.setOutput(reinterpret_cast<uint8_t*>(data.data()), data.size());
          opts.setRoot(root);
          opts.setTag(next_tag());
          if (timeout.count() > 0) opts.setTimeout(timeout);
          gloo::broadcast(opts);
        });
  }

  void barrier() override {
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  // Marks a call that a stop request may end (see broadcast).
  class WaitScope {
   public:
    WaitScope(GlooCommunicator& c, bool on) : c_(c), on_(on) {
      if (!on_) return;
      MutexLock lock(c_.mu_);
      c_.waiting_ = true;
    }
    ~WaitScope() {
      if (!on_) return;
      MutexLock lock(c_.mu_);
      c_.waiting_ = false;
    }
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    GlooCommunicator& c_;
    bool on_;
  };

  uint32_t next_tag() { return tag_++ & 0xffffff; }

  fs::path heartbeat_path(int rank) const {
    return dir_ / ("alive." + generation_ + "." + std::to_string(rank));
  }

  // Overwritten in place (no fsync, no rename): a reader that sees a partial file sees a change,
  // which is what a heartbeat is.
  void write_heartbeat() {
    std::ofstream out(heartbeat_path(rank()), std::ios::binary | std::ios::trunc);
    out << me_ << " " << ++beats_ << "\n";
  }

  // Every kHeartbeatInterval: refresh this member's file, look at the others' (a member whose
  // file did not change for the liveness timeout is lost), and end a wait a stop request asked
  // to end.
  void heartbeat_loop() EXCLUDES(mu_) {
    const int w = world_size();
    std::vector<std::string> seen(static_cast<size_t>(w));
    std::vector<Clock::time_point> changed(static_cast<size_t>(w), Clock::now());
    MutexLock lock(mu_);
    while (!stop_) {
      const bool waiting = waiting_;
      lock.Unlock();
      write_heartbeat();
      const auto now = Clock::now();
      int frozen = -1;
      for (int r = 0; r < w; ++r) {
        if (r == rank()) continue;
        std::string text = read_small_file(heartbeat_path(r));
        if (text != seen[static_cast<size_t>(r)]) {
          seen[static_cast<size_t>(r)] = std::move(text);
          changed[static_cast<size_t>(r)] = now;
        } else if (frozen < 0 && now - changed[static_cast<size_t>(r)] > liveness_timeout_) {
          frozen = r;
        }
      }
      const bool stop_requested = waiting && cancelled_ && cancelled_();
      lock.Lock();
      if (frozen >= 0 && lost_.empty() && !stopped_) {
        lost_ = "rank " + std::to_string(frozen) + " did not refresh its heartbeat " +
                heartbeat_path(frozen).string() + " for " +
                std::to_string(liveness_timeout_.count() / 1000.0) +
                " s (liveness_timeout_secs): it is frozen (SIGSTOP), its host stalled or lost the "
                "shared logdir";
        LH_LOG(WARNING) << "a peer stopped refreshing its heartbeat: declaring it lost"
                        << kv("rank", rank()) << kv("lost_rank", frozen)
                        << kv("generation", generation_);
        shut_down_sockets();
      }
      if (stop_requested && waiting_ && lost_.empty() && !stopped_) {
        stopped_ = true;
        LH_LOG(INFO) << "a stop was requested while waiting for a peer: leaving the group"
                     << kv("rank", rank()) << kv("generation", generation_);
        shut_down_sockets();
      }
      cv_.wait_for(mu_, kHeartbeatInterval, [this]() REQUIRES(mu_) { return stop_; });
    }
  }

  // Makes every call on this group fail now: shutdown(2) of each socket whose local end is one
  // of this group's pairs, so Gloo's event loop sees the connection end — as when a peer dies —
  // and fails every pending operation. The descriptors stay Gloo's to close.
  void shut_down_sockets() REQUIRES(mu_) {
    std::error_code ec;
    for (fs::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      char* parsed = nullptr;
      const long fd = std::strtol(name.c_str(), &parsed, 10);
      if (parsed == name.c_str() || *parsed != '\0') continue;
      struct stat st {};
      if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      sockaddr_storage local{};
      socklen_t length = sizeof local;
      if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
        continue;
      }
      for (const auto& mine : local_ends_) {
        if (same_endpoint(local, mine)) {
          ::shutdown(static_cast<int>(fd), SHUT_RDWR);
          break;
        }
      }
    }
  }

  template <typename Fn>
  void guarded(const std::string& what, Fn&& fn) {
    if (broken_) {
      throw Aborted(what + " on rank " + std::to_string(rank()) + ": the group already failed (" +
                    broken_reason_ + "); exit with code 138 so the whole group restarts");
    }
    try {
      fn();
    } catch (const std::exception& e) {
      broken_ = true;
      std::string lost;
      bool stopped = false;
      {
        MutexLock lock(mu_);
        lost = lost_;
        stopped = stopped_;
      }
      if (stopped) {
        broken_reason_ = "a stop was requested while waiting";
        throw Cancelled(what + " on rank " + std::to_string(rank()) + " (" + where_ +
                        ") abandoned: a stop was requested while waiting for a peer");
      }
      broken_reason_ = lost.empty() ? e.what() : lost;
      throw Aborted(what + " failed on rank " + std::to_string(rank()) + " of " +
                    std::to_string(world_size()) + " (" + where_ +
                    "): " + (lost.empty() ? std::string(e.what()) : lost + " (" + e.what() + ")") +
                    ". A peer died, froze, hung longer than the collective timeout (" +
                    std::to_string(context_->getTimeout().count()) +
                    " ms) or the network was cut; exit with code 138 so the whole group "
                    "restarts from the latest checkpoint");
    }
  }

  std::shared_ptr<gloo::Context> context_;
  AllreduceAlgorithm algorithm_;
  std::string where_;
  fs::path dir_;
  std::string generation_;
  std::string me_;
  std::chrono::milliseconds liveness_timeout_;
  std::function<bool()> cancelled_;
  std::vector<sockaddr_storage> local_ends_;  // set before the heartbeat thread starts
  uint32_t tag_ = 1;
  bool broken_ = false;
  std::string broken_reason_;
  std::map<std::pair<float*, size_t>, std::unique_ptr<gloo::AllreduceHalvingDoubling<float>>>
      halving_doubling_;
  uint64_t beats_ = 0;  // heartbeat thread only (and the constructor, before it starts)

  // Shared with the heartbeat thread.
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;     // the heartbeat thread ends
  bool waiting_ GUARDED_BY(mu_) = false;  // a call a stop request may end is in flight
  std::string lost_ GUARDED_BY(mu_);      // why the group was broken (a frozen member)
  bool stopped_ GUARDED_BY(mu_) = false;  // the group was broken for a stop request
  std::thread heartbeat_;
};

// Waits (polling, base/poll.h) until every rank has arrived in one generation of `dir`.
class ArrivalBoard {
 public:
  ArrivalBoard(const RendezvousOptions& o, fs::path dir, Clock::time_point start)
      : o_(o),
        dir_(std::move(dir)),
        me_(host_name() + ":" + std::to_string(::getpid()) + ":" + random_id()),
        deadline_(start + to_ms(o.max_wait_secs)) {}

  // This process's identity in arrival files and member lists.
  const std::string& identity() const { return me_; }
  Clock::time_point deadline() const { return deadline_; }

  // Returns the generation every rank arrived in (and, for a non-chief, the chief confirmed).
  std::string wait_for_all() {
    const auto start = Clock::now();
    if (o_.rank == 0) open_as_chief(/*keep_files=*/o_.regroup || reopening_);
    reopening_ = false;
    auto last_log = start;
    while (true) {
      check_cancelled();
      if (o_.rank != 0) follow_generation();
      if (!generation_.empty()) stop_here_for_test("rendezvous");
      std::vector<int> missing = missing_ranks();
      if (missing.empty()) {
        // The chief closes its generation by naming who arrived; a non-chief leaves only when
        // that list names this very process (see communicator.h, step 3).
        if (o_.rank == 0) {
          write_members();
          return generation_;
        }
        if (confirmed()) return generation_;
      }
      const auto now = Clock::now();
      if (now >= deadline_) {
        std::string who;
        for (int r : missing) {
          who += (who.empty() ? "" : ", ") + std::to_string(r) +
                 (r == 0 && generation_.empty() ? " (the chief never opened the rendezvous)" : "");
        }
        if (missing.empty()) who = "0 (the chief never confirmed generation " + generation_ + ")";
        throw DeadlineExceeded(
            "rank " + std::to_string(o_.rank) + " waited " + std::to_string(o_.max_wait_secs) +
            " s (max_wait_secs) at rendezvous " + dir_.string() + " but rank(s) " + who +
            " never arrived (world size " + std::to_string(o_.world_size) +
            "); check that those replicas are running, share this logdir and use the same "
            "LONGHAUL_RESTART_ATTEMPT");
      }
      if (now - last_log >= std::chrono::seconds(30)) {
        LH_LOG(INFO) << "waiting for peers at the rendezvous" << kv("dir", dir_.string())
                     << kv("missing_ranks", rank_list(missing));
        last_log = now;
      }
      sleep_until(std::min(deadline_, now + poll_interval(now - start)));
    }
  }

  // The mesh of `generation_` could not be connected (a member died or froze after arriving):
  // the chief opens a new generation in the folder as it is; a non-chief treats this one as
  // stale and follows the chief's next one.
  void retry_after_failed_connect() {
    if (o_.rank == 0) {
      reopening_ = true;
    } else {
      stale_ = generation_;
      generation_.clear();
    }
  }

 private:
  void check_cancelled() {
    if (o_.cancelled && o_.cancelled()) {
      throw Cancelled("rendezvous at " + dir_.string() + " abandoned: a stop was requested");
    }
  }

  void sleep_until(Clock::time_point t) {
    while (Clock::now() < t) {
      check_cancelled();
      std::this_thread::sleep_for(
          std::min<Clock::duration>(t - Clock::now(), std::chrono::milliseconds(50)));
    }
  }

  void open_as_chief(bool keep_files) {
    if (keep_files) {  // a surviving chief, or a retry: a new generation in the folder as it is
      file::ensure_writable_directory(dir_, "rendezvous folder");
      generation_ = random_id();
      file::write_atomically(dir_ / kGenerationFile, generation_);
      write_arrival();
      return;
    }
    std::error_code ec;
    // Stale attempt folders and anything left in ours by an earlier run with the same attempt.
    if (fs::exists(dir_.parent_path(), ec)) {
      for (const auto& entry : fs::directory_iterator(dir_.parent_path(), ec)) {
        if (entry.path().filename() != dir_.filename()) {
          std::error_code rm;
          fs::remove_all(entry.path(), rm);
          if (!rm) {
            LH_LOG(INFO) << "removed a stale rendezvous folder" << kv("dir", entry.path().string());
          }
        }
      }
    }
    if (fs::exists(dir_, ec)) {
      for (const auto& entry : fs::directory_iterator(dir_, ec)) {
        std::error_code rm;
        fs::remove_all(entry.path(), rm);
      }
    }
    file::ensure_writable_directory(dir_, "rendezvous folder");
    generation_ = random_id();
    file::write_atomically(dir_ / kGenerationFile, generation_);
    write_arrival();
  }

  fs::path arrival_path(int rank) const {
    return dir_ / ("arrived." + generation_ + "." + std::to_string(rank));
  }

  void write_arrival() { file::write_atomically(arrival_path(o_.rank), me_); }

  fs::path members_path() const { return dir_ / ("members." + generation_); }

  // Chief: `members.G` lists, one line per rank, the identity each arrival file holds.
  void write_members() {
    std::string text;
    for (int r = 0; r < o_.world_size; ++r) {
      text += std::to_string(r) + " " + read_if_exists(arrival_path(r)).value_or("") + "\n";
    }
    file::write_atomically(members_path(), text);
  }

  // Non-chief: true once the chief's member list names this process as this rank. A list that
  // names another process closes the generation without us: it is stale (a previous run's, or
  // one whose files we saw while its chief was clearing them), and we wait for the next one.
  bool confirmed() {
    auto members = read_if_exists(members_path());
    if (!members) return false;
    const std::string mine = std::to_string(o_.rank) + " " + me_ + "\n";
    if (members->find(mine) == 0 || members->find("\n" + mine) != std::string::npos) return true;
    LH_LOG(INFO) << "rendezvous generation was closed without this replica; waiting for the "
                    "chief to open a new one"
                 << kv("dir", dir_.string()) << kv("generation", generation_);
    stale_ = generation_;
    generation_.clear();
    return false;
  }

  // A non-chief's write may race with the chief's clean-up of the folder (its temp file
  // vanishes before the rename): it is simply retried at the next poll.
  static bool try_write(const fs::path& path, const std::string& text) {
    try {
      file::write_atomically(path, text);
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  void follow_generation() {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (!fs::exists(present_path(o_.rank), ec)) try_write(present_path(o_.rank), me_);
    auto current = read_if_exists(dir_ / kGenerationFile);
    if (!current || current->empty()) {
      generation_.clear();
      return;
    }
    if (*current == stale_) {
      generation_.clear();
      return;
    }
    generation_ = *current;
    auto mine = read_if_exists(arrival_path(o_.rank));
    if (!mine) {
      try_write(arrival_path(o_.rank), me_);
    } else if (*mine != me_) {
      // Another process arrived as this rank in this generation: a previous run left it.
      LH_LOG(INFO) << "rendezvous generation is stale; waiting for the chief to open a new one"
                   << kv("dir", dir_.string()) << kv("generation", generation_);
      stale_ = generation_;
      generation_.clear();
    }
  }

  // Before the chief opened a generation, ranks announce themselves with `present.<rank>`
  // files, so that a timeout can still name every rank that is not there.
  // One listing of the folder per look, whatever the world size (bounded cost on a shared
  // filesystem).
  std::vector<int> missing_ranks() const {
    const std::set<std::string> names = list_names(dir_);
    std::vector<int> missing;
    for (int r = 0; r < o_.world_size; ++r) {
      const bool there =
          generation_.empty()
              ? r == o_.rank || (r != 0 && names.count(present_path(r).filename().string()) > 0)
              : names.count(arrival_path(r).filename().string()) > 0;
      if (!there) missing.push_back(r);
    }
    return missing;
  }

  fs::path present_path(int rank) const { return dir_ / ("present." + std::to_string(rank)); }

  const RendezvousOptions& o_;
  fs::path dir_;
  std::string me_;
  Clock::time_point deadline_;
  std::string generation_;
  std::string stale_;
  bool reopening_ = false;  // the chief's next generation keeps the folder's files
};

}  // namespace

AllreduceAlgorithm parse_allreduce_algorithm(std::string_view name) {
  if (name == "ring") return AllreduceAlgorithm::kRing;
  if (name == "halving-doubling") return AllreduceAlgorithm::kHalvingDoubling;
  if (name == "bcube") return AllreduceAlgorithm::kBcube;
  throw InvalidArgument("all-reduce algorithm '" + std::string(name) +
                        "' is not one of ring, halving-doubling, bcube");
}

fs::path rendezvous_dir(const fs::path& logdir, const std::string& attempt) {
  return logdir / ".rendezvous" / attempt;
}

void remove_rendezvous_dir(const fs::path& logdir, const std::string& attempt) {
  std::error_code ec;
  fs::remove_all(rendezvous_dir(logdir, attempt), ec);
  // ENOENT: another replica removed it (or part of it) at the same time, which is the goal.
  if (ec && ec != std::errc::no_such_file_or_directory) {
    LH_LOG(WARNING) << "could not remove the rendezvous folder"
                    << kv("dir", rendezvous_dir(logdir, attempt).string())
                    << kv("error", ec.message());
  }
}

void stop_here_for_test(std::string_view phase) {
  static std::atomic<bool> stopped{false};
  const char* wanted = std::getenv("LONGHAUL_TEST_STOP_AT");
  if (wanted == nullptr || phase != wanted || stopped.exchange(true)) return;
  const std::string line = "LONGHAUL_TEST_STOP_AT: stopped at " + std::string(phase) + "\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  ::raise(SIGSTOP);
}

std::unique_ptr<Communicator> rendezvous(const RendezvousOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    throw InvalidArgument("rendezvous: rank " + std::to_string(o.rank) + " is outside world size " +
                          std::to_string(o.world_size));
  }
  if (o.world_size == 1) return std::make_unique<SoloCommunicator>();
  // A write to a peer that died must fail with EPIPE (-> Aborted, exit 138), not kill this
  // process with SIGPIPE: the Gloo transport does not suppress it on every send.
  ::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = o.rendezvous_root.empty() ? rendezvous_dir(o.logdir, o.attempt)
                                                 : o.rendezvous_root / o.attempt;
  const auto start = Clock::now();

  // The transport first: a bad bind address is a config error, reported before any waiting.
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    if (!o.bind_iface.empty()) {
      if (::if_nametoindex(o.bind_iface.c_str()) == 0) {
        throw InvalidArgument("LONGHAUL_GLOO_IFACE '" + o.bind_iface +
                              "' is not a network interface of this machine (rank " +
                              std::to_string(o.rank) + ")");
      }
      attr.iface = o.bind_iface;
    } else {
      // A pod's own DNS name may appear a little after the pod starts: resolution is retried
      // (base/poll.h) until max_wait_secs.
      const auto give_up = start + to_ms(o.max_wait_secs);
      while (true) {
        try {
          attr.hostname = own_address(o.bind_host, o.rank);
          break;
        } catch (const Unavailable& e) {
          if (Clock::now() >= give_up) throw InvalidArgument(e.what());
          LH_LOG(WARNING) << "cannot resolve this replica's address yet; retrying"
                          << kv("host", o.bind_host);
          sleep_checking(std::min(give_up, Clock::now() + poll_interval(Clock::now() - start)),
                         o.cancelled, "rendezvous abandoned while resolving " + o.bind_host);
        }
      }
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const InvalidArgument&) {
    throw;
  } catch (const std::exception& e) {
    throw InvalidArgument(
        "cannot bind the Gloo TCP transport of rank " + std::to_string(o.rank) + " to " +
        (o.bind_iface.empty() ? "host '" + o.bind_host + "'" : "interface '" + o.bind_iface + "'") +
        ": " + e.what() +
        ". When the TF_CONFIG host names do not resolve here, set "
        "LONGHAUL_HOST_OVERRIDE (e.g. 127.0.0.1) or LONGHAUL_GLOO_IFACE");
  }

  // Arrive, then connect with a short timeout; a connect that fails (a member died or froze
  // since it arrived) is retried in a new generation until max_wait_secs (communicator.h).
  ArrivalBoard board(o, dir, start);
  std::string generation;
  std::shared_ptr<gloo::rendezvous::Context> context;
  while (true) {
    generation = board.wait_for_all();
    stop_here_for_test("connect");
    context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    // Gloo waits five times its timeout for a pair's pending connection, and nothing ends that
    // wait early: a fifth of connect_timeout_secs bounds it, and with it how long a stop
    // request or a peer that froze since it arrived can keep this attempt, by connect_timeout_secs
    // (the pairs are non-blocking, so nothing after the connect uses this timeout).
    context->setTimeout(to_ms(o.connect_timeout_secs / kGlooConnectWaitFactor));
    std::string error;
    try {
      ConnectStore store(dir, to_ms(o.connect_timeout_secs), o.cancelled);
      gloo::rendezvous::PrefixStore prefixed(generation, store);
      context->connectFullMesh(prefixed, device);
      break;
    } catch (const std::exception& e) {
      error = e.what();
    }
    context.reset();
    if (o.cancelled && o.cancelled()) {
      throw Cancelled("rendezvous at " + dir.string() + " abandoned: a stop was requested");
    }
    if (Clock::now() >= board.deadline()) {
      throw DeadlineExceeded(
          "rank " + std::to_string(o.rank) + " could not connect to its peers at " + dir.string() +
          " within max_wait_secs (" + std::to_string(o.max_wait_secs) +
          " s); the last attempt (generation " + generation + ") failed: " + error +
          ". A peer kept dying or freezing during the rendezvous");
    }
    LH_LOG(WARNING) << "could not connect the group (a peer died or froze since it arrived); "
                       "meeting again in a new generation"
                    << kv("rank", o.rank) << kv("generation", generation) << kv("error", error);
    board.retry_after_failed_connect();
  }
  // Connected: from here the context's timeout bounds each collective.
  context->setTimeout(to_ms(o.collective_timeout_secs));
  auto comm = std::make_unique<GlooCommunicator>(context, o, dir, generation, board.identity());
  LH_LOG(INFO) << "joined the data-parallel group" << kv("rank", o.rank)
               << kv("world_size", o.world_size) << kv("dir", dir.string())
               << kv("seconds", std::chrono::duration<double>(Clock::now() - start).count());
  return comm;
}

}  // namespace longhaul::dist
