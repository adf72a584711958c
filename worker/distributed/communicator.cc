// Rendezvous through the shared logdir and the Gloo communicator. See communicator.h.
#include "longhaul/distributed/communicator.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
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
#include <gloo/transport/tcp/device.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "longhaul/base/error.h"
#include "longhaul/base/file.h"
#include "longhaul/base/log.h"

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

// bindable_address(host) when `host` resolves. Otherwise, when `host` is this pod's own DNS
// name (its first label is this machine's hostname, as Kubernetes sets hostname + subdomain),
// bindable_address(hostname): the pod's /etc/hosts maps its hostname to its IP, so replicas on a
// cluster without DNS for pods (or before the name is published) still bind their pod IP. Peers
// learn that address through the rendezvous store, never by name. Throws what
// bindable_address(host) threw when neither works.
std::string own_address(const std::string& host, int rank) {
  try {
    return bindable_address(host, rank);
  } catch (const Unavailable&) {
    const std::string me = host_name();
    const auto dot = host.find('.');
    if (dot == std::string::npos || host.compare(0, dot, me) != 0) throw;
    std::optional<std::string> fallback;
    try {
      fallback = bindable_address(me, rank);
    } catch (const Error&) {
    }
    if (!fallback) throw;  // the original error, naming `host`
    LH_LOG(INFO) << "this replica's DNS name does not resolve; binding its hostname's address"
                 << kv("host", host) << kv("hostname", me) << kv("address", *fallback);
    return *fallback;
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

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, AllreduceAlgorithm algorithm,
                   std::string where)
      : context_(std::move(context)), algorithm_(algorithm), where_(std::move(where)) {}

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
  uint32_t next_tag() { return tag_++ & 0xffffff; }

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
      broken_reason_ = e.what();
      throw Aborted(what + " failed on rank " + std::to_string(rank()) + " of " +
                    std::to_string(world_size()) + " (" + where_ + "): " + e.what() +
                    ". A peer died, hung longer than the collective timeout (" +
                    std::to_string(context_->getTimeout().count()) +
                    " ms) or the network was cut; exit with code 138 so the whole group "
                    "restarts from the latest checkpoint");
    }
  }

  std::shared_ptr<gloo::Context> context_;
  AllreduceAlgorithm algorithm_;
  std::string where_;
  uint32_t tag_ = 1;
  bool broken_ = false;
  std::string broken_reason_;
  std::map<std::pair<float*, size_t>, std::unique_ptr<gloo::AllreduceHalvingDoubling<float>>>
      halving_doubling_;
};

// Waits (polling) until every rank has arrived in one generation of `dir`. Returns it.
class ArrivalBoard {
 public:
  ArrivalBoard(const RendezvousOptions& o, fs::path dir)
      : o_(o),
        dir_(std::move(dir)),
        me_(host_name() + ":" + std::to_string(::getpid()) + ":" + random_id()) {}

  std::string wait_for_all() {
    const auto start = Clock::now();
    const auto deadline = start + to_ms(o_.max_wait_secs);
    if (o_.rank == 0) open_as_chief();
    auto last_log = start;
    while (true) {
      check_cancelled();
      if (o_.rank != 0) follow_generation();
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
      if (now >= deadline) {
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
      sleep_until(std::min(deadline, now + to_ms(o_.recovery_wait_secs)));
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

  void open_as_chief() {
    if (o_.regroup) {  // a surviving chief: a new generation in the folder as it is
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
  std::vector<int> missing_ranks() const {
    std::vector<int> missing;
    for (int r = 0; r < o_.world_size; ++r) {
      std::error_code ec;
      const bool there = generation_.empty()
                             ? r == o_.rank || (r != 0 && fs::exists(present_path(r), ec))
                             : fs::exists(arrival_path(r), ec);
      if (!there) missing.push_back(r);
    }
    return missing;
  }

  fs::path present_path(int rank) const { return dir_ / ("present." + std::to_string(rank)); }

  const RendezvousOptions& o_;
  fs::path dir_;
  std::string me_;
  std::string generation_;
  std::string stale_;
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
  if (ec) {
    LH_LOG(WARNING) << "could not remove the rendezvous folder"
                    << kv("dir", rendezvous_dir(logdir, attempt).string())
                    << kv("error", ec.message());
  }
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
      // every recovery_wait_secs until max_wait_secs.
      const auto give_up = start + to_ms(o.max_wait_secs);
      while (true) {
        try {
          attr.hostname = own_address(o.bind_host, o.rank);
          break;
        } catch (const Unavailable& e) {
          if (Clock::now() >= give_up) throw InvalidArgument(e.what());
          LH_LOG(WARNING) << "cannot resolve this replica's address yet; retrying"
                          << kv("host", o.bind_host);
          const auto until = std::min(give_up, Clock::now() + to_ms(o.recovery_wait_secs));
          while (Clock::now() < until) {
            if (o.cancelled && o.cancelled()) {
              throw Cancelled("rendezvous abandoned while resolving " + o.bind_host);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
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

  ArrivalBoard board(o, dir);
  const std::string generation = board.wait_for_all();

  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
  context->setTimeout(to_ms(o.collective_timeout_secs));
  try {
    gloo::rendezvous::FileStore store(dir.string());
    gloo::rendezvous::PrefixStore prefixed(generation, store);
    context->connectFullMesh(prefixed, device);
  } catch (const std::exception& e) {
    throw Aborted("rank " + std::to_string(o.rank) + " could not connect to its peers at " +
                  dir.string() + " (generation " + generation + "): " + e.what() +
                  ". A peer died during the rendezvous; exit with code 138 so the group retries");
  }
  const std::string where = "rendezvous " + dir.string();
  auto comm = std::make_unique<GlooCommunicator>(context, o.algorithm, where);
  LH_LOG(INFO) << "joined the data-parallel group" << kv("rank", o.rank)
               << kv("world_size", o.world_size) << kv("dir", dir.string())
               << kv("seconds", std::chrono::duration<double>(Clock::now() - start).count());
  return comm;
}

}  // namespace longhaul::dist
